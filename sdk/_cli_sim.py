"""``ketten sim``: the seeded fault simulation of :mod:`ketten.testing.jepsen`."""

from __future__ import annotations

import click

from ._cli_output import progress_bar

__all__ = ["sim"]


@click.command("sim", add_help_option=False,
               context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
               short_help="Run the seeded fault simulation, or `sim gosskip` (see --help).")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def sim(args: tuple[str, ...]) -> int:
    """Run the seeded fault simulation with the Jepsen-style checker
    (``ketten sim gosskip ...``: the GosSkip pub/sub fairness simulation)."""
    if args[:1] == ("gosskip",):
        from ._cli_gosskip import gosskip

        result = gosskip.main(list(args[1:]), prog_name="ketten sim gosskip",
                              standalone_mode=False)
        return result if isinstance(result, int) else 0
    from .testing.jepsen import main as simulate
    from .testing.jepsen import tune_collector

    tune_collector()
    with progress_bar("simulating") as bar:
        return simulate(list(args), prog="ketten sim", on_run=bar.update)

"""The ``ketten`` command line: the command group, and errors turned into exit codes.

Exit codes: 0 success; 1 a check found a problem (``verify``, ``chains``, or
failed simulation runs in ``sim``); 2 bad usage or an error, printed as one
line ``ketten: error: ...`` on stderr (no traceback); 130 interrupted
(``tail`` and ``serve`` stop on Ctrl-C or SIGTERM with 0).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import click

from . import __version__
from ._cli_car import export_car, import_car
from ._cli_local import keygen, plugins
from ._cli_network import publish, read, tail
from ._cli_sim import sim
from ._cli_store import chains, verify
from ._serve import serve
from .errors import KettenError

__all__ = ["cli", "main"]

OK, ERROR, INTERRUPTED = 0, 2, 130
# A bare ``ketten``: click 8.2 and later raise this; 8.1 prints the help and exits.
_NO_ARGS_IS_HELP: tuple[type[click.UsageError], ...] = (
    (click.exceptions.NoArgsIsHelpError,) if hasattr(click.exceptions, "NoArgsIsHelpError")
    else ())


class _Commands(click.Group):
    """Lists its commands in the order they were added, not alphabetically."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"],
                                               "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="ketten",
                      message="%(prog)s %(version)s")
def cli() -> None:
    """ketten: signed, replicated hash chains per criterion on a peer-to-peer overlay.

    publish, read and tail join a network through --bootstrap with a node of
    their own; chains and verify read store directories offline, export and
    import move a chain into and out of a CAR file.

    \b
    Exit codes:
      0    success
      1    a check found a problem (verify, chains, sim)
      2    bad usage or an error (one line on stderr)
      130  interrupted (tail and serve exit 0 on Ctrl-C or SIGTERM)
    """


for _command in (serve, publish, read, tail, chains, verify, export_car, import_car, keygen,
                 plugins, sim):
    cli.add_command(_command)


def _error(message: str) -> int:
    click.echo(f"ketten: error: {message}", err=True)
    return ERROR


def _os_error(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"


def _leaf(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The first exception in ``group`` that has an exit code of its own."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found = _leaf(exc)
            if found is not None:
                return found
        elif isinstance(exc, KettenError | OSError | KeyboardInterrupt | click.ClickException):
            return exc
    return None


def _code(exc: BaseException) -> int | None:
    """The exit code for ``exc`` (its message printed), or ``None`` if it is a bug."""
    if isinstance(exc, click.UsageError) and isinstance(exc, _NO_ARGS_IS_HELP):
        click.echo(exc.ctx.get_help() if exc.ctx is not None else exc.format_message(),
                   err=True)
        return ERROR
    if isinstance(exc, click.UsageError):
        message = exc.format_message()
        if exc.ctx is not None:
            message += f" (see {exc.ctx.command_path} --help)"
        return _error(message)
    if isinstance(exc, click.ClickException):
        return _error(exc.format_message())
    if isinstance(exc, click.exceptions.Abort | KeyboardInterrupt):
        return INTERRUPTED
    if isinstance(exc, BrokenPipeError):
        # The reader of our output went away (``ketten read X | head``): not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return OK
    if isinstance(exc, KettenError):
        return _error(str(exc))
    if isinstance(exc, OSError):
        return _error(_os_error(exc))
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = cli.main(args, prog_name="ketten", standalone_mode=False)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (OK if exc.code is None else ERROR)
    except BaseExceptionGroup as group:
        leaf = _leaf(group)
        code = None if leaf is None else _code(leaf)
        if code is None:
            raise
        return code
    except BaseException as exc:
        code = _code(exc)
        if code is None:
            raise
        return code
    return result if isinstance(result, int) else OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""``ketten sim gosskip``: the GosSkip pub/sub simulation (fairness under churn)."""

from __future__ import annotations

from pathlib import Path

import click

from ._cli_output import progress_bar

__all__ = ["gosskip"]


@click.command("gosskip")
@click.option("--nodes", type=click.IntRange(1), default=128, show_default=True,
              help="Workingnodes at the start, spread evenly over the topics.")
@click.option("--topics", type=click.IntRange(1), default=8, show_default=True,
              help="Number of topics.")
@click.option("--churn", "churn", type=click.Choice(["none", "subscribe",
                                                     "subscribe-unsubscribe"]),
              default="subscribe", show_default=True,
              help="Churn pattern applied to the churn topic.")
@click.option("--churn-topic", type=click.IntRange(0), default=3, show_default=True,
              help="Index of the topic with churn (t0, t1, ...).")
@click.option("--churn-rate", type=click.FloatRange(0), default=4.0, show_default=True,
              help="Extra subscriptions per round in the churn topic.")
@click.option("--lookups", type=click.FloatRange(0), default=2.0, show_default=True,
              help="Lookup load: subscriptions per round to uniformly chosen topics.")
@click.option("--adaptation", type=click.Choice(["off", "1", "2", "2s", "all"]),
              default="all", show_default=True,
              help="Adaptation: off, procedure 1 (first come, first serve), procedure 2 "
                   "(sampling, Algorithm 1 as written), 2s (procedure 2 mapping each "
                   "topic's share of the total churn), or all of them one after the other.")
@click.option("--rounds", type=click.IntRange(1), default=120, show_default=True,
              help="Rounds (virtual seconds) measured after the warm-up.")
@click.option("--warmup", type=click.IntRange(0), default=12, show_default=True,
              help="Rounds of gossip before measuring.")
@click.option("--interval", type=click.IntRange(1), default=30, show_default=True,
              help="Rounds per churn-measuring interval (and Algorithm 1's timer).")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path),
              default=Path("ketten-sim-out"), show_default=True,
              help="Directory for topics.csv, topics.md and work_vs_churn.png.")
def gosskip(nodes: int, topics: int, churn: str, churn_topic: int, churn_rate: float,
            lookups: float, adaptation: str, rounds: int, warmup: int, interval: int,
            seed: int, out: Path) -> int:
    """Simulate the GosSkip pub/sub layer (pubnodes, workingnodes, churnnodes) in
    virtual time and measure its fairness under churn.

    Per topic it counts the churn (subscriptions and unsubscriptions) and the
    lookup and join messages the topic's nodes forwarded; the fairness
    quotient is (churn + 1) / (lookup forwards + join forwards + 1). The
    smaller the largest difference of the quotients, the fairer the work.
    """
    from ketten.plugins.gosskip._pubsub_sim import PubSubSimulation, SimConfig
    from ketten.plugins.gosskip._report import markdown, table_csv, write_chart

    modes = ["off", "1", "2", "2s"] if adaptation == "all" else [adaptation]
    try:
        configs = [SimConfig(nodes=nodes, topics=topics, churn=churn, churn_topic=churn_topic,
                             churn_rate=churn_rate, lookups=lookups, adaptation=mode,
                             rounds=rounds, warmup=warmup, interval=interval, seed=seed)
                   for mode in modes]
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    results = []
    with progress_bar("simulating") as bar:
        total = len(configs) * (rounds + warmup)
        for index, config in enumerate(configs):
            offset = index * (rounds + warmup)

            def advance(done: int, _: int, offset: int = offset) -> None:
                bar.update(offset + done, total)

            results.append(PubSubSimulation(config).run(on_round=advance))
    out.mkdir(parents=True, exist_ok=True)
    (out / "topics.csv").write_text(table_csv(results))
    text = markdown(results)
    (out / "topics.md").write_text(text)
    click.echo(text, nl=False)
    if write_chart(results, out / "work_vs_churn.png"):
        click.echo(f"wrote {out / 'topics.csv'}, {out / 'topics.md'}, "
                   f"{out / 'work_vs_churn.png'}")
    else:
        click.echo(f"wrote {out / 'topics.csv'} and {out / 'topics.md'}; the chart needs "
                   "matplotlib: pip install 'ketten[sim]'")
    return 0

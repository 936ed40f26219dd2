"""The pub/sub simulation's files: a per-topic table as CSV and Markdown, and a
chart of each topic's share of the work against its share of the churn."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

from ._fairness import shares
from ._pubsub_sim import SimResult

__all__ = ["CSV_COLUMNS", "markdown", "table_csv", "write_chart"]

CSV_COLUMNS = ("adaptation", "topic", "pubnodes", "nodes", "churn", "lookup_forwards",
               "join_forwards", "fairness_quotient", "churn_share", "work_share",
               "max_difference")

_LABELS = {"off": "adaptation off", "1": "procedure 1 (first come, first serve)",
           "2": "procedure 2 (sampling, Algorithm 1)",
           "2s": "procedure 2s (sampling, topic shares of the churn)"}


def table_csv(results: Sequence[SimResult]) -> str:
    """Every run's rows, one per topic in ring order."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for result in results:
        for load, (churn_share, work_share) in zip(result.loads, shares(result.loads),
                                                   strict=True):
            writer.writerow([result.config.adaptation, load.topic, load.pubnodes, load.nodes,
                             load.churn, load.lookups, load.joins, f"{load.quotient:.4f}",
                             f"{churn_share:.4f}", f"{work_share:.4f}",
                             f"{result.max_difference:.4f}"])
    return out.getvalue()


def markdown(results: Sequence[SimResult]) -> str:
    """A summary of the runs, then each run's per-topic table."""
    first = results[0].config
    churn = "none" if first.churn == "none" else (
        f"{first.churn} in t{first.churn_topic}, {first.churn_rate:g} per round")
    lines = [
        "# GosSkip pub/sub simulation",
        "",
        f"{first.nodes} workingnodes at the start, {first.topics} topics, "
        f"{first.rounds} rounds (after {first.warmup} of warm-up), seed {first.seed}; "
        f"lookup load {first.lookups:g} subscriptions per round over all topics; "
        f"churn: {churn}; churn measured over intervals of {first.interval} rounds.",
        "",
        "| adaptation | max difference of fairness quotients | workingnodes | churnnodes "
        "| resubscriptions | inserted by procedure 2 | removed by procedure 2 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        lines.append(f"| {result.config.adaptation} | {result.max_difference:.4f} "
                     f"| {result.workingnodes} | {result.churnnodes} "
                     f"| {result.resubscriptions} | {result.inserted} | {result.removed} |")
    for result in results:
        lines += ["", f"## {_LABELS[result.config.adaptation]}", "",
                  "| topic | pubnodes | nodes | churn | lookup forwards | join forwards "
                  "| fairness quotient |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for load in result.loads:
            lines.append(f"| {load.topic} | {load.pubnodes} | {load.nodes} | {load.churn} "
                         f"| {load.lookups} | {load.joins} | {load.quotient:.4f} |")
        lines += ["", f"Max difference of the fairness quotients: "
                      f"{result.max_difference:.4f}"]
    return "\n".join(lines) + "\n"


def write_chart(results: Sequence[SimResult], path: Path) -> bool:
    """Work share against churn share per topic, one series per run, as a PNG.
    False (nothing written) when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(6.4, 5.2))
    top = 0.0
    for result, marker in zip(results, "osD^v", strict=False):
        points = shares(result.loads)
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        top = max(top, *xs, *ys)
        axes.scatter(xs, ys, marker=marker, label=f"{_LABELS[result.config.adaptation]} "
                     f"(max diff {result.max_difference:.3f})")
        for load, x, y in zip(result.loads, xs, ys, strict=True):
            axes.annotate(load.topic, (x, y), fontsize=7, xytext=(3, 3),
                          textcoords="offset points")
    top = min(1.0, top * 1.1 + 0.02)
    axes.plot([0, top], [0, top], color="grey", linestyle="--", linewidth=1,
              label="work in proportion to churn")
    axes.set_xlim(0, top)
    axes.set_ylim(0, top)
    axes.set_xlabel("share of the churn (subscriptions + unsubscriptions)")
    axes.set_ylabel("share of the work (lookup + join forwards)")
    axes.set_title("GosSkip pub/sub: work against churn per topic")
    axes.legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=110)
    pyplot.close(figure)
    return True

"""The report's figure of a sweep under load (`sweep --arrival-rate R`, sections/under_load.py,
whose table the report places): throughput and time per output token against the rate for plain
decoding and the policies that were best anywhere. Everything here is replayed (replay/under_load.py);
benchmarks/checks/load.py holds it against real runs under load."""

from __future__ import annotations

import pandas as pd
from matplotlib.ticker import NullFormatter

from dspark_bench.reporting.plots.base import figure
from dspark_bench.reporting.report_inputs import Inputs, Skip
from dspark_bench.results import read_parquet
from dspark_bench.sections.served import ServedRun
from dspark_bench.sections.under_load import UnderLoad

PLAIN_STYLE = ("grey", "x")
STYLES = [("#e6a100", "o"), ("#3a63c4", "s"), ("#2e9e4f", "D"), ("#b5651d", "^"), ("#8a4fbf", "v"), ("#d6423b", "P")]


def load_of(inputs: Inputs) -> tuple[UnderLoad, pd.DataFrame] | None:
    """The first run folder's load section and its table (load.parquet), if any has them."""
    for run_id, summary in inputs.summaries.items():
        load = UnderLoad.from_json(summary)
        if load is not None:
            return load, read_parquet(inputs.folder_of[run_id] / load.table)
    return None


def served_figure(inputs: Inputs):
    """A run under load (`run --arrival-rate`): each server's throughput, TPOT p50 and p99 against
    the rate, measured (solid) and replay's prediction (dashed)."""
    found = [(run_id, ServedRun.from_json(summary)) for run_id, summary in inputs.summaries.items()]
    run_id, served = next(((r, s) for r, s in found if s is not None), (None, None))
    if served is None:
        raise Skip("no sweep under load (sweep --arrival-rate R ...) and no run under load (run --arrival-rate R)")
    table = read_parquet(inputs.folder_of[run_id] / "load.parquet").dropna(subset=["arrival_rate"])
    fig, axes = figure(13, 4.0, 1, 3)
    labels = list(dict.fromkeys(table["config_label"]))
    for ax, (column, name, scale) in zip(axes[0], PANELS):
        for i, label in enumerate(labels):
            color, marker = PLAIN_STYLE if i == 0 else STYLES[(i - 1) % len(STYLES)]
            rows = table[table["config_label"] == label].sort_values("arrival_rate")
            ax.plot(rows["arrival_rate"], rows[column] * scale, "-", color=color, marker=marker, label=label)
            ax.plot(rows["arrival_rate"], rows[f"{column}_replay"] * scale, "--", color=color, alpha=0.7)
        rate_axis(ax, sorted(table["arrival_rate"].unique()), name)
    axes[0][0].plot([], [], "--", color="black", alpha=0.7, label="replay's prediction")
    axes[0][0].legend(fontsize=7, loc="upper left")
    caption = (f"Served for real ({served.requests}, up to {served.max_batch} at once): each server measured "
               "(solid) and as replay predicted it (dashed), priced on "
               + ("passes timed inside running decodes." if served.prices.get("passes") == "in decode"
                  else "passes timed alone (--isolated-prices)."))
    return fig, caption


def rate_axis(ax, rates: list[float], name: str) -> None:
    ax.set_xscale("log")
    ax.set_xticks(rates, [f"{r:g}" for r in rates])  # the rates themselves, not a log axis's decades
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("arrival rate (requests/s)")
    ax.set_ylabel(name)
    ax.grid(alpha=0.3)


PANELS = [("throughput", "output tokens/s", 1.0), ("tpot_p50_s", "TPOT p50 (ms)", 1e3),
          ("tpot_p99_s", "TPOT p99 (ms)", 1e3)]


def load_figure(inputs: Inputs):
    """Throughput, TPOT p50 and p99 against the arrival rate: plain decoding and every policy that
    was best, or the best fixed γ, at some load (a run under load: served_figure)."""
    found = load_of(inputs)
    if found is None:
        return served_figure(inputs)
    load, table = found
    shown = list(dict.fromkeys(row[key]["config_label"] for row in load.by_rate for key in ("best", "best_fixed")
                               if row[key] is not None))
    fig, axes = figure(13, 4.0, 1, 3)
    series = [("plain decoding", table[table["config_id"] < 0], PLAIN_STYLE)]
    series += [(label, table[table["config_label"] == label], STYLES[i % len(STYLES)]) for i, label in enumerate(shown)]
    rates = sorted(table["arrival_rate"].unique())
    for ax, (column, name, scale) in zip(axes[0], PANELS):
        for label, rows, (color, marker) in series:
            rows = rows.sort_values("arrival_rate")
            ax.plot(rows["arrival_rate"], rows[column] * scale, "-", color=color, marker=marker, label=label)
        rate_axis(ax, rates, name)
    axes[0][0].legend(fontsize=7, loc="upper left")
    caption = (f"Replayed under load ({load.requests}, up to {load.max_batch} at once): plain decoding and "
               "each policy that was the best, or the best fixed γ, at some rate. Throughput follows the offered "
               "load until the server saturates; past it requests queue, which raises their time to the first "
               "token, while TPOT levels off at what a step of the full batch takes. "
               f"{load.verdict[0].upper()}{load.verdict[1:]}.")
    return fig, caption

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


def load_figure(inputs: Inputs):
    """Throughput, TPOT p50 and p99 against the arrival rate: plain decoding and every policy that
    was best, or the best fixed γ, at some load."""
    found = load_of(inputs)
    if found is None:
        raise Skip("no sweep under load (sweep --arrival-rate R ...)")
    load, table = found
    shown = list(dict.fromkeys(row[key]["config_label"] for row in load.by_rate for key in ("best", "best_fixed")
                               if row[key] is not None))
    fig, axes = figure(13, 4.0, 1, 3)
    panels = [("throughput", "output tokens/s", 1.0), ("tpot_p50_s", "TPOT p50 (ms)", 1e3),
              ("tpot_p99_s", "TPOT p99 (ms)", 1e3)]
    series = [("plain decoding", table[table["config_id"] < 0], PLAIN_STYLE)]
    series += [(label, table[table["config_label"] == label], STYLES[i % len(STYLES)]) for i, label in enumerate(shown)]
    rates = sorted(table["arrival_rate"].unique())
    for ax, (column, name, scale) in zip(axes[0], panels):
        for label, rows, (color, marker) in series:
            rows = rows.sort_values("arrival_rate")
            ax.plot(rows["arrival_rate"], rows[column] * scale, "-", color=color, marker=marker, label=label)
        ax.set_xscale("log")
        ax.set_xticks(rates, [f"{r:g}" for r in rates])  # the rates themselves, not a log axis's decades
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("arrival rate (requests/s)")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="upper left")
    caption = (f"Replayed under load ({load.requests}, up to {load.max_batch} at once): plain decoding and "
               "each policy that was the best, or the best fixed γ, at some rate. Throughput follows the offered "
               "load until the server saturates; past it requests queue, which raises their time to the first "
               "token, while TPOT levels off at what a step of the full batch takes. "
               f"{load.verdict[0].upper()}{load.verdict[1:]}.")
    return fig, caption

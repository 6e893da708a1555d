"""The report's view of a sweep under load (`sweep --arrival-rate R`, tuning/under_load.py): per
arrival rate, the best policy beside the best fixed γ and plain decoding (a table), and
throughput and time per output token against the rate for the policies that were best anywhere
(a figure). Everything here is replayed (replay/load.py); benchmarks/checks/load.py holds it against
real load runs."""

from __future__ import annotations

import pandas as pd
from matplotlib.ticker import NullFormatter

from dspark_bench.reporting.plots.base import _figure
from dspark_bench.reporting.report_inputs import Inputs, Skip
from dspark_bench.results import read_parquet

PLAIN_STYLE = ("grey", "x")
STYLES = [("#e6a100", "o"), ("#3a63c4", "s"), ("#2e9e4f", "D"), ("#b5651d", "^"), ("#8a4fbf", "v"), ("#d6423b", "P")]


def load_of(inputs: Inputs) -> tuple[dict, pd.DataFrame] | None:
    """The first run folder's load summary and its table (load.parquet), if any has them."""
    for run_id, summary in inputs.summaries.items():
        if summary.get("load"):
            return summary["load"], read_parquet(inputs.folder_of[run_id] / summary["load"]["table"])
    return None


def _served(entry: dict | None) -> list[str]:
    if entry is None:
        return ["none within the limit", "—", "—", "—"]
    return [str(entry["config_label"]), f"{entry['throughput']:.1f}", f"{entry['tpot_p50_s'] * 1e3:.1f} / "
            f"{entry['tpot_p99_s'] * 1e3:.1f}", f"{entry['ttft_p50_s'] * 1e3:.0f} / {entry['ttft_p99_s'] * 1e3:.0f}"]


def load_blocks(inputs: Inputs) -> list[tuple]:
    """The best policy per arrival rate, with the best fixed γ and plain decoding beside it."""
    found = load_of(inputs)
    if found is None:
        return []
    load, _ = found
    header = ["load", "", "policy", "tokens/s", "TPOT p50 / p99 (ms)", "TTFT p50 / p99 (ms)"]
    lines = []
    for row in load["by_rate"]:
        for role, key in (("best", "best"), ("best fixed γ", "best_fixed"), ("plain decoding", "plain")):
            lines.append([row["arrival"] if role == "best" else "", role, *_served(row[key])])
    limit = (f" with p99 TPOT within {load['tpot_limit_s'] * 1e3:g} ms" if load.get("tpot_limit_s")
             and load["objective"] == "throughput" else "")
    text = (f"Replayed under load: {load['requests']} (the prompts in turn), arriving as a Poisson process at "
            f"each rate (or by the trace), joining a continuous batch of up to {load['max_batch']} rows at "
            f"a step boundary and leaving when done; every step priced on the cost surface at its live rows, each "
            f"request's prefill its own (padded layout, the batched decoder's). The best of {load['policies']:,} "
            f"policies by {load['objective']}{limit}. TPOT: a request's time per output token after its first; "
            f"TTFT: arrival to its first tokens. {load['verdict'][0].upper()}{load['verdict'][1:]}. "
            "benchmarks/checks/load.py holds these against real load runs (docs/batch-sizes.md#under-load).")
    return [("h2", "Under load"), ("table", header, lines), ("p", text)]


def load_figure(inputs: Inputs):
    """Throughput, TPOT p50 and p99 against the arrival rate: plain decoding and every policy that
    was best, or the best fixed γ, at some load."""
    found = load_of(inputs)
    if found is None:
        raise Skip("no sweep under load (sweep --arrival-rate R ...)")
    load, table = found
    shown = list(dict.fromkeys(row[key]["config_label"] for row in load["by_rate"] for key in ("best", "best_fixed")
                               if row[key] is not None))
    fig, axes = _figure(13, 4.0, 1, 3)
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
    caption = (f"Replayed under load ({load['requests']}, up to {load['max_batch']} at once): plain decoding and "
               "each policy that was the best, or the best fixed γ, at some rate. Throughput follows the offered "
               "load until the server saturates; past it requests queue, which raises their time to the first "
               "token, while TPOT levels off at what a step of the full batch takes. "
               f"{load['verdict'][0].upper()}{load['verdict'][1:]}.")
    return fig, caption

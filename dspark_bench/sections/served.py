"""A run under load (`run --arrival-rate R`; summary.json's `load_run`): our batched decoder serving
the arrivals for real, plain decoding and every policy taking turns a step each
(harness/under_load.py), each percentile measured beside what replay predicts on the run's own
record and prices (harness/served_run.py); its console rows and its table in the report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dspark_bench.sections.base import END, UNDER_HEADLINE, Line, OneKey, ReportView, Rows

# What a row sets side by side: the metric, its label, and the scale it is shown at (ms for times).
METRICS = (("throughput", "tok/s", 1.0), ("tpot_p50_s", "TPOT p50 ms", 1e3), ("tpot_p99_s", "TPOT p99 ms", 1e3),
           ("ttft_p50_s", "TTFT p50 ms", 1e3))


def pair_cell(row: dict, metric: str, scale: float) -> str:
    """measured · predicted (predicted / measured − 1)."""
    real, replayed = row[metric], row[f"{metric}_replay"]
    if real is None or replayed is None or real != real or replayed != replayed:
        return "—"
    error = replayed / real - 1 if real else float("nan")
    return f"{real * scale:.1f} · {replayed * scale:.1f} ({error:+.1%})"


@dataclass(frozen=True)
class ServedRun(OneKey):
    """The load, how replay priced it, and per (load, policy) each metric measured and predicted."""

    KEYS: ClassVar[tuple[str, ...]] = ("load_run",)
    ABSENT: ClassVar[dict] = {}  # a sweep writes nothing under the key
    CONSOLE_AT: ClassVar[int] = UNDER_HEADLINE
    REPORT_AT: ClassVar[str] = END

    max_batch: int
    requests: str  # how many requests, said: per rate and in the trace
    prices: dict  # where replay's prices were timed (harness/in_decode.InDecode.described, or isolated)
    seconds: float  # the real runs' wall time
    rows: list  # per (load, policy): serving_metrics measured, the same `_replay`, `identical`

    def table(self) -> tuple[tuple[str, ...], list[list[str]]]:
        columns = ("load", "policy", *(f"{label}: measured · replay" for _, label, _ in METRICS), "= plain")
        rows = [[row["arrival"], row["config_label"], *(pair_cell(row, m, scale) for m, _, scale in METRICS),
                 {True: "yes", False: "NO", None: "—"}[row.get("identical")]] for row in self.rows]
        return columns, rows

    def said(self) -> str:
        where = ("passes timed inside running decodes of the prompts" if self.prices.get("passes") == "in decode"
                 else "passes timed alone (--isolated-prices)")
        return (f"Served for real: {self.requests}, up to {self.max_batch} at once, our batched decoder (continuous "
                f"batching), plain decoding and each policy a server of its own taking turns a step each "
                f"({self.seconds:.0f} s). Replay predicted each on the run's own record, priced on {where}. "
                "Throughput in output tokens/s; TPOT a request's time per output token after its first; TTFT "
                "arrival to its first tokens.")

    def console(self) -> list:
        columns, rows = self.table()
        return [Rows("under load: measured · replay's prediction (replay / measured − 1)", columns, rows,
                     left=columns[:2]), Line(self.said())]

    @classmethod
    def report_blocks(cls, found: dict[str, ServedRun], view: ReportView) -> list[tuple]:
        blocks = []
        for run_id, served in found.items():
            columns, rows = served.table()
            title = "Under load, measured" + (f" ({view.short(run_id)})" if view.several else "")
            blocks += [("h2", title), ("table", list(columns), rows), ("p", served.said())]
        return blocks

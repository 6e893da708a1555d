"""A sweep under load (`sweep --arrival-rate R`; summary.json's `load`): every policy of the sweep,
at the server's max batch, serving requests that arrive at each rate (replay/under_load.py), and the best
policy per rate by the spec's load objective beside the best fixed γ and plain decoding
(docs/batch-sizes.md#under-load); its table in load.parquet, its rows on the console and its table
in the report (the figure: reporting/under_load.py). Everything here is replayed;
benchmarks/checks/load.py holds it against real runs under load."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.replay import sampled
from dspark_bench.replay.under_load import replay_load, verdicts
from dspark_bench.results import write_parquet
from dspark_bench.sections.base import END, UNDER_HEADLINE, Line, OneKey, ReportView, Rows, SweepFacts

FILE = "load.parquet"


def load_policies(configs: list[DecodeConfig], max_batch: int) -> list[int]:
    """The sweep's policies a server under load runs: the draft model's (the batched decoder's
    drafter) at the smallest batch size of the sweep at or above the max batch (one copy of each
    policy; it runs at the max batch), but a depth policy with entries of their own family (batch 1
    only). Their indices into `configs`."""
    sizes = sorted({c.batching.batch_size for c in configs if c.batching.batch_size >= max_batch})
    return [i for i, c in enumerate(configs) if c.batching.batch_size == sizes[0] and c.drafting.drafter == "model"
            and not schedules.any_family(c)]


def load_stage(folder: Path, spec, max_batch: int, configs: list[DecodeConfig], rec, surface,
               say=None) -> UnderLoad:
    """Replay every policy under each load `spec` (the sweep's spec: its arrival rates or trace,
    requests, seed, load objective and TPOT limit) names, at most `max_batch` requests at once."""
    started = time.perf_counter()
    chosen = load_policies(configs, max_batch)
    loads = spec.loads()
    table = replay_load(sampled.as_one(rec), [configs[i] for i in chosen], surface, loads, max_batch,
                        spec.tpot_limit)
    table["config_id"] = [chosen[c] if c >= 0 else -1 for c in table["config_id"]]  # the sweep's own ids
    write_parquet(folder / FILE, table)
    seconds = time.perf_counter() - started
    by_rate = verdicts(table, spec.load_objective, spec.tpot_limit)
    counts = [f"{spec.requests} requests per rate"] if spec.arrival_rates else []
    counts += [f"{load.requests} requests in the trace" for load in loads[len(spec.arrival_rates):]]
    load = UnderLoad(max_batch, "; ".join(counts), spec.load_objective, spec.tpot_limit, len(chosen), len(table),
                     seconds, FILE, by_rate, verdict(by_rate))
    if say:
        say(f"replayed under load: {len(table):,} (policy, load) points in {seconds:.1f} s; {load.verdict}")
    return load


def verdict(by_rate: list[dict]) -> str:
    """Whether the best policy changes with the arrival rate, in one sentence."""
    named = [(row["arrival"], row["best"]["config_label"] if row["best"] else None) for row in by_rate]
    if all(label is None for _, label in named):
        return "no policy meets the latency limit at any load"
    labels = {label for _, label in named}
    if len(labels) == 1:
        return f"the same policy is best at every load: {named[0][1]}"
    return "the best policy changes with the load: " + "; ".join(
        f"{load}: {label or 'none within the limit'}" for load, label in named)


def _served(entry: dict | None) -> list[str]:
    if entry is None:
        return ["none within the limit", "—", "—", "—"]
    return [str(entry["config_label"]), f"{entry['throughput']:.1f}", f"{entry['tpot_p50_s'] * 1e3:.1f} / "
            f"{entry['tpot_p99_s'] * 1e3:.1f}", f"{entry['ttft_p50_s'] * 1e3:.0f} / {entry['ttft_p99_s'] * 1e3:.0f}"]


def _served_line(entry: dict | None) -> str:
    if entry is None:
        return "none within the limit"
    return (f"{entry['config_label']}: {entry['throughput']:.0f} tok/s, TPOT {entry['tpot_p50_s'] * 1e3:.0f} / "
            f"{entry['tpot_p99_s'] * 1e3:.0f} ms")


@dataclass(frozen=True)
class UnderLoad(OneKey):
    """The section: how the load was replayed, and per arrival rate the best policy beside the
    best fixed γ and plain decoding (replay/under_load.verdicts' rows), with the verdict in a sentence."""

    KEYS: ClassVar[tuple[str, ...]] = ("load",)
    ABSENT: ClassVar[dict] = {"load": None}
    CONSOLE_AT: ClassVar[int] = UNDER_HEADLINE
    REPORT_AT: ClassVar[str] = END

    max_batch: int
    requests: str  # how many requests, said: per rate and in the trace
    objective: str
    tpot_limit_s: float | None
    policies: int
    points: int
    seconds: float
    table: str  # the file of every (policy, load) point, beside summary.json
    by_rate: list
    verdict: str

    @classmethod
    def of_sweep(cls, facts: SweepFacts) -> UnderLoad | None:
        """The load stage where the sweep serves a load, at the max batch it says (SweepFacts.max_batch)."""
        if facts.max_batch is None:
            return None
        return load_stage(facts.folder, facts.spec, facts.max_batch, facts.configs, facts.model_record, facts.surface,
                          facts.say)

    def limit(self, said: str) -> str:
        """The TPOT limit in words, where it bounds the throughput objective."""
        return f"{said} {self.tpot_limit_s * 1e3:g} ms" if self.tpot_limit_s and self.objective == "throughput" else ""

    def console(self) -> list:
        """Per arrival rate, the best policy beside the best fixed γ and plain decoding, each as
        throughput and p50 / p99 time per output token (replayed)."""
        rows = [[row["arrival"], _served_line(row["best"]), _served_line(row["best_fixed"]), _served_line(row["plain"])]
                for row in self.by_rate]
        columns = ("load", "best", "best fixed γ", "plain decoding")
        return [Rows(f"under load (replayed, {self.requests}, up to {self.max_batch} at once; best by "
                     f"{self.objective}{self.limit(', p99 TPOT within')}): throughput, TPOT p50 / p99",
                     columns, rows, left=columns), Line(self.verdict, "bold")]

    @classmethod
    def report_blocks(cls, found: dict[str, UnderLoad], view: ReportView) -> list[tuple]:
        """The first run's: the best policy per arrival rate, with the best fixed γ and plain decoding beside it."""
        if not found:
            return []
        load = next(iter(found.values()))
        header = ["load", "", "policy", "tokens/s", "TPOT p50 / p99 (ms)", "TTFT p50 / p99 (ms)"]
        lines = []
        for row in load.by_rate:
            for role, key in (("best", "best"), ("best fixed γ", "best_fixed"), ("plain decoding", "plain")):
                lines.append([row["arrival"] if role == "best" else "", role, *_served(row[key])])
        text = (f"Replayed under load: {load.requests} (the prompts in turn), arriving as a Poisson process at "
                f"each rate (or by the trace), joining a continuous batch of up to {load.max_batch} rows at "
                f"a step boundary and leaving when done; every step priced on the cost surface at its live rows, each "
                f"request's prefill its own (padded layout, the batched decoder's). The best of {load.policies:,} "
                f"policies by {load.objective}{load.limit(' with p99 TPOT within')}. TPOT: a request's time per "
                f"output token after its first; TTFT: arrival to its first tokens. "
                f"{load.verdict[0].upper()}{load.verdict[1:]}. "
                "benchmarks/checks/load.py holds these against real runs under load (docs/batch-sizes.md#under-load).")
        return [("h2", "Under load"), ("table", header, lines), ("p", text)]

"""A replay sweep's load stage (`sweep --arrival-rate R`): every policy of the sweep, at the
server's max batch, serving requests that arrive at each rate (replay/load.py), and the best
policy per rate by the spec's load objective beside the best fixed γ and plain decoding
(docs/batch-sizes.md#under-load). Written to load.parquet and summary.json's `load`."""

from __future__ import annotations

import time
from pathlib import Path

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.replay import sampled
from dspark_bench.replay.load import poisson, read_trace, replay_load, verdicts
from dspark_bench.results import write_parquet
from dspark_bench.tuning.spec import SweepSpec, max_batch_of, under_load

FILE = "load.parquet"


def load_policies(configs: list[DecodeConfig], max_batch: int) -> list[int]:
    """The sweep's policies a server under load runs: the draft model's (the batched decoder's
    drafter) at the smallest batch size of the sweep at or above the max batch (one copy of each
    policy; it runs at the max batch), depth policies left out (replay under load prices every
    step at one depth). Their indices into `configs`."""
    sizes = sorted({c.batching.batch_size for c in configs if c.batching.batch_size >= max_batch})
    return [i for i, c in enumerate(configs) if c.batching.batch_size == sizes[0] and c.drafting.drafter == "model"
            and not schedules.of(c).by_depth]


def load_stage(folder: Path, spec: SweepSpec, configs: list[DecodeConfig], rec, surface, say=None) -> dict | None:
    """Replay every policy under each load the spec names; None where it names none."""
    if not under_load(spec):
        return None
    started = time.perf_counter()
    max_batch = max_batch_of(spec)
    chosen = load_policies(configs, max_batch)
    loads = [poisson(rate, spec.requests, spec.seed) for rate in spec.arrival_rates]
    if spec.arrival_trace is not None:
        loads.append(read_trace(spec.arrival_trace))
    table = replay_load(sampled.as_one(rec), [configs[i] for i in chosen], surface, loads, max_batch,
                        spec.tpot_limit)
    table["config_id"] = [chosen[c] if c >= 0 else -1 for c in table["config_id"]]  # the sweep's own ids
    write_parquet(folder / FILE, table)
    seconds = time.perf_counter() - started
    by_rate = verdicts(table, spec.load_objective, spec.tpot_limit)
    counts = [f"{spec.requests} requests per rate"] if spec.arrival_rates else []
    counts += [f"{load.requests} requests in the trace" for load in loads[len(spec.arrival_rates):]]
    summary = {"max_batch": max_batch, "requests": "; ".join(counts), "objective": spec.load_objective,
               "tpot_limit_s": spec.tpot_limit, "policies": len(chosen), "points": len(table), "seconds": seconds,
               "table": FILE, "by_rate": by_rate, "verdict": verdict(by_rate)}
    if say:
        say(f"replayed under load: {len(table):,} (policy, load) points in {seconds:.1f} s; {summary['verdict']}")
    return summary


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

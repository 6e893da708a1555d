"""How many policies per second `simulate_grid` evaluates (a benchmark, not a test).

A synthetic record of 100 prompts × 128 tokens × 8 rollout steps, in which the draft agrees
with the target with probability 0.6 per step, and a dense grid of 4 metrics × 20 thresholds
× 8 gamma_max × 4 min_draft_len (2,320 policies once min_draft_len ≤ gamma_max). Prints the
median of 3 timed passes, after a first call that compiles the simulator.

    python -m benchmarks.measurements.simulate_speed
"""

from __future__ import annotations

import itertools
import statistics
import time

import numpy as np
import pandas as pd

from benchmarks import common
from dspark_bench.config import METRICS, DecodeConfig
from dspark_bench.replay.simulate import Record, simulate_grid

P, N, G = 100, 128, 8


def synthetic_record(seed: int = 0) -> Record:
    rng = np.random.default_rng(seed)
    continuation = rng.integers(2, 8000, size=(P, N))
    rollout = np.empty((P, N, G), dtype=np.int64)
    for k in range(G):
        ahead = np.full((P, N), -2)
        ahead[:, : N - k] = continuation[:, k:]
        rollout[:, :, k] = np.where(rng.random((P, N)) < 0.6, ahead, 1)
    confidences = {m: rng.random((P, N, G), dtype=np.float32) for m in METRICS}
    return Record(continuation, np.full(P, N), rollout, confidences, (), {"max_new_tokens": N, "topk": 5})


def grid(tokens: int = N) -> list[DecodeConfig]:
    """The dense grid of issue 5, its valid points (min_draft_len <= gamma_max)."""
    thresholds = np.round(np.linspace(0.05, 0.95, 20), 3)
    return [DecodeConfig.of(metric=m, threshold=float(t), gamma_max=g, min_draft_len=n, max_new_tokens=tokens)
            for m, t, g, n in itertools.product(METRICS, thresholds, range(1, G + 1), range(0, 4)) if n <= g]


def time_grid(rec: Record, configs: list[DecodeConfig]) -> tuple[float, float, pd.DataFrame]:
    """Seconds of the first call (compiling the walk, or loading it from numba's cache), the
    median seconds of 3 timed calls after it, and the table."""
    start = time.perf_counter()
    simulate_grid(rec, configs[:1])
    first = time.perf_counter() - start
    times = []
    for _ in range(3):
        start = time.perf_counter()
        table = simulate_grid(rec, configs)
        times.append(time.perf_counter() - start)
    return first, statistics.median(times), table


if __name__ == "__main__":
    common.parser(__doc__).parse_args()
    rec, configs = synthetic_record(), grid()
    first, median, table = time_grid(rec, configs)
    print(f"first call (compile or cache load): {first:.2f} s")
    print(f"{len(configs)} policies over {P} prompts × {N} tokens: {median:.3f} s (median of 3) "
          f"= {len(configs) / median:,.0f} policies/s; best tokens_per_round {table['tokens_per_round'].max():.3f}")

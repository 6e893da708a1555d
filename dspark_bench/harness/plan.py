"""How long a job will take, said before it starts: a quick estimate from one short timed decode.

A long command prints its plan first ("10 prompts × 3 configurations × 3 timed pairs ≈ 6 min"),
so a user knows whether to wait, shrink the job, or come back later. The estimate times the
target's own decoding on this machine (a 16-token greedy decode of the first prompt) and scales
it by what each stage decodes; it is a guide, not a promise.
"""

from __future__ import annotations

import statistics
import time

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.host import synchronize

# A speculative decode is assumed this much faster than the baseline for the estimate (the
# shipped pair's measured range is 1.4-1.8x). A record costs about 1.1 plain decoding passes
# (1.11x on 40 code prompts: benchmarks/measurements/replay_reference.py); from an engine's continuations
# file, the target's pass is not ours to pay: 0.08 (6.4 s against 81.6 s for those prompts,
# benchmarks/measurements/record_from_continuations.py).
ASSUMED_SPEEDUP = 1.5
RECORD_COST = 1.1
RECORD_FROM_FILE_COST = 0.08
PROBE_TOKENS = 16


def seconds_per_token(pair, prompt_ids: list[int]) -> float:
    """The target's plain decoding time per token here: median of three short decodes."""

    config = DecodeConfig.of(max_new_tokens=PROBE_TOKENS)
    times = []
    for _ in range(3):
        synchronize(pair.device)
        start = time.perf_counter()
        tokens = autoregressive_decode(pair.target, prompt_ids, config).tokens
        synchronize(pair.device)
        times.append((time.perf_counter() - start) / max(len(tokens), 1))
    return statistics.median(times)


def timed_pairs_seconds(per_token: float, samples: int, tokens: int, repeats: int) -> float:
    """`samples` (prompt, configuration) measurements, each `repeats` baseline + speculative decodes."""
    return samples * repeats * tokens * per_token * (1 + 1 / ASSUMED_SPEEDUP)


def record_seconds(per_token: float, prompts: int, tokens: int, from_file: bool = False) -> float:
    return prompts * tokens * per_token * (RECORD_FROM_FILE_COST if from_file else RECORD_COST)


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def run_plan(per_token: float, prompts: int, samples: int, configs: int, tokens: int,
             repeats: int) -> tuple[str, float]:
    """The line `run` prints before it decodes, and its estimate in seconds."""
    seconds = timed_pairs_seconds(per_token, samples, tokens, repeats)
    return (f"plan: {prompts} prompts × {configs} configuration{'s' * (configs != 1)} × {repeats} timed "
            f"pair{'s' * (repeats != 1)} × {tokens} tokens ≈ {duration(seconds)} "
            f"(target {per_token * 1e3:.1f} ms/token here)"), seconds


def replay_plan(per_token: float, prompts: int, tokens: int, policies: int, confirm: int, repeats: int,
                recorded: bool, from_file: bool = False, paths: int = 0, space: int | None = None) -> tuple[str, float]:
    """The line a replay sweep prints before it records, and its estimate in seconds (`from_file`:
    the target's continuations come from an engine's file, only the draft's rollouts are made;
    `paths`: a sampled record's paths per prompt, each recorded as a greedy record is; `space`: how
    many of the `policies` are the search space's points, the rest being those replay adds)."""
    record = 0.0 if recorded else record_seconds(per_token, prompts * max(paths, 1), tokens, from_file)
    confirm_s = timed_pairs_seconds(per_token, prompts * confirm, tokens, repeats)
    sampled = f" × {paths} sampled paths" if paths else ""
    first = "record cached" if recorded else (f"record {prompts} prompts{sampled} × {tokens} tokens"
                                              f"{' from the continuations file' if from_file else ''} ≈ "
                                              f"{duration(record)}")
    confirming = (f"confirm {confirm} × {prompts} prompts × {repeats} timed pair{'s' * (repeats != 1)} ≈ "
                  f"{duration(confirm_s)}" if confirm else "nothing timed (--confirm-top 0)")
    added = policies - space if space is not None else 0
    simulated = (f"{policies:,} policies ({space:,} points + {added:,} replay adds: fixed γ, goodput, budget, "
                 f"learned)" if added > 0 else f"{policies:,} policies")
    return (f"plan: {first}; simulate {simulated} (seconds); {confirming}; "
            f"total ≈ {duration(record + confirm_s)} (target {per_token * 1e3:.1f} ms/token here)"), record + confirm_s


def precision_plan(target: float, budget_s: float) -> str:
    """The plan's line for a precision target (harness/verdicts.py sharpens the headline pair)."""
    return (f"then: the best scheduled policy and the best fixed γ again, pass after pass, until their paired "
            f"interval is within ±{target:.1%} — at most {duration(budget_s)} more (--precision-budget); the "
            f"estimate of how many passes follows the second")


def real_sweep_plan(per_token: float, prompts: int, tokens: int, trials: int, repeats: int) -> str:
    seconds = timed_pairs_seconds(per_token, prompts * trials, tokens, repeats)
    return (f"plan: {trials} trials × {prompts} prompts × {repeats} timed pair{'s' * (repeats != 1)} × {tokens} "
            f"tokens ≈ {duration(seconds)} (target {per_token * 1e3:.1f} ms/token here)")

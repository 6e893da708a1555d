"""How long a job will take, said before it starts: a quick estimate from one short timed decode.

A long command prints its plan first ("10 prompts × 3 configurations × 3 timed pairs ≈ 6 min"),
so a user knows whether to wait, shrink the job, or come back later. The estimate times the
target's own decoding on this machine (a 16-token greedy decode of the first prompt) and scales
it by what each stage decodes; it is a guide, not a promise.

A replay sweep's estimate (`replay_plan`) splits that pace in two (`Pace`): a generated token,
and a prompt token of the prefill before it, so that each decode it counts pays its own prompt's
prefill (a 3,000-token prompt costs about as much as 64 generated tokens on the long pair); and
it counts the timing of our prices (`prices_seconds`): the passes measure/cost_model.py times at
batch 1, at each batch size and at each depth, with their prefills.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.host import synchronize
from dspark_bench.measure.cost_model import COST_REPEATS, DEPTH_REPEATS, PREFILL_REPEATS, SURFACE_REPEATS

# A speculative decode is assumed this much faster than the baseline for the estimate (the
# shipped pair's measured range is 1.4-1.8x). A record costs about 1.1 plain decoding passes
# (1.11x on 40 code prompts: benchmarks/measurements/replay_reference.py); from an engine's continuations
# file, the target's pass is not ours to pay: 0.08 (6.4 s against 81.6 s for those prompts,
# benchmarks/measurements/record_from_continuations.py).
ASSUMED_SPEEDUP = 1.5
RECORD_COST = 1.1
RECORD_FROM_FILE_COST = 0.08
PROBE_TOKENS = 16
# A draft pass, and a draft prefill, against the target's (the long pair: a draft step 1.4 ms against
# a verify 10.9 ms at 256 tokens, docs/depth.md): what the price timing's draft passes add.
DRAFT_SHARE = 0.15


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


@dataclass(frozen=True)
class Pace:
    """The target's plain decoding here, split: seconds a generated token, and seconds a prompt
    token of the prefill before the first (measured_pace)."""

    per_token: float
    per_prompt_token: float = 0.0

    def decodes(self, prompt_tokens: float, tokens: float) -> float:
        """Seconds of plain decodes of `tokens` generated tokens in all after `prompt_tokens` prompt tokens in all."""
        return self.per_token * tokens + self.per_prompt_token * prompt_tokens


def measured_pace(pair, prompt_ids: list[int]) -> Pace:
    """Three decodes each of 1 and PROBE_TOKENS tokens of `prompt_ids` (medians): the one-token decode
    is the prefill (its pass makes the first token); a generated token, the difference over the tokens
    made after the first."""
    times = {n: [] for n in (1, PROBE_TOKENS)}
    for _ in range(3):
        for n, taken in times.items():
            synchronize(pair.device)
            start = time.perf_counter()
            made = len(autoregressive_decode(pair.target, prompt_ids, DecodeConfig.of(max_new_tokens=n)).tokens)
            synchronize(pair.device)
            taken.append((time.perf_counter() - start, made))
    prefill = statistics.median(seconds for seconds, _ in times[1])
    many, made = sorted(times[PROBE_TOKENS])[1]
    per_token = max((many - prefill) / max(made - 1, 1), many / max(made, 1) / 2)  # noise: never below half the mean
    return Pace(per_token, prefill / max(len(prompt_ids), 1))


def prices_seconds(pace: Pace, context: int, gamma: int, batch_sizes, depths) -> float:
    """About how long timing our passes takes (measure/cost_model.py): a draft step and verify(0 ..
    gamma), repeated, at batch 1 on `context` tokens with the two prefills, at each larger batch
    size (a step of B rows costing about √B single ones: harness/in_decode.plan_seconds), and at
    each depth with its prefills, and each larger batch size again at each depth (its B rows'
    caches filled first); every pass at the probe's pace (deeper ones cost more, timed fewer times)."""
    passes = pace.per_token * (gamma + 1 + DRAFT_SHARE)
    prefills = (PREFILL_REPEATS + 1) * (1 + DRAFT_SHARE) * pace.per_prompt_token
    seconds = (COST_REPEATS + 2) * passes + prefills * context
    batched = set(batch_sizes) - {1}
    seconds += sum((SURFACE_REPEATS + 1) * passes * math.sqrt(b) for b in batched)
    setup = (1 + DRAFT_SHARE) * pace.per_prompt_token  # each depth's caches filled once before its passes
    seconds += sum((SURFACE_REPEATS + 1) * passes * math.sqrt(b) + b * setup * d for b in batched for d in depths)
    return seconds + sum((DEPTH_REPEATS + 2) * passes + (prefills + setup) * d for d in depths)


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


def run_plan(pace: Pace, prompts: int, samples: int, configs: int, tokens: int, repeats: int,
             prompt_tokens: float = 0.0) -> tuple[str, float]:
    """The line `run` prints before it decodes, and its estimate in seconds: `samples` (prompt,
    configuration) measurements, each `repeats` timed pairs whose two decodes each pay their prompt's
    prefill (`prompt_tokens`: a prompt's mean). Without the prefill, 12 long-code prompts at B = 8
    were planned at 70 s and took 118 s."""
    seconds = samples * repeats * (2 * pace.decodes(prompt_tokens, 0)
                                   + pace.decodes(0, tokens) * (1 + 1 / ASSUMED_SPEEDUP))
    prefill = f", {pace.per_prompt_token * prompt_tokens:.2f} s a prompt's prefill" if prompt_tokens else ""
    return (f"plan: {prompts} prompts × {configs} configuration{'s' * (configs != 1)} × {repeats} timed "
            f"pair{'s' * (repeats != 1)} × {tokens} tokens ≈ {duration(seconds)} "
            f"(target {pace.per_token * 1e3:.1f} ms/token here{prefill})"), seconds


def replay_plan(pace: Pace, prompt_tokens: int, prompts: int, tokens: int, policies: int, confirm: int, repeats: int,
                recorded: bool, from_file: bool = False, paths: int = 0, space: int | None = None,
                prices_s: float = 0.0) -> tuple[str, float]:
    """The line a replay sweep prints before it records, and its estimate in seconds: every decode
    it counts pays its prompt's prefill (`prompt_tokens`, the prompts' in all); `from_file`: the
    target's continuations come from an engine's file, only the draft's rollouts are made; `paths`:
    a sampled record's paths per prompt, each recorded as a greedy record is; `space`: how many of
    the `policies` are the search space's points, the rest being those replay adds; `prices_s`:
    the timing of our prices (prices_seconds, and the in-decode run's)."""
    copies = max(paths, 1)
    record = 0.0 if recorded else ((RECORD_FROM_FILE_COST if from_file else RECORD_COST)
                                   * pace.decodes(prompt_tokens * copies, prompts * copies * tokens))
    # A timed pair: plain decoding and the policy, each paying the prompt's prefill.
    confirm_s = confirm * repeats * (2 * pace.decodes(prompt_tokens, 0)
                                     + pace.decodes(0, prompts * tokens) * (1 + 1 / ASSUMED_SPEEDUP))
    sampled = f" × {paths} sampled paths" if paths else ""
    first = "record cached" if recorded else (f"record {prompts} prompts{sampled} × {tokens} tokens"
                                              f"{' from the continuations file' if from_file else ''} ≈ "
                                              f"{duration(record)}")
    confirming = (f"confirm {confirm} × {prompts} prompts × {repeats} timed pair{'s' * (repeats != 1)} ≈ "
                  f"{duration(confirm_s)}" if confirm else "nothing timed (--confirm-top 0)")
    added = policies - space if space is not None else 0
    simulated = (f"{policies:,} policies ({space:,} points + {added:,} replay adds: fixed γ, goodput, budget, "
                 f"learned)" if added > 0 else f"{policies:,} policies")
    total = record + prices_s + confirm_s
    prefill = (f", {pace.per_prompt_token * prompt_tokens / prompts:.2f} s a prompt's prefill" if prompt_tokens
               else "")
    return (f"plan: {first}; time our prices ≈ {duration(prices_s)}; simulate {simulated} (seconds); {confirming}; "
            f"total ≈ {duration(total)} (target {pace.per_token * 1e3:.1f} ms/token here{prefill})"), total


def precision_plan(target: float, budget_s: float) -> str:
    """The plan's line for a precision target (harness/verdicts.py sharpens the headline pair)."""
    return (f"then: the best scheduled policy and the best fixed γ again, pass after pass, until their paired "
            f"interval is within ±{target:.1%} — at most {duration(budget_s)} more (--precision-budget); the "
            f"estimate of how many passes follows the second")


def real_sweep_plan(per_token: float, prompts: int, tokens: int, trials: int, repeats: int) -> str:
    seconds = timed_pairs_seconds(per_token, prompts * trials, tokens, repeats)
    return (f"plan: {trials} trials × {prompts} prompts × {repeats} timed pair{'s' * (repeats != 1)} × {tokens} "
            f"tokens ≈ {duration(seconds)} (target {per_token * 1e3:.1f} ms/token here)")

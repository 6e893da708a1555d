"""What a replay sweep will do and about how long it takes, said before it records
(harness/plan.py's estimate, with the sweep's own counts): the policies it replays, those it times,
the prompts' prefills, and the timing of our prices at each batch size and depth."""

from __future__ import annotations

from typing import Callable

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.depth import spans_depth
from dspark_bench.harness.in_decode import plan_seconds
from dspark_bench.harness.plan import duration, measured_pace, precision_plan, prices_seconds, replay_plan
from dspark_bench.measure.cost_model import depths_to_price
from dspark_bench.tuning.added_policies import added_count
from dspark_bench.tuning.preparation import LoadedSweep
from dspark_bench.tuning.spec import SweepSpec


def replayed_count(configs: list[DecodeConfig]) -> int:
    """How many policies a replay sweep of `configs` (replay_space's) simulates: those, and the
    goodput, budget and learned policies that join once the record is made."""
    return len(configs) + added_count(configs)


def confirmed_count(spec: SweepSpec, prepared: LoadedSweep, ids: list[list[int]], configs: list[DecodeConfig]) -> int:
    """The policies the sweep times: the best `confirm_top` and the best fixed γ beside them, at each
    batch size and drafter (confirm.chosen_kinds), and the depth policy it composes where the rounds
    span depth buckets (sections/depth.py); none at 0."""
    groups = len({(c.batching.batch_size, c.drafting.drafter) for c in configs})
    scheduled = (replayed_count(configs) - sum(schedules.of(c).baseline for c in configs)) // groups
    confirmed = (min(spec.confirm_top, scheduled) + 1) * groups if spec.confirm_top else 0
    tokens = prepared.base.verification.max_new_tokens
    deep = prepared.base.greedy and spans_depth([len(i) + j for i in ids for j in range(tokens)])
    return confirmed + int(bool(confirmed) and deep)


def say_replay_plan(spec: SweepSpec, prepared: LoadedSweep, ids: list[list[int]], configs: list[DecodeConfig],
                    recorded: bool, say: Callable[[str], None]) -> float:
    """Say the plan; returns its estimate in seconds of the whole sweep: recording, timing our
    prices, confirming. The pace is the target's on the median-length prompt, its prefill apart."""
    sizes = sorted({c.batching.batch_size for c in configs})
    tokens, gamma = prepared.base.verification.max_new_tokens, max(c.stopping.gamma_max for c in configs)
    confirmed = confirmed_count(spec, prepared, ids, configs)
    pace = measured_pace(prepared.pair, sorted(ids, key=len)[len(ids) // 2])
    depths = depths_to_price(prepared.pair, ids, tokens)
    prices_s = prices_seconds(pace, len(ids[0]) + tokens // 2, gamma, sizes, depths)  # time_prices' context
    in_decode = 0.0 if spec.isolated_prices else plan_seconds(pace.per_token, tokens, max(sizes))
    line, seconds = replay_plan(pace, sum(map(len, ids)), len(prepared.prompts), tokens, replayed_count(configs),
                                confirmed, spec.repeats, recorded=recorded,
                                from_file=prepared.continuations is not None,
                                paths=0 if prepared.base.greedy else spec.paths, space=len(prepared.points),
                                prices_s=prices_s + in_decode)
    say(line + (" — an upper bound: a batched run takes less than a batch-1 one" if max(sizes) > 1 else ""))
    say("prices: our passes timed alone (--isolated-prices: optimistic in a live batch)" if spec.isolated_prices else
        f"prices: our passes timed alone and inside running decodes of the prompts (the latter about "
        f"{duration(in_decode)}; --isolated-prices: timed alone)")
    if depths:  # time_prices times our passes at these depths too
        say(f"prompts of up to {max(map(len, ids)):,} tokens: our passes are timed at depths "
            f"{', '.join(f'{d:,}' for d in depths)} and each round is priced at its own depth")
    if spec.precision > 0 and confirmed:
        say(precision_plan(spec.precision, spec.precision_budget_s))
    return seconds

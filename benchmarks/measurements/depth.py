"""The context axis on the long-context pair: every number docs/depth.md's tables hold.

A benchmark, not a test. On the long pair (weights/long/, `dspark-bench models build --long`) and
a long-prompt task:

1. Held-out loss and draft/target top-1 agreement per depth bucket, the long pair beside the
   256-token pair on the same held-out windows (measured at export: weights/long/reference.json).
2. Our passes by depth: one draft step and verify(k) at 256, 1,024, 2,048 and 4,096 tokens of the
   task's prompts and their continuations, longest first (replay_sweep.timing_sequence, as a sweep
   times them; measure/cost_model.py measure_depths: interleaved over k, medians), and the target's
   one-token pass over the draft step: the cost ratio by depth.
3. Replay at depth equals the real decoder: every round of `simulate` against `speculative_decode`
   (drafted, accepted, emitted, stop reason, draft tokens, target token, draft forwards) for the
   policies below on every prompt; and each prompt's greedy output against the target's own.
4. Predicted against measured speedup per prompt-length bucket: each policy timed against plain
   decoding on every prompt (harness.runner: interleaved pairs), replay's prediction for the same
   prompts priced at each round's depth; the median |error| over (policy, bucket).

    python -m benchmarks.measurements.depth [--task long-code] [--limit 12] [--max-new-tokens 64] [--steps 1234]
    python -m benchmarks.measurements.depth --limit 24 --longest 4 --steps 3
"""

from __future__ import annotations

import json

import numpy as np

from benchmarks import common
from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.depth import DEPTH_LABELS, PRICED_DEPTHS, depth_bucket
from dspark_bench.harness.models import load_pair
from dspark_bench.harness.runner import RunnerSettings, run
from dspark_bench.measure.cost_model import measure_cost, measure_depths
from dspark_bench.measure.recording import record
from dspark_bench.metrics import sample_speedup
from dspark_bench.reference.long import long_pair_paths
from dspark_bench.replay.sampled import rows_of
from dspark_bench.replay.simulate import simulate, simulate_grid
from dspark_bench.tasks import load_task
from dspark_bench.tasks.prompts import encode
from dspark_bench.tuning.replay_sweep import timing_sequence

GAMMA = 8


def policies(tokens: int) -> list[DecodeConfig]:
    """Ten policies: fixed γ 2/4/6, threshold rules on three metrics, a cumulative one, a depth policy."""
    fixed = [DecodeConfig.of(schedule=schedules.BASELINE, gamma_max=g, min_draft_len=0, max_new_tokens=tokens)
             for g in (2, 4, 6)]
    scheduled = [DecodeConfig.of(metric=m, threshold=t, gamma_max=g, min_draft_len=k, max_new_tokens=tokens)
                 for m, t, g, k in (("top1", 0.3, 6, 1), ("top1", 0.6, 8, 0), ("margin", 0.1, 6, 1),
                                    ("entropy", 0.5, 4, 1), ("topk_mass", 0.7, 8, 2))]
    cumulative = DecodeConfig.of(schedule=schedules.CUMULATIVE, threshold=0.2, gamma_max=8, max_new_tokens=tokens)
    depth = DecodeConfig.of(schedule=schedules.DEPTH, depth_policy="0.2/8,0.3/6,0.4/6,0.5/4", gamma_max=8,
                            max_new_tokens=tokens)
    return fixed + scheduled + [cumulative, depth]


def losses() -> None:
    report = json.loads((long_pair_paths()[0].parent / "reference.json").read_text())
    buckets = report["depth_buckets"]
    print(f"1. held-out loss by depth ({report['models']['target']['train_minutes']:.0f} + "
          f"{report['models']['draft']['train_minutes']:.0f} min of training at {report['context']:,} tokens)")
    print(f"   {'domain':6} {'model':22} " + " ".join(f"{b:>8}" for b in buckets))
    for domain, models in report["heldout_by_depth"].items():
        for name, numbers in models.items():
            print(f"   {domain:6} {name:22} " + " ".join(f"{numbers['loss'][b]:8.3f}" for b in buckets))
            if "agreement_top1" in numbers:
                print(f"   {domain:6} {name + ' agree':22} "
                      + " ".join(f"{numbers['agreement_top1'][b]:8.3f}" for b in buckets))


def costs(pair, sequence: list[int]):
    """The cost model at the task's own depth, with its depth axis."""
    model = measure_cost(pair, sequence[: len(sequence) // 2], GAMMA)
    model.by_depth = measure_depths(pair, sequence, GAMMA, PRICED_DEPTHS)
    print("2. our passes by depth (ms; medians of interleaved repeats)")
    print(f"   {'depth':>6} {'t_draft':>8} {'verify(0)':>10} {'verify(4)':>10} {'verify(8)':>10} {'verify/draft':>13}")
    for depth, entry in sorted(model.by_depth.items()):
        verify = entry["t_verify"]
        print(f"   {depth:6,} {entry['t_draft'] * 1e3:8.2f} {verify[0] * 1e3:10.2f} {verify[4] * 1e3:10.2f} "
              f"{verify[8] * 1e3:10.2f} {verify[0] / entry['t_draft']:13.2f}")
    return model


def equality(pair, prompts: list[list[int]], rec, configs: list[DecodeConfig], tokens: int) -> None:
    compared = differing = identical = 0
    for ids, row in zip(prompts, range(len(prompts))):
        plain = autoregressive_decode(pair.target, ids, DecodeConfig.of(max_new_tokens=tokens), pair.eos_ids).tokens
        for config in configs:
            real = speculative_decode(pair.target, pair.draft, ids, config, pair.eos_ids)
            identical += real.tokens == plain
            mine = simulate(rows_of(rec, np.array([row])), config)[0]
            differing += abs(len(mine) - len(real.rounds))
            for a, b in zip(mine, real.rounds):
                differing += (a.drafted, a.accepted, a.emitted, a.stop_reason, a.draft_tokens, a.target_token,
                              a.draft_forwards) != (b.drafted, b.accepted, b.emitted, b.stop_reason, b.draft_tokens,
                                                    b.target_token, b.draft_forwards)
                compared += 1
    longest = max(len(p) for p in prompts)
    print(f"3. replay vs our decoder at depth: {len(configs)} policies × {len(prompts)} prompts (up to {longest:,} "
          f"tokens), {compared:,} rounds compared, {differing} differ; greedy output identical to the target's own "
          f"in {identical} of {len(configs) * len(prompts)} decodes")


def speedups(pair, task_prompts, prompts, rec, cost, configs: list[DecodeConfig]) -> None:
    output = run(pair, task_prompts, configs, RunnerSettings(repeats=1, warmup=1))
    print("4. predicted vs measured speedup per prompt-length bucket (measured: 95 % bootstrap interval)")
    errors = []
    buckets = depth_bucket([len(p) for p in prompts])
    for c, config in enumerate(configs):
        for b in sorted(set(buckets)):
            rows = np.flatnonzero(buckets == b)
            predicted = float(simulate_grid(rows_of(rec, rows), [config], cost)["predicted_speedup"].iloc[0])
            ids = {task_prompts[i].id for i in rows}
            mine = output.samples[(output.samples["config_id"] == c) & output.samples["prompt_id"].isin(ids)]
            measured, low, high = sample_speedup(mine)
            errors.append(abs(measured / predicted - 1))
            print(f"   {config.label():38} {DEPTH_LABELS[b]:>7} ({len(rows)} prompts): predicted {predicted:.3f}, "
                  f"measured {measured:.3f} [{low:.2f}, {high:.2f}]")
    print(f"   median |measured / predicted - 1| over {len(errors)} (policy, bucket): {np.median(errors):.1%}; "
          f"largest {max(errors):.1%}")


def main() -> None:
    parser = common.parser(__doc__, task="long-code", limit=12, max_new_tokens=64)
    parser.add_argument("--steps", default="1234", help="which of the numbered measurements to take (default all)")
    parser.add_argument("--longest", type=int, default=None, help="only the task's K longest prompts (of --limit)")
    args = parser.parse_args()
    tokens = args.max_new_tokens
    pair = load_pair(None, None, pair="long")
    task_prompts = load_task(args.task, args.limit)
    prompts = [encode(pair.tokenizer, p.text) for p in task_prompts]
    if args.longest:  # e.g. the prompts past 3,500 tokens, for step 3
        keep = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))[: args.longest]
        task_prompts, prompts = [task_prompts[i] for i in keep], [prompts[i] for i in keep]
    print(f"{pair.target_name} / {pair.draft_name} on {pair.device}; {len(prompts)} {args.task} prompts of "
          f"{min(map(len, prompts)):,}-{max(map(len, prompts)):,} tokens × {tokens} new tokens")
    if "1" in args.steps:
        losses()
    rec = record(pair, prompts, tokens, GAMMA, topk=5, eos_ids=pair.eos_ids)
    cost = costs(pair, timing_sequence(rec, prompts, PRICED_DEPTHS[-1]))  # step 4 prices with it
    configs = policies(tokens)
    if "3" in args.steps:
        equality(pair, prompts, rec, configs, tokens)
    if "4" in args.steps:
        speedups(pair, task_prompts, prompts, rec, cost, configs)


if __name__ == "__main__":
    main()

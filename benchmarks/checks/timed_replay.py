"""Timed replay against replay's prediction (issue 53's check of the prices, here on the CPU).

Records the shipped pair on held-out prompts, times its cost model, then runs the rounds replay
says five policies make (fixed γ 2, 4, 6 and two threshold policies) on real passes
(measure/timed.py), interleaved with plain decoding of the same tokens, and sets each measured
speedup beside the ones replay predicts on the default path's batch-1 prices (timed inside decodes of
the first two prompts: harness/in_decode.py) and on the passes timed alone (--isolated-prices). Every
round's acceptance as the passes compute it is checked against the forced one. Writes timed_replay.md
and .json into --out.

    python -m benchmarks.checks.timed_replay --out results/timed [--limit 8] [--max-new-tokens 64] [--repeats 3]
"""

from __future__ import annotations

import json
import statistics
import time

from benchmarks import common
from dspark_bench.config import DecodeConfig
from dspark_bench.harness.in_decode import batch_one, calibration_policies
from dspark_bench.measure.cost_model import measure_cost
from dspark_bench.measure.recording import record
from dspark_bench.measure.timed import timed_plain, timed_replay
from dspark_bench.replay.simulate import simulate_grid
from dspark_bench.results import describe_machine, environment
from dspark_bench.tasks.prompts import encode
from dspark_bench.tuning.preparation import prepare
from dspark_bench.tuning.spec_files import resolve_spec, task_spec

GAMMA = 8


def policies(max_new_tokens: int) -> list[DecodeConfig]:
    fixed = [DecodeConfig.of(schedule="fixed", gamma_max=g, max_new_tokens=max_new_tokens) for g in (2, 4, 6)]
    return fixed + [DecodeConfig.of(metric="top1", threshold=t, gamma_max=6, min_draft_len=1,
                                    max_new_tokens=max_new_tokens) for t in (0.3, 0.6)]


def recorded(args):
    """The shipped pair, --task's first --limit prompts' ids, their record GAMMA deep, and the context
    prices are timed at (the first prompt halfway through its output)."""
    spec, _ = resolve_spec(task_spec(args.task), {"task": args.task, "limit": args.limit,
                                                   "max_new_tokens": args.max_new_tokens})
    prepared = prepare(spec)
    pair = prepared.pair
    ids = [encode(pair.tokenizer, p.text, spec.chat_template) for p in prepared.prompts]
    rec = record(pair, ids, args.max_new_tokens, GAMMA, eos_ids=pair.eos_ids)
    return pair, ids, rec, ids[0] + rec.continuation[0, : int(rec.lengths[0]) // 2].tolist()


def main() -> None:
    args = common.parser(__doc__, task="code", limit=8, max_new_tokens=64, repeats=3, out="results/timed").parse_args()
    pair, ids, rec, context = recorded(args)
    alone = measure_cost(pair, context, GAMMA)
    # The default path's batch-1 prices: timed inside decodes of the first two prompts (harness/in_decode.py).
    cost, _ = batch_one(pair, ids, calibration_policies(DecodeConfig.of(max_new_tokens=args.max_new_tokens), GAMMA),
                        alone, pair.eos_ids)
    configs = policies(args.max_new_tokens)
    predicted = simulate_grid(rec, configs, cost)
    predicted_alone = simulate_grid(rec, configs, alone)["predicted_speedup"].tolist()
    plain, runs, exact = [], [[] for _ in configs], True
    started = time.perf_counter()
    for repeat in range(args.repeats):  # plain and every policy in turn, the order rotated each repeat
        order = [-1, *range(len(configs))]
        order = order[repeat % len(order):] + order[: repeat % len(order)]
        for index in order:
            if index < 0:
                timed = timed_plain(pair, rec, ids)
                exact &= all(same for _, same in timed)
                plain.append(sum(seconds for seconds, _ in timed))
            else:
                timed = timed_replay(pair, rec, ids, configs[index])
                exact &= all(run.accepted == run.forced for run in timed)
                runs[index].append(sum(run.seconds for run in timed))
    rows = []
    for config, seconds, row, guess_alone in zip(configs, runs, predicted.itertuples(), predicted_alone):
        ratios = [p / s for p, s in zip(plain, seconds)]  # each repeat's plain over its policy
        measured = statistics.median(ratios)
        rows.append({"policy": config.label(), "tokens_per_round": row.tokens_per_round,
                     "predicted_speedup": row.predicted_speedup, "measured_speedup": measured,
                     "measured_low": min(ratios), "measured_high": max(ratios),
                     "error": row.predicted_speedup / measured - 1, "predicted_alone": guess_alone,
                     "error_alone": guess_alone / measured - 1})
    lines = [f"Timed replay, {args.limit} {args.task} prompts × {args.max_new_tokens} tokens, {args.repeats} repeats "
             f"interleaved with plain decoding ({time.perf_counter() - started:.0f} s); machine: "
             f"{describe_machine(environment())}; every round's acceptance as the passes computed it equal to the "
             f"forced one: {exact}.", "",
             "| policy | tokens/round | measured (timed replay) [min, max] | predicted, prices in decode (the "
             "default) | − 1 | predicted, --isolated-prices | − 1 |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['policy']} | {r['tokens_per_round']:.2f} | {r['measured_speedup']:.3f} [{r['measured_low']:.3f}, "
              f"{r['measured_high']:.3f}] | {r['predicted_speedup']:.3f} | {r['error']:+.1%} | "
              f"{r['predicted_alone']:.3f} | {r['error_alone']:+.1%} |" for r in rows]
    lines += ["", f"Within ±2 %: {sum(abs(r['error']) <= 0.02 for r in rows)} of {len(rows)} in decode, "
              f"{sum(abs(r['error_alone']) <= 0.02 for r in rows)} of {len(rows)} alone."]
    args.out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines)
    (args.out / "timed_replay.md").write_text(text + "\n")
    (args.out / "timed_replay.json").write_text(json.dumps({"rows": rows, "exact": exact, "cost": cost.to_dict(),
                                                            "alone": alone.to_dict(),
                                                            "plain_s": plain}, indent=2))
    print(text)


if __name__ == "__main__":
    main()

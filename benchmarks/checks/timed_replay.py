"""Timed replay against replay's prediction (issue 53's check of the prices, here on the CPU).

Records the shipped pair on held-out prompts, times its cost model, then runs the rounds replay
says five policies make (fixed γ 2, 4, 6 and two threshold policies) on real passes
(measure/timed.py), interleaved with plain decoding of the same tokens, and sets each measured
speedup beside the ones replay predicts on the default path's batch-1 prices (timed inside decodes of
the first two prompts: harness/in_decode.py) and on the passes timed alone (--isolated-prices). Every
round's acceptance as the passes compute it is checked against the forced one. Writes timed_replay.md
and .json into --out.

Each repeat times its own prices first (both kinds), then plain decoding and every policy in turn,
prompt by prompt (a minute's drift then slows every side alike, not one policy's stretch): the
machine's speed drifts by more than the check's ±2 % between minutes (docs/measurements.md), so each
repeat's measurement is held against replay on prices timed beside it, and the median of the
repeats' errors is the check, with the range over repeats; the first repeat's prices held against
every repeat's measurement (as a sweep's prices, timed once, are) are shown beside it.

    python -m benchmarks.checks.timed_replay --out results/timed [--limit 8] [--max-new-tokens 64] [--repeats 9]
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
from dspark_bench.measure.timed import forced_rounds, plain_prompt, run_prompt
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


def priced(pair, ids, rec, context, configs, max_new_tokens: int) -> tuple[list[float], list[float], dict]:
    """Replay's predicted speedups on prices timed now: inside decodes of the first two prompts (the
    default path's batch-1 prices, harness/in_decode.py) and alone (--isolated-prices); and both models."""
    alone = measure_cost(pair, context, GAMMA)
    cost, _ = batch_one(pair, ids, calibration_policies(DecodeConfig.of(max_new_tokens=max_new_tokens), GAMMA),
                        alone, pair.eos_ids)
    return (simulate_grid(rec, configs, cost)["predicted_speedup"].tolist(),
            simulate_grid(rec, configs, alone)["predicted_speedup"].tolist(),
            {"in_decode": cost.to_dict(), "alone": alone.to_dict()})


def measure_repeat(pair, ids, rec, configs, repeat: int) -> tuple[list[float], bool]:
    """One repeat: prompt by prompt, plain decoding and every policy in turn (the order rotated each
    prompt and repeat), so that a minute's drift slows every side alike; each policy's measured
    speedup (plain's seconds over its, summed over the prompts), and whether every round was exact."""
    rounds = [forced_rounds(rec, ids, config) for config in configs]
    sides = [-1, *range(len(configs))]
    seconds, exact = dict.fromkeys(sides, 0.0), True
    for p, prompt in enumerate(ids):
        tokens = rec.continuation[p, : int(rec.lengths[p])].tolist()
        turn = (repeat * len(ids) + p) % len(sides)
        for index in sides[turn:] + sides[:turn]:
            if index < 0:
                spent, same = plain_prompt(pair, prompt, tokens)
            else:
                run = run_prompt(pair, prompt, tokens, rounds[index][p], configs[index])
                spent, same = run.seconds, run.accepted == run.forced
            seconds[index] += spent
            exact &= same
    return [seconds[-1] / seconds[i] for i in range(len(configs))], exact


def spread(errors: list[float]) -> str:
    return f"{statistics.median(errors):+.1%} [{min(errors):+.1%}, {max(errors):+.1%}]"


def main() -> None:
    args = common.parser(__doc__, task="code", limit=8, max_new_tokens=64, repeats=9, out="results/timed").parse_args()
    pair, ids, rec, context = recorded(args)
    configs, repeats, exact = policies(args.max_new_tokens), [], True
    started = time.perf_counter()
    measure_repeat(pair, ids, rec, configs, 0)  # untimed: every pass's shape met once (the first runs read slow)
    for repeat in range(args.repeats):
        in_decode, alone, prices = priced(pair, ids, rec, context, configs, args.max_new_tokens)
        measured, same = measure_repeat(pair, ids, rec, configs, repeat)
        exact &= same
        repeats.append({"measured": measured, "in_decode": in_decode, "alone": alone, "prices": prices})
        print(f"repeat {repeat + 1}: " + ", ".join(f"{m:.3f}/{p:.3f}" for m, p in zip(measured, in_decode)), flush=True)
    per_round = simulate_grid(rec, configs)["tokens_per_round"].tolist()  # the rounds: the same every repeat
    rows = [row_of(config, i, per_round[i], repeats) for i, config in enumerate(configs)]
    write(args, rows, repeats, exact, time.perf_counter() - started)


def row_of(config: DecodeConfig, i: int, tokens_per_round: float, repeats: list[dict]) -> dict:
    """One policy's errors, prediction / measured − 1: per repeat on its own prices, and on the first's."""
    measured = [r["measured"][i] for r in repeats]
    sides = ("in_decode", "alone")
    return {"policy": config.label(), "tokens_per_round": tokens_per_round,
            "measured_speedup": statistics.median(measured), "measured_low": min(measured),
            "measured_high": max(measured),
            **{f"errors_{side}": [r[side][i] / m - 1 for r, m in zip(repeats, measured)] for side in sides},
            **{f"errors_first_{side}": [repeats[0][side][i] / m - 1 for m in measured] for side in sides}}


def write(args, rows: list[dict], repeats: list[dict], exact: bool, seconds: float) -> None:
    within = {side: sum(abs(statistics.median(r[f"errors_{side}"])) <= 0.02 for r in rows)
              for side in ("in_decode", "alone", "first_in_decode", "first_alone")}
    lines = [f"Timed replay, {args.limit} {args.task} prompts × {args.max_new_tokens} tokens, {args.repeats} repeats, "
             f"each timing its prices then plain decoding and the policies in turn prompt by prompt "
             f"({seconds:.0f} s); machine: "
             f"{describe_machine(environment())}; every round's acceptance as the passes computed it equal to the "
             f"forced one: {exact}.", "", "Error: predicted / measured − 1, the median over repeats [min, max].", "",
             "| policy | tokens/round | measured speedup [min, max] | on its repeat's prices, in decode (the default) "
             "| its repeat's, alone | the first repeat's, in decode | the first repeat's, alone |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['policy']} | {r['tokens_per_round']:.2f} | {r['measured_speedup']:.3f} [{r['measured_low']:.3f}, "
              f"{r['measured_high']:.3f}] | {spread(r['errors_in_decode'])} | {spread(r['errors_alone'])} | "
              f"{spread(r['errors_first_in_decode'])} | {spread(r['errors_first_alone'])} |" for r in rows]
    lines += ["", f"Median within ±2 %, of {len(rows)}: on each repeat's prices {within['in_decode']} in decode, "
              f"{within['alone']} alone; on the first repeat's {within['first_in_decode']} in decode, "
              f"{within['first_alone']} alone."]
    args.out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines)
    (args.out / "timed_replay.md").write_text(text + "\n")
    (args.out / "timed_replay.json").write_text(json.dumps({"rows": rows, "exact": exact, "repeats": repeats},
                                                           indent=1))
    print(text)


if __name__ == "__main__":
    main()

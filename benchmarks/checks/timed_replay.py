"""Timed replay against replay's prediction (issue 53's check of the prices, here on the CPU).

Records the shipped pair on held-out prompts, then runs the rounds replay says five policies make
(fixed γ 2, 4, 6 and two threshold policies) on real passes (measure/timed.py), interleaved with
plain decoding of the same tokens, and sets each measured speedup beside the one replay predicts
on the passes' prices (measure/cost_model.measure_cost, what `--isolated-prices` times: timed
replay runs the passes and nothing of the decoder's own sampling and acceptance). Every round's
acceptance as the passes compute it is checked against the forced one. Writes timed_replay.md and
.json into --out.

The prices are timed in windows inside the same rotation as the sides they price: each prompt, in
turn with plain decoding and every policy (the order rotated each prompt and repeat), a window
times every pass's price at that prompt's halfway context (3 repeats), and the check's prices are
each field's median over every window. The machine's speed drifts by more than the check's ±2 %
between minutes and between seconds (docs/measurements.md): prices timed in one stretch and held
against a measurement of the next read its drift (session 10's 1 of 5 within ±2 %), while windows
spread over the measurement's own minutes see the same machine it did. Beside it, the first
window's prices held against the whole measurement (as a sweep's prices, timed once, are), and the
default path's in-decode prices timed once before (harness/in_decode.py: they charge the decoder's
sampling and acceptance, which timed replay does not run, so they read low by construction).

    python -m benchmarks.checks.timed_replay --out results/timed [--limit 8] [--max-new-tokens 64] [--repeats 16]
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np

from benchmarks import common
from dspark_bench.config import DecodeConfig
from dspark_bench.harness.in_decode import batch_one, calibration_policies
from dspark_bench.measure.cost_model import measure_cost
from dspark_bench.measure.recording import record
from dspark_bench.measure.timed import forced_rounds, plain_prompt, run_prompt
from dspark_bench.replay.cost import CostModel
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


PLAIN, PRICES = -1, -2  # the rotation's sides past the policies: plain decoding, and a window timing the prices
WINDOW_REPEATS = 3  # each window's timings of every pass (measure_cost's medians over them)
BOOTSTRAP = 400


def in_decode_prices(pair, ids, max_new_tokens: int) -> CostModel:
    """The default path's batch-1 prices: timed inside decodes of the first two prompts (harness/in_decode.py)."""
    alone = measure_cost(pair, ids[0], GAMMA)
    cost, _ = batch_one(pair, ids, calibration_policies(DecodeConfig.of(max_new_tokens=max_new_tokens), GAMMA),
                        alone, pair.eos_ids)
    return cost


def measure_repeat(pair, ids, rec, configs, rounds, repeat: int) -> tuple[dict, list[CostModel], bool]:
    """One repeat: prompt by prompt, a window timing the prices at the prompt's halfway context,
    plain decoding and every policy in turn (the order rotated each prompt and repeat), so that the
    machine's drift meets every side alike: each side's seconds summed over the prompts, the
    windows' cost models, and whether every round's acceptance was the forced one."""
    sides = [PRICES, PLAIN, *range(len(configs))]
    seconds, windows, exact = dict.fromkeys(sides[1:], 0.0), [], True
    for p, prompt in enumerate(ids):
        tokens = rec.continuation[p, : int(rec.lengths[p])].tolist()
        turn = (repeat * len(ids) + p) % len(sides)
        for side in sides[turn:] + sides[:turn]:
            if side == PRICES:
                windows.append(measure_cost(pair, prompt + tokens[: len(tokens) // 2], GAMMA, repeats=WINDOW_REPEATS))
            elif side == PLAIN:
                spent, same = plain_prompt(pair, prompt, tokens)
            else:
                run = run_prompt(pair, prompt, tokens, rounds[side][p], configs[side])
                spent, same = run.seconds, run.accepted == run.forced
            if side != PRICES:
                seconds[side] += spent
                exact &= same
    return seconds, windows, exact


def pooled(windows: list[CostModel]) -> CostModel:
    """Every price's median over the windows (each window's own a median over its repeats)."""
    def median(field) -> float:
        return statistics.median(field(m) for m in windows)
    return CostModel(median(lambda m: m.t_draft), [median(lambda m: m.t_verify[k]) for k in range(GAMMA + 1)],
                     int(median(lambda m: m.context_tokens)), t_first_draft=median(lambda m: m.t_first_draft))


def predicted(rec, configs, cost: CostModel) -> list[float]:
    return simulate_grid(rec, configs, cost)["predicted_speedup"].tolist()


def errors(rec, configs, repeats: list[dict], seed: int = 0) -> list[dict]:
    """Each policy's measured speedup (plain's seconds over its, summed over every repeat), replay's
    prediction on the windows' pooled prices and its error, with a 95 % bootstrap interval over
    repeats (each resample re-pools its repeats' windows and re-sums their seconds)."""
    rng = np.random.default_rng(seed)
    point = errors_of(rec, configs, repeats)
    samples = [errors_of(rec, configs, [repeats[i] for i in rng.integers(0, len(repeats), len(repeats))])
               for _ in range(BOOTSTRAP)]
    return [{**p, "error_low": float(np.percentile([s[i]["error"] for s in samples], 2.5)),
             "error_high": float(np.percentile([s[i]["error"] for s in samples], 97.5))} for i, p in enumerate(point)]


def errors_of(rec, configs, repeats: list[dict]) -> list[dict]:
    prices = pooled([w for r in repeats for w in r["windows"]])
    plain = sum(r["seconds"][PLAIN] for r in repeats)
    measured = [plain / sum(r["seconds"][i] for r in repeats) for i in range(len(configs))]
    return [{"measured": m, "predicted": p, "error": p / m - 1}
            for m, p in zip(measured, predicted(rec, configs, prices))]


def main() -> None:
    args = common.parser(__doc__, task="code", limit=8, max_new_tokens=64, repeats=16, out="results/timed").parse_args()
    pair, ids, rec, _ = recorded(args)
    configs, repeats, exact = policies(args.max_new_tokens), [], True
    started = time.perf_counter()
    rounds = [forced_rounds(rec, ids, config) for config in configs]  # each policy's, the same every repeat
    measure_repeat(pair, ids, rec, configs, rounds, 0)  # untimed: every shape met once (the first runs read slow)
    in_decode = in_decode_prices(pair, ids, args.max_new_tokens)
    for repeat in range(args.repeats):
        seconds, windows, same = measure_repeat(pair, ids, rec, configs, rounds, repeat)
        exact &= same
        repeats.append({"seconds": seconds, "windows": windows})
        print(f"repeat {repeat + 1}: " + ", ".join(f"{seconds[PLAIN] / seconds[i]:.3f}" for i in range(len(configs))),
              flush=True)
    per_round = simulate_grid(rec, configs)["tokens_per_round"].tolist()  # the rounds: the same every repeat
    rows = [row_of(config, per_round[i], repeats, i, e) for i, (config, e) in
            enumerate(zip(configs, errors(rec, configs, repeats)))]
    for row, first, decoded in zip(rows, predicted(rec, configs, repeats[0]["windows"][0]),
                                   predicted(rec, configs, in_decode)):
        row.update(error_first_window=first / row["measured"] - 1, error_in_decode=decoded / row["measured"] - 1)
    write(args, rows, repeats, in_decode, exact, time.perf_counter() - started)


def row_of(config: DecodeConfig, tokens_per_round: float, repeats: list[dict], i: int, errors_: dict) -> dict:
    per_repeat = [r["seconds"][PLAIN] / r["seconds"][i] for r in repeats]
    return {"policy": config.label(), "tokens_per_round": tokens_per_round, **errors_,
            "measured_low": min(per_repeat), "measured_high": max(per_repeat)}


def write(args, rows: list[dict], repeats: list[dict], in_decode: CostModel, exact: bool, seconds: float) -> None:
    within = sum(abs(r["error"]) <= 0.02 for r in rows)
    windows = len(repeats) * len(repeats[0]["windows"])
    lines = [f"Timed replay, {args.limit} {args.task} prompts × {args.max_new_tokens} tokens, {args.repeats} repeats, "
             f"each prompt by prompt a prices window, plain decoding and the policies in turn ({seconds:.0f} s); "
             f"machine: {describe_machine(environment())}; every round's acceptance as the passes computed it equal "
             f"to the forced one: {exact}.", "",
             f"Error: predicted / measured − 1. Measured: plain decoding's seconds over the policy's, summed over the "
             f"repeats ([the repeats' lowest, highest]). Predicted: replay on the passes' prices, each the median of "
             f"its {windows} windows ([95 % bootstrap over repeats]).", "",
             "| policy | tokens/round | measured speedup | predicted | error | the first window's prices "
             "| in-decode prices, timed once before |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['policy']} | {r['tokens_per_round']:.2f} | {r['measured']:.3f} [{r['measured_low']:.3f}, "
              f"{r['measured_high']:.3f}] | {r['predicted']:.3f} | {r['error']:+.1%} [{r['error_low']:+.1%}, "
              f"{r['error_high']:+.1%}] | {r['error_first_window']:+.1%} | {r['error_in_decode']:+.1%} |" for r in rows]
    lines += ["", f"Within ±2 % on the windows' prices: {within} of {len(rows)}."]
    args.out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines)
    (args.out / "timed_replay.md").write_text(text + "\n")
    json_repeats = [{"seconds": {str(k): v for k, v in r["seconds"].items()},
                     "windows": [w.to_dict() for w in r["windows"]]} for r in repeats]
    (args.out / "timed_replay.json").write_text(json.dumps({"rows": rows, "exact": exact, "repeats": json_repeats,
                                                            "in_decode": in_decode.to_dict()}, indent=1))
    print(text)


if __name__ == "__main__":
    main()

"""Replay's prediction on prices timed alone and on prices timed inside decodes, against our decoder
(issue 53's in-decode prices, here on the CPU).

Records the shipped pair on held-out prompts, prices it twice — each pass alone between syncs
(measure/cost_model.py measure_cost) and inside running decodes of fixed γ 5 and a top1 threshold 0.45
policy on the first two prompts (measure/in_decode.py) — then decodes every prompt with plain decoding and five policies
(fixed γ 2, 4, 6 and two threshold policies) interleaved, each round timed where it runs
(measure/pass_clock.py; prefills are left out on both sides, as replay leaves them out), prompt by
prompt in a rotating order so that every side shares the machine's drift, and sets
each measured speedup beside the two predictions. Greedy: the decoder's rounds are replay's, so
the predictions differ from the measurement by their prices only. Writes in_decode.md and .json.

    python -m benchmarks.checks.in_decode --out results/in-decode [--limit 8] [--max-new-tokens 64] [--repeats 3]
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time

from benchmarks import common
from benchmarks.checks.timed_replay import GAMMA, policies, recorded
from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.measure import pass_clock
from dspark_bench.measure.cost_model import measure_cost
from dspark_bench.measure.in_decode import measure_in_decode
from dspark_bench.replay.simulate import simulate_grid
from dspark_bench.results import describe_machine, environment


def rounds_seconds(pair, prompt: list[int], config, speculative: bool) -> tuple[float, list[int]]:
    """Seconds of one decode's rounds (its prefills left out), and its output."""
    with pass_clock.timing(pair.device) as timing:
        if speculative:
            output = speculative_decode(pair.target, pair.draft, prompt, config, pair.eos_ids, timing).tokens
        else:
            output = autoregressive_decode(pair.target, prompt, config, pair.eos_ids, timing).tokens
    return sum(total for total, _, _ in timing.rounds), output


def measure(pair, ids, configs, expected, repeats: int) -> tuple[list[float], list[list[float]], bool]:
    """Plain decoding's and every policy's seconds per repeat, prompt by prompt in a rotating order,
    and whether every output was the record's."""
    plain, runs, exact = [0.0] * repeats, [[0.0] * repeats for _ in configs], True
    order, turn = [-1, *range(len(configs))], 0
    for repeat in range(repeats):
        for p, prompt in enumerate(ids):
            turn += 1
            for index in order[turn % len(order):] + order[: turn % len(order)]:
                seconds, output = rounds_seconds(pair, prompt, configs[max(index, 0)], speculative=index >= 0)
                exact &= output == expected[p]
                (plain if index < 0 else runs[index])[repeat] += seconds
    return plain, runs, exact


def main() -> None:
    args = common.parser(__doc__, task="code", limit=8, max_new_tokens=64, repeats=3,
                         out="results/in-decode").parse_args()
    pair, ids, rec, context = recorded(args)
    expected = [rec.continuation[p, : int(rec.lengths[p])].tolist() for p in range(len(ids))]
    started = time.perf_counter()
    alone = measure_cost(pair, context, GAMMA)
    configs = policies(args.max_new_tokens)
    # Priced in decode on two prompts and two policies not among the five (a fixed γ and a threshold
    # policy, so that both kinds of round and most draft lengths are seen), then used on all of them.
    fitted_on = [DecodeConfig.of(schedule="fixed", gamma_max=5, max_new_tokens=args.max_new_tokens),
                 DecodeConfig.of(metric="top1", threshold=0.45, gamma_max=6, min_draft_len=1,
                                 max_new_tokens=args.max_new_tokens)]
    inside, detail = measure_in_decode(pair, ids[:2], fitted_on, alone, pair.eos_ids)
    # The same timings priced as before a round's first draft pass was kept apart: every one-token
    # draft pass's median a draft step, nothing of it once a round (docs/batch-sizes.md#in-decode-prices).
    one_price = dataclasses.replace(inside, t_draft=detail["every_draft_pass"] + detail["per_step_overhead"],
                                    t_first_draft=0.0)
    predicted = {name: simulate_grid(rec, configs, cost)["predicted_speedup"].tolist()
                 for name, cost in (("alone", alone), ("in_decode", inside), ("one_price", one_price))}
    plain, runs, exact = measure(pair, ids, configs, expected, args.repeats)
    rows = []
    for i, (config, seconds) in enumerate(zip(configs, runs)):
        ratios = [p / s for p, s in zip(plain, seconds)]  # each repeat's plain over its policy
        measured = statistics.median(ratios)
        rows.append({"policy": config.label(), "measured_speedup": measured, "low": min(ratios), "high": max(ratios),
                     **{f"predicted_{name}": guesses[i] for name, guesses in predicted.items()},
                     **{f"error_{name}": guesses[i] / measured - 1 for name, guesses in predicted.items()}})
    lines = [f"Replay's prediction on two prices against our decoder: {len(ids)} {args.task} prompts × "
             f"{args.max_new_tokens} tokens, {args.repeats} repeats interleaved with plain decoding, rounds only "
             f"({time.perf_counter() - started:.0f} s); machine: {describe_machine(environment())}; every output "
             f"the record's: {exact}.", "",
             "| price | t_draft ms | first draft step's excess ms | t_verify(0) ms | t_verify(2) ms | t_verify(6) ms "
             "| t_round ms | plain step ms |", "|---|---|---|---|---|---|---|---|"]
    for name, cost in (("alone, between syncs", alone), ("inside decodes", inside)):
        lines.append(f"| {name} | {cost.t_draft * 1e3:.3f} | {cost.t_first_draft * 1e3:.3f} | "
                     f"{cost.t_verify[0] * 1e3:.3f} | "
                     f"{cost.t_verify[2] * 1e3:.3f} | {cost.t_verify[6] * 1e3:.3f} | {cost.t_round * 1e3:.3f} | "
                     f"{cost.plain_step * 1e3:.3f} |")
    lines += ["", f"In decode: fitted on {', '.join(c.label() for c in fitted_on)} (first 2 prompts, 2 repeats); "
              f"a draft pass {detail['draft_pass'] * 1e3:.3f} ms (a round's first "
              f"{detail['first_draft_excess'] * 1e3:.3f} ms more, t_first_draft; every one-token draft pass's median "
              f"{detail['every_draft_pass'] * 1e3:.3f} ms) plus {detail['per_step_overhead'] * 1e3:.3f} ms of "
              f"host work a draft step, {inside.t_round * 1e3:.3f} ms a round (median round past its passes "
              f"{detail['median_round_overhead'] * 1e3:.3f} ms); verify lengths unfed scaled by "
              f"{detail['verify_scaled_by']:.3f}.", "",
              "| policy | measured [min, max] | predicted, prices alone | − 1 | predicted, prices in decode | − 1 | "
              "in decode, one price a draft step | − 1 |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['policy']} | {r['measured_speedup']:.3f} [{r['low']:.3f}, {r['high']:.3f}] | "
              f"{r['predicted_alone']:.3f} | {r['error_alone']:+.1%} | {r['predicted_in_decode']:.3f} | "
              f"{r['error_in_decode']:+.1%} | {r['predicted_one_price']:.3f} | {r['error_one_price']:+.1%} |"
              for r in rows]
    lines += ["", "Within ±2 %, of " + str(len(rows)) + ": " + ", ".join(
        f"{name} {sum(abs(r[f'error_{key}']) <= 0.02 for r in rows)}" for key, name in (
            ("alone", "alone"), ("in_decode", "in decode"), ("one_price", "in decode, one price a draft step")))]
    args.out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines)
    (args.out / "in_decode.md").write_text(text + "\n")
    (args.out / "in_decode.json").write_text(json.dumps(
        {"rows": rows, "exact": exact, "alone": alone.to_dict(), "in_decode": inside.to_dict(),
         "in_decode_detail": detail, "plain_s": plain, "runs_s": runs}, indent=2, default=str))
    print(text)


if __name__ == "__main__":
    main()

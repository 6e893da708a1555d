"""llama.cpp at depth, priced again: a `run --decoder llamacpp` folder's measured speedups held per
prompt-length bucket against replay on the run's own llama.cpp prices, as replay prices them now.

A benchmark, not a test. The run's measurements (llamacpp.parquet: each prompt's generation phase on
both servers) are kept as they were; the replay record is made again (the target's greedy
continuations of the same prompts: deterministic), and each policy's prediction per bucket comes
from engines/llamacpp_run.by_bucket on the prices file the run used. So a change to how replay prices
(docs/depth.md#llamacpp-at-depth: the plain step at each depth) is checked against real llama-server
runs without timing them again. Prints each (policy, bucket) and the median |predicted / measured − 1|.

`--refit`, for a prices file fitted at one depth (before each fit prompt was priced at its own
depths): its own fit rows (fitted_on.runs, as that fit normalized them) fitted again by this build's
replay/cost_file.fit_overheads on the file's own passes, and every bucket priced on both.

    dspark-bench run --decoder llamacpp --task long-code --limit 12 --max-new-tokens 64 --semantics llamacpp \
        --metric top1 --threshold 0 --threshold 0.3 --threshold 0.6 --gamma-max 3 --gamma-max 6 \
        --min-draft-len 0 --repeats 1 --out results/llamacpp-depth
    python -m benchmarks.checks.llamacpp_depth results/llamacpp-depth/<run folder> [--refit] [--prices FILE]

`--line`: what each of the run's own rounds took past their passes, fitted as fit_overheads fits
llama-server's (t_round + t_round_token per drafted token, replay/cost_file.round_line) on the
run's fixed-γ policies alone, and every policy priced on that line: the threshold policies, mostly
short drafts, are then priced on a line they did not make (how the per-token term was found:
docs/depth.md#what-a-round-adds-per-drafted-token).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.engines.llamacpp_prices import EMPTY_FIT
from dspark_bench.errors import DsparkError
from dspark_bench.engines.llamacpp_run import by_bucket, generation_speedup
from dspark_bench.harness.hf_cost_model import FIT_GAMMAS, fit_prompts
from dspark_bench.harness.run import from_run_info, plan_run
from dspark_bench.measure.recording import record
from dspark_bench.replay import cost_file
from dspark_bench.replay.cost import CostModel
from dspark_bench.replay.simulate import simulate_grid
from dspark_bench.results import read_json
from dspark_bench.tasks.prompts import encode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a `run --decoder llamacpp` folder over prompts of several buckets")
    parser.add_argument("--refit", action="store_true", help="also price on the prices file's fit rows fitted again")
    parser.add_argument("--prices", type=Path, help="the run's prices file where it is no longer where the run "
                        "read it (a copy kept beside the run's data)")
    parser.add_argument("--line", action="store_true", help="also price on the per-token line fitted on the run's "
                        "own fixed-γ rounds")
    args = parser.parse_args()
    folder = args.run
    info = read_json(folder / "llamacpp.json", "llama.cpp result")
    where = args.prices or Path(info["prices"]["llamacpp"])
    try:  # a wrong file, or --refit on a depth-fitted one: refused in one line before any model loads
        prices = cost_file.load(where)
    except DsparkError as error:
        raise SystemExit(f"error: {error}") from None
    measured = pd.read_parquet(folder / "llamacpp.parquet")
    if args.refit and prices.fitted_on.get("fit_version", 3) >= 4:  # engines/llamacpp_prices.FIT_VERSION 4
        raise SystemExit("--refit takes a prices file fitted at one depth; this one is fitted at each prompt's depths")
    planned = plan_run(from_run_info(read_json(folder / "run.json", "run file")))
    pair, settings = planned.pair, planned.config.settings()
    eos = settings.eos_ids(pair)
    ids = [encode(pair.tokenizer, p.text, settings.chat_template) for p in planned.prompts]
    first = planned.configs[0]
    targets = [autoregressive_decode(pair.target, i, first, eos).tokens for i in ids]
    gamma = max(c.stopping.gamma_max for c in planned.configs)
    rec = record(pair, ids, first.verification.max_new_tokens, gamma, eos_ids=eos, continuations=targets)
    costs = {"the run's prices": prices.surface.at(1)}
    if args.refit:
        costs["refitted at each fit prompt's depths"] = refitted(prices, planned, pair, settings, eos)
    if args.line:
        costs["the line through the run's own fixed-γ rounds"] = own_line(prices, planned, measured, rec)
    print(f"{folder}: {len(ids)} prompts of {min(map(len, ids)):,}-{max(map(len, ids)):,} tokens; prices {where}")
    for name, cost in costs.items():
        print(f"on {name}: t_round {cost.t_round * 1e3:.3f} ms + {cost.t_round_token * 1e3:.3f} ms a drafted token, "
              f"t_round_empty {(cost.t_round_empty or 0) * 1e3:.3f} "
              f"ms, t_plain {cost.t_plain * 1e3:.3f} ms")
        report(rec, planned, measured, ids, cost)


def report(rec, planned, measured: pd.DataFrame, ids, cost: CostModel) -> None:
    errors, medians = [], []
    for c, policy in enumerate(planned.configs):
        rows = measured[measured["config_id"] == c]
        whole = generation_speedup(rows, policy.label())["speedup"]
        predicted = float(simulate_grid(rec, [policy], cost)["predicted_speedup"].iloc[0])
        print(f"  {policy.label():46} every prompt: measured {whole:.3f}, predicted {predicted:.3f} "
              f"({predicted / whole - 1:+.1%})")
        parts = by_bucket(rec, policy, rows, ids, planned.prompts, cost)
        for part in parts:
            errors.append(abs(part["error_llamacpp"]))
            print(f"  {policy.label():46} {part['bucket']:>7} ({part['prompts']} prompts): measured "
                  f"{part['llamacpp_speedup']:.3f} [{part['llamacpp_speedup_low']:.3f}, "
                  f"{part['llamacpp_speedup_high']:.3f}], predicted {part['predicted_llamacpp']:.3f} "
                  f"({part['error_llamacpp']:+.1%})")
        medians.append(float(np.median([abs(p["error_llamacpp"]) for p in parts])))
    print(f"median |predicted / measured - 1| over {len(errors)} (policy, bucket): {np.median(errors):.1%}; "
          f"largest {max(errors):.1%}; within ±10 %: {sum(e <= 0.10 for e in errors)} of {len(errors)}; policies "
          f"whose median over buckets is within ±10 %: {sum(m <= 0.10 for m in medians)} of {len(medians)}")


def own_line(prices, planned, measured: pd.DataFrame, rec) -> CostModel:
    """The run's prices with t_round and t_round_token fitted on its own fixed-γ policies' rounds
    (llama.cpp's rule at threshold 0), t_plain and t_round_empty as the file has them."""
    passes = dataclasses.replace(prices.surface.at(1), t_round=0.0, t_round_empty=None, t_plain=0.0, t_round_token=0.0)
    order = {p.id: i for i, p in enumerate(planned.prompts)}
    runs = []
    for c, policy in enumerate(planned.configs):
        rows = measured[measured["config_id"] == c].sort_values("prompt_id", key=lambda ids: ids.map(order))
        runs.append((policy, rows.assign(spec_s=rows["spec_gen_s"], baseline_s=rows["baseline_gen_s"])))
    _, per_run = cost_file.fit_overheads(passes, rec, runs)
    fixed = {c.label() for c in planned.configs if c.stopping.threshold == 0}
    t_round, t_round_token = cost_file.round_line([r for r in per_run if r["policy"] in fixed])
    return dataclasses.replace(prices.surface.at(1), t_round=t_round, t_round_token=t_round_token)


def refitted(prices, planned, pair, settings, eos) -> CostModel:
    """The file's own fit rows fitted again on its passes (its depth axis included): the rows as the
    one-depth fit wrote them, each speculative side normalized to the fit's t_plain, made raw again."""
    old = prices.surface.at(1)
    fit = fit_prompts(planned.config, planned.prompts)
    fit_ids = [encode(pair.tokenizer, p.text, settings.chat_template) for p in fit]
    tokens = planned.configs[0].verification.max_new_tokens  # the fit decodes what the run does
    policies = [DecodeConfig.of(**knobs, min_draft_len=0, semantics="llamacpp", max_new_tokens=tokens)
                for knobs in [*(dict(schedule=schedules.BASELINE, gamma_max=g) for g in FIT_GAMMAS), EMPTY_FIT]]
    runs = []
    for policy in policies:
        rows = [r for r in prices.fitted_on["runs"] if r["policy"] == policy.label()]
        runs.append((policy, pd.DataFrame([{
            "prompt_id": r["prompt_id"], "new_tokens": r["tokens"], "baseline_new_tokens": r["tokens"],
            "baseline_s": r["plain_per_token_s"] * r["tokens"],
            "spec_s": r["spec_s"] * r["plain_per_token_s"] / old.t_plain} for r in rows])))
    passes = dataclasses.replace(old, t_round=0.0, t_round_empty=None, t_plain=0.0, t_round_token=0.0)
    return cost_file.fit_overheads(passes, record(pair, fit_ids, tokens, max(FIT_GAMMAS), eos_ids=eos), runs)[0]


if __name__ == "__main__":
    main()

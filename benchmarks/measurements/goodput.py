"""The bar of issue 13: the goodput schedule against the best fixed gamma and the best tuned
threshold policy, measured in one interleaved run; the same at a large batch size; and HF
assisted generation against our decoder on the policy `export --format hf` writes.

1. Record the shipped pair on the task's first `--limit` prompts (the test prompts) and on
   `--heldout` prompts of another task (`--heldout-task`), and time the cost surface at batch 1
   and `--batch-size`.
2. Fit acceptance twice: on the test record (what a sweep does: its own record) and on the other
   task's only, so one goodput is fitted on nothing it is measured on. Goodput runs as it comes
   (top1, gamma_max 8, min_draft_len 0): no knob is searched.
3. Replay the task's dense space (sweeps/<task>.yaml) and every fixed gamma 1-8 on the test
   record: the best threshold-style policy and the best fixed gamma, as a sweep would pick them.
4. One run over the test prompts, each policy interleaved with the autoregressive baseline:
   both goodputs, best threshold, best fixed, and HF's own default policy (20 tokens, threshold
   0.4, its rule) in our decoder. Speedups are per-prompt bootstrap intervals.
5. At `--batch-size`: goodput against the best fixed gamma replay predicts there, both run batched.
6. The best HF-expressible policy (HF's rule, top1, no minimum; replayed), run by our decoder and
   by HF assisted generation on `--hf-prompts` prompts: speedup and tokens_per_round of each
   beside replay's.

    python -m benchmarks.measurements.goodput [--task code] [--limit 40] [--heldout-task mixed] [--heldout 24]
                                 [--max-new-tokens 128]
                                 [--batch-size 32] [--hf-prompts 20] [--out /tmp/goodput-bench]
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import numpy as np
import pandas as pd

from benchmarks import common

GAMMA = 8


def main() -> None:
    from dspark_bench.config import DecodeConfig
    from dspark_bench.decoding.goodput import GoodputModel
    from dspark_bench.engines.export import candidates
    from dspark_bench.harness.models import load_pair
    from dspark_bench.harness.runner import RunnerSettings, run
    from dspark_bench.measure.cost_model import measure_surface
    from dspark_bench.measure.recording import record
    from dspark_bench.metrics import summarize
    from dspark_bench.replay.acceptance import fit_record
    from dspark_bench.replay.batched import predict_batched
    from dspark_bench.replay.simulate import simulate_grid
    from dspark_bench.results import describe_machine, environment
    from dspark_bench.tasks import load_prompts
    from dspark_bench.tasks.prompts import encode
    from dspark_bench.tuning.spec import points
    from dspark_bench.tuning.spec_files import resolve_spec, task_spec

    parser = common.parser(__doc__, task="code", limit=40, max_new_tokens=128, out="/tmp/goodput-bench")
    parser.add_argument("--heldout-task", default="mixed")
    parser.add_argument("--heldout", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hf-prompts", type=int, default=20)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def say(line: str) -> None:
        print(f"[{time.perf_counter() - start:6.0f} s] {line}", flush=True)

    pair = load_pair()
    test, _, _ = load_prompts(args.task, None, limit=args.limit)
    held, _, _ = load_prompts(args.heldout_task, None, limit=args.heldout)
    ids = [encode(pair.tokenizer, p.text) for p in test + held]
    N, B = args.max_new_tokens, args.batch_size
    eos = SimpleNamespace(target=pair.target, draft=pair.draft, eos_ids=pair.eos_ids)
    say(f"recording {len(test)} {args.task} prompts and {len(held)} {args.heldout_task} prompts × {N} tokens")
    rec = record(eos, ids[: args.limit], N, GAMMA)
    rec_held = record(eos, ids[args.limit :], N, GAMMA)
    context = ids[0] + rec.continuation[0, : int(rec.lengths[0]) // 2].tolist()
    surface = measure_surface(pair, context, GAMMA, [1, B])
    model_file, held_file = args.out / "goodput_model.json", args.out / f"goodput_model_{args.heldout_task}.json"
    model = GoodputModel.build(fit_record(rec), surface)
    model_file.write_text(json.dumps(model.to_dict(), indent=1))
    held_model = GoodputModel.build(fit_record(rec_held), surface)
    held_file.write_text(json.dumps(held_model.to_dict(), indent=1))
    say(f"acceptance fit on the test record: {json.dumps(model.acceptance.quality)}")
    say(f"acceptance fit on {args.heldout_task}: {json.dumps(held_model.acceptance.quality)}")

    spec, _ = resolve_spec(task_spec(args.task), {"task": args.task, "max_new_tokens": N})
    base = DecodeConfig.of(max_new_tokens=N)
    space = [c for c in points(spec, base) if c.stopping.gamma_max <= GAMMA]
    fixed = [base.replace(schedule="fixed", gamma_max=g, min_draft_len=0) for g in range(1, GAMMA + 1)]
    goodput = base.replace(schedule="goodput", gamma_max=GAMMA, min_draft_len=0, goodput_model=str(model_file))
    goodput_held = goodput.replace(goodput_model=str(held_file))
    goodputs = [base.replace(schedule="goodput", metric=m, gamma_max=g, min_draft_len=0, goodput_model=str(model_file))
                for m in ("top1", "entropy", "topk_mass", "margin") for g in range(2, GAMMA + 1)]
    configs = space + fixed + goodputs + [goodput_held]
    table = simulate_grid(rec, configs, surface.at(1))
    best = lambda rows: configs[int(rows.sort_values("predicted_speedup", ascending=False).iloc[0]["config_id"])]  # noqa: E731
    best_threshold = best(table[~table["schedule"].isin(["fixed", "goodput"])])
    best_fixed = best(table[table["schedule"] == "fixed"])
    best_goodput = best(table[table["schedule"] == "goodput"])
    say(f"replayed {len(table):,} policies: best threshold-style {best_threshold.label()}, best fixed "
        f"{best_fixed.label()}, best goodput {best_goodput.label()} (not used: goodput runs untuned as "
        f"{goodput.label()})")
    # HF's own default (transformers 5: 20 assistant tokens, constant, threshold 0.4, its rule):
    # measured, not replayed (the record is 8 deep).
    hf_default = base.replace(semantics="hf", threshold=0.4, gamma_max=20, min_draft_len=0)
    policies = [goodput, goodput_held, best_threshold, best_fixed, hf_default]
    predicted = {c: float(table.loc[configs.index(c), "predicted_speedup"]) if c in configs else float("nan")
                 for c in policies}
    names = {goodput: f"goodput (fit: this record) {goodput.label()}",
             goodput_held: f"goodput (fit: {args.heldout_task}) {goodput.label()}",
             best_threshold: f"best threshold-style: {best_threshold.label()}",
             best_fixed: f"best fixed: {best_fixed.label()}",
             hf_default: f"HF's default: {hf_default.label()}"}

    say(f"measuring both goodputs, best threshold, best fixed and HF's default at batch 1 over {len(test)} prompts")
    out = run(pair, test, policies, RunnerSettings())
    out.samples.to_parquet(args.out / "batch1_samples.parquet")
    rows = measured_rows(summarize(out.samples), policies, predicted, names)

    say(f"batch size {B}: goodput vs the best fixed gamma replay predicts there")
    at_b = [c.replace(batch_size=B) for c in [goodput] + fixed]
    batched = predict_batched(rec, at_b, surface)
    fixed_b = at_b[1 + int(np.argmax(batched["predicted_speedup"].to_numpy()[1:]))]
    predicted_b = {at_b[0]: float(batched["predicted_speedup"].iloc[0]),
                   fixed_b: float(batched["predicted_speedup"].iloc[at_b.index(fixed_b)])}
    out_b = run(pair, test, [at_b[0], fixed_b], RunnerSettings())
    out_b.samples.to_parquet(args.out / f"batch{B}_samples.parquet")
    names_b = {at_b[0]: f"goodput (fit: this record) {at_b[0].label()}", fixed_b: f"best fixed: {fixed_b.label()}"}
    rows += measured_rows(summarize(out_b.samples), [at_b[0], fixed_b], predicted_b, names_b)

    pool = candidates("hf", base, list(range(1, GAMMA + 1)))
    hf_table = simulate_grid(rec, pool, surface.at(1))
    hf_policy = pool[int(hf_table["predicted_speedup"].idxmax())]
    hf_replay = hf_table.loc[pool.index(hf_policy)]
    few = test[: args.hf_prompts]
    say(f"HF's own engine vs ours on {hf_policy.label()} over {len(few)} prompts")
    decoders = {}
    for decoder in ("ours", "hf"):
        result = run(pair, few, [hf_policy], RunnerSettings(decoder=decoder))
        result.samples.to_parquet(args.out / f"hf_policy_{decoder}_samples.parquet")
        decoders[decoder] = summarize(result.samples).iloc[0]
    replay_few = simulate_grid(rec.__class__(rec.continuation[: len(few)], rec.lengths[: len(few)],
                                             rec.rollout[: len(few)],
                                             {m: v[: len(few)] for m, v in rec.confidences.items()},
                                             rec.eos_ids, rec.info), [hf_policy], surface.at(1)).iloc[0]

    print(f"\n{len(test)} {args.task} prompts × {N} new tokens · shipped pair · {time.perf_counter() - start:.0f} s · "
          f"machine: {describe_machine(environment())}\n")
    print("| B | policy | measured speedup [95 % CI] | predicted | tokens/round | avg draft len | identical |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch_size']} | {r['policy']} | {r['speedup']:.3f} [{r['low']:.3f}, {r['high']:.3f}] | "
              f"{r['predicted']:.3f} | {r['tokens_per_round']:.3f} | {r['avg_draft_len']:.2f} | {r['identical']:.2f} |")
    print(f"\nHF-expressible best (replayed over {len(pool)} HF policies on all {len(test)} prompts): "
          f"{hf_policy.label()}, predicted {hf_replay['predicted_speedup']:.3f}\n")
    print("| decoder | measured speedup [95 % CI] | tokens/round | replayed tokens/round | identical |")
    print("|---|---|---|---|---|")
    for decoder, s in decoders.items():
        print(f"| {decoder} | {s['speedup']:.3f} [{s['speedup_low']:.3f}, {s['speedup_high']:.3f}] | "
              f"{s['tokens_per_round']:.4f} | {replay_few['tokens_per_round']:.4f} | "
              f"{s['identical_to_baseline']:.2f} |")
    (args.out / "results.json").write_text(json.dumps({
        "rows": rows, "hf_policy": hf_policy.to_dict(), "decoders": {e: s.to_dict() for e, s in decoders.items()},
        "replayed_tokens_per_round": float(replay_few["tokens_per_round"]),
        "acceptance_quality": model.acceptance.quality}, indent=1, default=str))
    print(f"\nresults: {args.out}")


def measured_rows(summary: pd.DataFrame, policies: list, predicted: dict, names: dict) -> list[dict]:
    rows = []
    for i, policy in enumerate(policies):
        s = summary[summary["config_id"] == i].iloc[0]
        rows.append({"batch_size": policy.batching.batch_size, "policy": names[policy], "speedup": float(s["speedup"]),
                     "low": float(s["speedup_low"]), "high": float(s["speedup_high"]),
                     "predicted": predicted[policy], "tokens_per_round": float(s["tokens_per_round"]),
                     "avg_draft_len": float(s["avg_draft_len"]), "identical": float(s["identical_to_baseline"])})
    return rows


if __name__ == "__main__":
    main()

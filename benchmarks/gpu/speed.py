"""The GPU run's speed stage (benchmarks/gpu --stages speed): the shipped pair's decoders timed.

1. Record the task's first --limit prompts and time the step costs; replay the task's sweep
   space and every fixed gamma: the best policy and the best fixed gamma (a quick replay sweep).
2. One run folder, every row interleaved with the autoregressive baseline (per-prompt bootstrap
   intervals): fixed gamma and the best policy, early-stop and verify-side draft modes, eager and
   compiled (static cache + torch.compile; CUDA graphs on a GPU; the compiled rows' baseline is
   compiled too), and both at each --batch-size above 1 (batched decoder, early-stop, eager).
3. HF assisted generation against our decoder on the best policy HF can express (HF's rule).
4. Our autoregressive baseline against `model.generate`.
5. The draft loop alone: tokens/s with a host sync per step (the early-stop loop reading each
   token and confidence) and with none (decisions left on the device), eager and compiled.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch


def bench_pair(pair, args, out: Path, say) -> tuple[list[dict], Path]:
    from dspark_bench.config import DecodeConfig
    from dspark_bench.engines.export import candidates
    from dspark_bench.harness.runner import RunnerSettings, run, run_to_folder
    from dspark_bench.measure.cost_model import measure_surface
    from dspark_bench.measure.recording import record
    from dspark_bench.metrics import summarize
    from dspark_bench.replay.simulate import simulate_grid
    from dspark_bench.tasks import load_prompts
    from dspark_bench.tasks.prompts import encode
    from dspark_bench.tuning.spec import points
    from dspark_bench.tuning.spec_files import resolve_spec, task_spec

    prompts, source, _ = load_prompts(args.task, None, limit=args.limit)
    ids = [encode(pair.tokenizer, p.text) for p in prompts]
    N, G = args.max_new_tokens, args.gamma
    say(f"recording {len(prompts)} prompts × {N} tokens (rollouts {G} deep) and timing steps at B = 1, "
        f"{', '.join(map(str, args.batch_size))}")
    rec = record(SimpleNamespace(target=pair.target, draft=pair.draft, eos_ids=pair.eos_ids), ids, N, G)
    context = ids[0] + rec.continuation[0, : int(rec.lengths[0]) // 2].tolist()
    surface = measure_surface(pair, context, G, [1, *args.batch_size])
    spec, _ = resolve_spec(task_spec(args.task), {"task": args.task, "max_new_tokens": N})
    base = DecodeConfig.of(max_new_tokens=N)
    fixed = [base.replace(schedule="fixed", gamma_max=g, min_draft_len=0) for g in range(1, G + 1)]
    space = [c for c in points(spec, base) if c.stopping.gamma_max <= G] + fixed
    table = simulate_grid(rec, space, surface.at(1))
    pick = lambda rows: space[int(rows["predicted_speedup"].idxmax())]  # noqa: E731
    best, best_fixed = pick(table[table["schedule"] != "fixed"]), pick(table[table["schedule"] == "fixed"])
    say(f"replayed {len(space):,} policies: best {best.label()}, best fixed {best_fixed.label()}")

    compiled = [False] if args.no_compile else [False, True]
    at_one = [p.replace(draft_mode=m, compiled=c) for p in (best_fixed, best)
              for c in compiled for m in ("early-stop", "verify-side")]
    batched = [p.replace(batch_size=b) for b in args.batch_size for p in (best_fixed, best)]
    say(f"one run: {len(at_one)} policies at B = 1 and {len(batched)} batched, each against the baseline")
    folder, summary = run_to_folder(pair, prompts, at_one + batched, out, RunnerSettings(), source, say=say)
    rows = [measured(summary, i, c, "ours") for i, c in enumerate(at_one + batched)]

    pool = candidates("hf", base, list(range(1, G + 1)))
    hf_policy = pool[int(simulate_grid(rec, pool, surface.at(1))["predicted_speedup"].idxmax())]
    say(f"HF assisted generation vs our decoder on {hf_policy.label()}")
    for decoder in ("ours", "hf"):
        out_decoder = run(pair, prompts, [hf_policy], RunnerSettings(decoder=decoder))
        rows.append(measured(summarize(out_decoder.samples), 0, hf_policy,
                             "HF assisted generation" if decoder == "hf" else "ours"))

    say("our autoregressive baseline vs model.generate")
    rows += baseline_rows(pair, ids, base)
    say("the draft loop alone: a host sync per step vs none")
    rows += draft_loop_rows(pair, ids[0], 64 if not args.smoke else 8, compiled)
    return rows, folder


def measured(summary, config_id: int, config, decoder: str) -> dict:
    s = summary[summary["config_id"] == config_id].iloc[0]
    return {"batch_size": config.batching.batch_size, "decoder": decoder, "policy": config.label(),
            "tokens_per_s": float(s["spec_tokens_per_s"]), "speedup": float(s["speedup"]),
            "low": float(s["speedup_low"]), "high": float(s["speedup_high"]),
            "tokens_per_round": float(s["tokens_per_round"]), "identical": float(s["identical_to_baseline"]),
            "baseline_tokens_per_s": float(s["baseline_tokens_per_s"])}


def baseline_rows(pair, ids: list[list[int]], config) -> list[dict]:
    """Our loop and `model.generate`, interleaved per prompt: tokens/s and generate's speed relative to ours."""
    from dspark_bench.decoding.autoregressive import autoregressive_decode, hf_generate
    from dspark_bench.harness.runner import timed
    from dspark_bench.metrics import bootstrap_ratio

    methods = {"ours": lambda p: autoregressive_decode(pair.target, p, config, pair.eos_ids),
               "model.generate": lambda p: hf_generate(pair.target, p, config, pair.eos_ids)}
    for fn in methods.values():
        fn(ids[0])  # warm-up
    seconds = {name: [] for name in methods}
    tokens = {name: [] for name in methods}
    for p in ids:
        for name, fn in methods.items():
            result, t = timed(lambda: fn(p), pair.device)
            seconds[name].append(t)
            tokens[name].append(len(result.tokens))
    rate = {name: sum(tokens[name]) / sum(seconds[name]) for name in methods}
    # generate's speed relative to ours: our seconds per token over its seconds per token
    ratio, low, high = bootstrap_ratio(np.array(seconds["ours"]) / np.array(tokens["ours"]),
                                       np.array(seconds["model.generate"]) / np.array(tokens["model.generate"]))
    return [{"batch_size": 1, "decoder": "autoregressive: ours", "policy": "—", "tokens_per_s": rate["ours"],
             "speedup": 1.0},
            {"batch_size": 1, "decoder": "autoregressive: model.generate", "policy": "—",
             "tokens_per_s": rate["model.generate"], "speedup": float(ratio), "low": float(low), "high": float(high)}]


@torch.inference_mode()
def draft_loop_rows(pair, ids: list[int], steps: int, compiled: list[bool], repeats: int = 5) -> list[dict]:
    """Draft forwards + confidence + token choice, `steps` in a row, with and without reading
    each step's token and confidence on the host (what the early-stop loop must do)."""
    from dspark_bench.config import DecodeConfig
    from dspark_bench.decoding import confidence
    from dspark_bench.decoding.cached_lm import CachedLM
    from dspark_bench.decoding.host import fetch, synchronize
    from dspark_bench.decoding.sampling import distribution, pick

    config = DecodeConfig()

    def loop(sync: bool, on: bool) -> float:
        lm = CachedLM(pair.draft, on, len(ids) + steps + 1)
        lm.prefill(ids[:-1])
        pending = ids[-1:]
        synchronize(pair.device)
        start = time.perf_counter()
        for _ in range(steps):
            q = distribution(lm.forward(pending)[-1], config)
            score, token = confidence.METRICS["top1"](q), pick(q, q, config, None)
            if sync:
                fetch(score, token)
            pending = token.view(1)
        synchronize(pair.device)
        return steps / (time.perf_counter() - start)

    variants = [(sync, on) for on in compiled for sync in (True, False)]
    for variant in variants:
        loop(*variant)  # warm-up (and compile)
    rates = {v: [] for v in variants}
    for _ in range(repeats):  # interleaved, medians
        for variant in variants:
            rates[variant].append(loop(*variant))
    return [{"batch_size": 1, "decoder": f"draft loop, {'host sync per step' if sync else 'decisions on the device'}"
             + (", compiled" if on else ""), "policy": f"{steps} steps",
             "tokens_per_s": statistics.median(rates[(sync, on)])}
            for sync, on in variants]


"""The GPU run's stages (benchmarks/gpu): each takes the run's Context and returns a JSON-able
dict; `holds` is False where a check failed. Models are built once and shared by later stages."""

from __future__ import annotations

import dataclasses
import functools
import json
import random
from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.gpu import checks as gpu_checks
from benchmarks.gpu import prices as gpu_prices


class Context:
    """What the stages share: the arguments, the device, earlier stages' results, loaded models."""

    def __init__(self, args, say, state: dict):
        from dspark_bench.harness.models import resolve_device

        self.args, self.say, self.state = args, say, state
        self.device = resolve_device(args.device)

    @functools.cached_property
    def shipped(self):
        """The shipped pair in fp32: exact greedy identity is an fp32 property."""
        from dspark_bench.harness.models import load_pair

        return load_pair(None, None, str(self.device), "float32")

    @functools.cached_property
    def priced(self):
        """The --size pair with random weights, built on the device."""
        self.say(f"building the {self.args.size} pair ({self.args.price_dtype}) on {self.device}")
        return gpu_prices.build_pair(self.args.size, self.device, self.args.price_dtype)

    def prompts(self, limit: int):
        """The first `limit` prompts (--prompts, else --task's) and their ids for the shipped pair."""
        from dspark_bench.tasks import load_prompts
        from dspark_bench.tasks.prompts import Prompt, encode

        if self.args.prompts:
            lines = [json.loads(line) for line in self.args.prompts.read_text().splitlines() if line.strip()]
            prompts = [Prompt(str(d["id"]), d["text"], d.get("category", "default")) for d in lines[:limit]]
        else:
            prompts, _, _ = load_prompts(self.args.task, None, limit=limit)
        return prompts, [encode(self.shipped.tokenizer, p.text) for p in prompts]

    @property
    def bandwidth(self) -> float:
        """The device's copy bandwidth: the machine stage's, else measured now (a smaller copy)."""
        measured = self.state.get("machine", {}).get("copy_bandwidth_bytes_per_s")
        return measured or gpu_prices.copy_bandwidth(self.device, 64)

    @property
    def priced_context(self) -> list[int]:
        """A context of --context random token ids (random weights: any ids are as good as text)."""
        vocab = self.priced.target.config.vocab_size
        rng = random.Random(0)
        return [rng.randrange(vocab) for _ in range(self.args.context)]


def machine(ctx: Context) -> dict:
    import transformers

    from dspark_bench.results import machine as machine_info

    megabytes = 2048 if ctx.device.type == "cuda" else 64
    bandwidth = gpu_prices.copy_bandwidth(ctx.device, megabytes)
    info = machine_info()
    ctx.say(f"{(info.get('gpu') or {}).get('name') or info.get('cpu')}: copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    return {"machine": info, "device": str(ctx.device), "torch": str(torch.__version__),
            "transformers": transformers.__version__, "cuda": torch.version.cuda,
            "copy_bandwidth_bytes_per_s": bandwidth, "copy_megabytes": megabytes}


def correctness(ctx: Context) -> dict:
    smoke = ctx.args.smoke
    prompts, ids = ctx.prompts(2 if smoke else 3)
    greedy = gpu_checks.greedy_identity(ctx.shipped, ids, 8 if smoke else 32, 2 if smoke else 3)
    ctx.say(f"greedy fp32: {greedy['decodes']} decodes, identical: {greedy['identical']}; captured: "
            f"{greedy['captured']['decodes']} decodes, identical: {greedy['captured']['identical']}")
    bf16 = gpu_checks.bf16_divergence(prompts[:2] if smoke else ctx.prompts(8)[0], str(ctx.device), ctx.say,
                                      8 if smoke else 64)
    sampling = gpu_checks.sampling_chi_square(ctx.device, 600 if smoke else 2000)
    ctx.say(f"sampling: p = {sampling['p_value']:.3f}, a broken rule p = {sampling['broken_rule_p_value']:.2g}")
    return {"greedy": greedy, "bf16": bf16, "sampling": sampling,
            "holds": greedy["identical"] and greedy["captured"]["identical"] and sampling["lossless"]}


def syncs(ctx: Context) -> dict:
    from dspark_bench.config import DecodeConfig

    _, ids = ctx.prompts(1)
    tokens = 16 if ctx.args.smoke else 64
    policies = [DecodeConfig.of(schedule="fixed", gamma_max=4, min_draft_len=0, max_new_tokens=tokens),
                DecodeConfig.of(metric="top1", threshold=0.3, gamma_max=6, min_draft_len=0, max_new_tokens=tokens)]
    rows = gpu_checks.sync_counts(ctx.shipped, ids[0], policies)
    for r in rows:
        ctx.say(f"{r['policy']}: {r['fetches_per_round']:.2f} reads, {r['cuda_syncs_per_round']} CUDA syncs per round")
    return {"rows": rows}


def prices(ctx: Context) -> dict:
    from dspark_bench.measure.cost_model import measure_surface
    from dspark_bench.results import machine as machine_info

    pair, context, args = ctx.priced, ctx.priced_context, ctx.args
    bandwidth = ctx.bandwidth
    needed = gpu_prices.step_bytes(pair.target, len(context))
    eager = gpu_prices.plain_step(pair.target, context, False, 10 if args.smoke else 50)
    bound = needed["bytes"] / bandwidth
    ctx.say(f"plain step eager {eager['seconds'] * 1e3:.2f} ms, bound {bound * 1e3:.2f} ms "
            f"({eager['seconds'] / bound:.2f}×)")
    surface = measure_surface(pair, context, args.gamma, [1, *args.batch_size])
    ctx.say("t_verify(k) at B = 1, ms: " + ", ".join(f"{t * 1e3:.2f}" for t in surface.at(1).t_verify))
    rounds = gpu_prices.round_overheads(pair, context, surface.at(1), sorted({1, args.gamma // 2, args.gamma}),
                                        (8, 24) if args.smoke else (8, 32), 2)
    ctx.say(f"round overhead t_round {rounds['t_round'] * 1e3:.2f} ms")
    # The surface's 1-token pass is the plain step timed another way: where the two disagree by more
    # than a quarter, the prices price nothing our decoder runs (the first H200 run's did: 37.0 ms
    # against 23.6; docs/gpu.md).
    agrees = abs(surface.at(1).t_verify[0] / eager["seconds"] - 1) < 0.25
    slug = device_slug(ctx)
    files = gpu_prices.cost_files(surface, rounds["t_round"], pair, args.size, machine_info(), args.out, slug)
    return {"size": args.size, "dtype": args.price_dtype, "context_tokens": len(context), **needed,
            "bandwidth_bound_s": bound, "eager_step": eager, "surface": surface.to_dict(), "rounds": rounds,
            "files": files, "surface_agrees_with_step": agrees,
            # The dry run's tiny models time at the noise level of a shared CPU: said, not failed on.
            "holds": agrees or args.smoke}


def captured(ctx: Context) -> dict:
    """Batch 1's passes as a decode on CUDA runs them by default (compiled, each length its own
    CUDA graph: decoding/capture.py), timed alone between syncs and inside running decodes
    (measure/pass_clock.py: CUDA events, no sync between passes), beside the draft step's and
    the target step's bandwidth bounds. A stage of its own: a compile or capture failing here
    leaves the eager prices standing."""
    from dspark_bench.config import DecodeConfig
    from dspark_bench.measure.cost_model import measure_cost, torch_version
    from dspark_bench.measure.in_decode import measure_in_decode
    from dspark_bench.replay import cost_file
    from dspark_bench.replay.cost import CostSurface

    args, pair, context, slug = ctx.args, ctx.priced, ctx.priced_context, device_slug(ctx)
    gamma, needed = args.gamma, gpu_prices.step_bytes(pair.target, len(ctx.priced_context))
    alone = measure_cost(pair, context, gamma, compiled=True, drafters=())
    ctx.say("captured t_verify(k) at B = 1, ms: " + ", ".join(f"{t * 1e3:.2f}" for t in alone.t_verify)
            + f"; draft step {alone.t_draft * 1e3:.2f}")
    tokens = 8 if args.smoke else 32
    configs = [DecodeConfig.of(schedule="fixed", gamma_max=g, min_draft_len=0, max_new_tokens=tokens, compiled=True)
               for g in sorted({1, max(gamma // 2, 1), gamma})]
    inside, detail = measure_in_decode(pair, [context], configs, alone)
    ctx.say(f"in decode: t_draft {inside.t_draft * 1e3:.2f} ms, t_verify(γ) {inside.t_verify[-1] * 1e3:.2f} ms, "
            f"round overhead {inside.t_round * 1e3:.2f} ms, plain step {inside.t_plain * 1e3:.2f} ms")
    bandwidth = ctx.bandwidth
    draft_bound = gpu_prices.step_bytes(pair.draft, len(context))["bytes"] / bandwidth
    files = {}
    for name, model, how in (("captured", alone, "compiled passes timed alone between syncs (measure_cost)"),
                             ("in-decode", inside, "compiled passes timed inside running fixed-γ decodes with "
                              "CUDA events (measure/in_decode.py)")):
        path = args.out / f"cost-model-{slug}-{args.size}-{name}.json"
        files[name] = str(cost_file.ours(CostSurface({1: model}), pair, f"benchmarks/gpu prices: {how}",
                                         capture="cuda-graphs" if ctx.device.type == "cuda" else "compiled",
                                         version=torch_version()).save(path))
    return {"alone": alone.to_dict(), "in_decode": inside.to_dict(), "in_decode_detail": detail, "files": files,
            "target_bound_s": needed["bytes"] / bandwidth, "draft_bound_s": draft_bound,
            "target_step_over_bound": alone.t_verify[0] / (needed["bytes"] / bandwidth),
            "draft_step_over_bound": alone.t_draft / draft_bound,
            # verify(8) / verify(1) in tokens fed: a pass of 8 new positions (k = 7) over the 1-token step
            # (of gamma + 1 where gamma is below 7: the dry run's)
            "verify_tokens": min(8, gamma + 1), "verify_8_over_1": alone.t_verify[min(7, gamma)] / alone.t_verify[0]}


def device_slug(ctx: Context) -> str:
    """The device in a file name: "h200" for an NVIDIA H200, else "cuda" or "cpu"."""
    if ctx.device.type != "cuda":
        return ctx.device.type
    name = torch.cuda.get_device_name(ctx.device).lower()
    return next((word for word in name.replace("-", " ").split() if word[0] in "abhlv" and word[1:].isdigit()), "cuda")


def replay(ctx: Context) -> dict:
    from dspark_bench.config import DecodeConfig
    from dspark_bench.measure.cost_model import measure_surface, torch_version
    from dspark_bench.measure.recording import record
    from dspark_bench.replay import cost_file
    from dspark_bench.replay.cost import CostModel
    from dspark_bench.tuning.spec import points
    from dspark_bench.tuning.spec_files import resolve_spec, task_spec

    args, pair = ctx.args, ctx.shipped
    _, ids = ctx.prompts(args.limit)
    N, G = args.max_new_tokens, args.gamma
    ctx.say(f"recording the shipped pair: {len(ids)} {args.task} prompts × {N} tokens, rollouts {G} deep")
    rec = record(SimpleNamespace(target=pair.target, draft=pair.draft, eos_ids=pair.eos_ids), ids, N, G)
    context = ids[0] + rec.continuation[0, : int(rec.lengths[0]) // 2].tolist()
    surface = measure_surface(pair, context, G, [1])
    mine = cost_file.ours(surface, pair, version=torch_version()).save(
        args.out / f"cost-model-{device_slug(ctx)}-shipped-pair.json")
    named = {f"shipped pair, {device_slug(ctx)}": surface.at(1)}
    if args.cpu_prices:
        named["shipped pair, CPU"] = cost_file.load(args.cpu_prices).surface.at(1)
    if "prices" in ctx.state and ctx.state["prices"].get("done"):
        at_one = ctx.state["prices"]["surface"]["batch_sizes"]["1"]
        named[f"{args.size}, {device_slug(ctx)}, eager"] = dataclasses.replace(
            CostModel.from_dict(at_one), t_round=ctx.state["prices"]["rounds"]["t_round"])
    if ctx.state.get("captured", {}).get("done"):
        captured = ctx.state["captured"]
        named[f"{args.size}, {device_slug(ctx)}, captured"] = CostModel.from_dict(captured["alone"])
        named[f"{args.size}, {device_slug(ctx)}, captured in decode"] = CostModel.from_dict(captured["in_decode"])
    spec, _ = resolve_spec(task_spec(args.task), {"task": args.task, "max_new_tokens": N})
    base = DecodeConfig.of(max_new_tokens=N)
    fixed = [base.replace(schedule="fixed", gamma_max=g, min_draft_len=0) for g in range(1, G + 1)]
    deepest = min(len(m.t_verify) - 1 for m in named.values())
    space = [c for c in points(spec, base) if c.stopping.gamma_max <= min(G, deepest)] + fixed[:deepest]
    picks = gpu_prices.replay_picks(rec, space, named)
    for p in picks:
        ctx.say(f"{p['prices']}: {p['pick']} {p['policy']} {p['predicted_speedup']:.3f}×")
    return {"prompts": len(ids), "max_new_tokens": N, "gamma": G, "policies": len(space), "file": mine.name,
            "prices": {name: m.to_dict() for name, m in named.items()}, "picks": picks}


def timed(ctx: Context) -> dict:
    """Timed replay (measure/timed.py) at --size: the shipped pair's rounds for five policies run on
    the random pair's real passes, interleaved with its plain decoding of the same tokens, beside
    replay's prediction on that pair's own prices: the measured speedup of the --size pair with the
    shipped pair's acceptance checks the prices alone."""
    import numpy as np

    from dspark_bench.config import DecodeConfig
    from dspark_bench.measure.cost_model import measure_cost
    from dspark_bench.measure.in_decode import measure_in_decode
    from dspark_bench.measure.recording import record
    from dspark_bench.measure.timed import timed_plain, timed_replay
    from dspark_bench.replay.simulate import simulate, simulate_grid

    args, shipped, pair = ctx.args, ctx.shipped, ctx.priced
    _, ids = ctx.prompts(min(args.limit, 4))  # each policy runs every round at --size: a few prompts
    N, G = args.max_new_tokens, min(args.gamma, 6)
    rec = record(SimpleNamespace(target=shipped.target, draft=shipped.draft, eos_ids=shipped.eos_ids), ids, N, G)
    # The --size pair reads the record's ids (llama-8b-1b's vocabulary holds the shipped pair's). A
    # smaller one (the --smoke dry run) reads them folded into it, EOS ids too: its rounds are then
    # the folded record's, not the shipped pair's (random weights: any ids do for timing).
    vocab = min(pair.target.config.vocab_size, pair.draft.config.vocab_size)
    if max(max(p) for p in ids) >= vocab or int(rec.rollout.max()) >= vocab or int(rec.continuation.max()) >= vocab:
        ids = [[t % vocab for t in p] for p in ids]
        rec = dataclasses.replace(rec, continuation=np.where(rec.continuation >= 0, rec.continuation % vocab, -1),
                                  rollout=np.where(rec.rollout >= 0, rec.rollout % vocab, -1),
                                  eos_ids=tuple(sorted({e % vocab for e in rec.eos_ids})))
    # The passes a decode runs by default there: captured on CUDA (compiled on the dry run's CPU).
    context = ids[0] + rec.continuation[0, : int(rec.lengths[0]) // 2].tolist()
    cost = measure_cost(pair, context, G, compiled=True, drafters=())
    configs = [DecodeConfig.of(schedule="fixed", gamma_max=g, max_new_tokens=N, compiled=True)
               for g in sorted({2, 4, G})]
    configs += [DecodeConfig.of(threshold=t, gamma_max=G, max_new_tokens=N, compiled=True) for t in (0.3, 0.6)]
    inside, _ = measure_in_decode(pair, [context], configs[:3], cost)  # the same passes, priced in decode
    predicted = simulate_grid(rec, configs, cost)["predicted_speedup"].tolist()
    predicted_inside = simulate_grid(rec, configs, inside)["predicted_speedup"].tolist()
    timed_plain(pair, rec, ids, compiled=True)  # warm-ups, untimed: every shape met before a clock runs
    for config in configs:
        timed_replay(pair, rec, ids, config)
    plain, seconds = [], [[] for _ in configs]
    for repeat in range(2 if args.smoke else 3):  # plain and every policy in turn, the order rotated
        order = [-1, *range(len(configs))]
        for index in order[repeat % len(order):] + order[: repeat % len(order)]:
            if index < 0:
                plain.append(sum(t for t, _ in timed_plain(pair, rec, ids, compiled=True)))
            else:
                seconds[index].append(sum(run.seconds for run in timed_replay(pair, rec, ids, configs[index])))
    rows = []
    for config, spent, guess, guess_inside in zip(configs, seconds, predicted, predicted_inside):
        ratios = [p / s for p, s in zip(plain, spent)]  # each repeat's plain over its policy
        measured = float(np.median(ratios))
        rows.append({"policy": config.label(), "predicted_speedup": guess, "measured_speedup": measured,
                     "low": min(ratios), "high": max(ratios), "error": guess / measured - 1,
                     "predicted_in_decode": guess_inside, "error_in_decode": guess_inside / measured - 1,
                     "rounds": sum(len(r) for r in simulate(rec, config))})
        ctx.say(f"timed replay {config.label()}: predicted {guess:.3f}× (in decode {guess_inside:.3f}×), "
                f"measured {measured:.3f}×")
    return {"prompts": len(ids), "max_new_tokens": N, "gamma": G, "cost": cost.to_dict(),
            "cost_in_decode": inside.to_dict(), "rows": rows,
            "within_10pct": sum(abs(r["error"]) <= 0.10 for r in rows),
            "within_10pct_in_decode": sum(abs(r["error_in_decode"]) <= 0.10 for r in rows)}


def compiled(ctx: Context) -> dict:
    pair, context, args = ctx.priced, ctx.priced_context, ctx.args
    step = gpu_prices.plain_step(pair.target, context, True, 10 if args.smoke else 100)
    eager = gpu_prices.plain_step(pair.target, context, False, 10 if args.smoke else 50)  # beside it, same minute
    bound = gpu_prices.step_bytes(pair.target, len(context))["bytes"] / ctx.bandwidth
    ctx.say(f"plain step compiled {step['seconds'] * 1e3:.2f} ms (compile {step['warm_s']:.0f} s), eager "
            f"{eager['seconds'] * 1e3:.2f} ms, bound {bound * 1e3:.2f} ms: {step['seconds'] / bound:.2f}×")
    profiled = gpu_prices.profile_step(pair.target, context, True, 5 if args.smoke else 20,
                                       Path(args.out) / "profile-compiled-step.txt")
    ctx.say("compiled step, heaviest: " + ", ".join(f"{r['name']} {max(r['self_device_ms'], r['self_cpu_ms']):.3f} ms"
                                                    for r in profiled["top_per_step"][:4]))
    return {"compiled_step": step, "eager_step": eager, "bandwidth_bound_s": bound,
            "ratio_compiled": step["seconds"] / bound, "ratio_eager": eager["seconds"] / bound, "profile": profiled}


def batches(ctx: Context) -> dict:
    """verify(k) and the draft step at B = 1 and each --batch-size from the captured passes our
    batched decoder runs by default on CUDA (static batched caches, one CUDA graph per (B, k):
    decoding/static_batch_lm.py), beside the eager surface (the prices stage's)."""
    from dspark_bench.measure.cost_model import measure_surface

    pair, context, args = ctx.priced, ctx.priced_context, ctx.args
    surface = measure_surface(pair, context, args.gamma, args.batch_size, repeats=3 if args.smoke else 10,
                              drafters=(), compiled=True)
    rows = {}
    for b, model in sorted(surface.models.items()):
        rows[str(b)] = {"t_draft": model.t_draft, "t_verify": list(model.t_verify)}
        ctx.say(f"captured B = {b}: t_draft {model.t_draft * 1e3:.2f} ms, t_verify(k) ms: "
                + ", ".join(f"{t * 1e3:.2f}" for t in model.t_verify))
    eager = (ctx.state.get("prices") or {}).get("surface", {}).get("batch_sizes", {})
    return {"size": args.size, "context_tokens": len(context), "captured": rows,
            "eager": {b: eager[b] for b in rows if b in eager}}


def speed(ctx: Context) -> dict:
    from benchmarks.gpu import speed as gpu_speed  # on its stage alone: the other stages need none of it
    from dspark_bench.harness.models import load_pair

    pair = load_pair(None, None, str(ctx.device), ctx.args.dtype)
    rows, folder = gpu_speed.bench_pair(pair, ctx.args, Path(ctx.args.out) / "speed", ctx.say)
    return {"rows": [{"pair": "shipped pair", **row} for row in rows], "run_folder": str(folder)}

"""The GPU run's prices (benchmarks/gpu): a realistic-size pair built on the device, its step
against the memory-bandwidth bound, its cost surface and round overhead as cost-model files, and
the shipped pair's record replayed on those prices.

A pair from benchmarks/gpu/shapes.json is built with random weights (real architecture and
shapes, nothing downloaded): random weights say nothing about acceptance, everything about what
a step, a verify pass over k tokens and a round cost.

The bandwidth bound of a plain decode step (batch 1) is the bytes it must read, over the device's
copy bandwidth: every weight once (the input embedding excepted: a step gathers one row of it,
unless it is tied to the LM head, which reads it whole) and the KV cache at the context length.
The copy bandwidth counts bytes read and written by a device-to-device copy.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

SHAPES = Path(__file__).resolve().parent / "shapes.json"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def shapes(size: str) -> dict:
    table = json.loads(SHAPES.read_text())
    if size not in table or size.startswith("_"):
        raise SystemExit(f"--size {size!r}: choose one of {', '.join(k for k in table if not k.startswith('_'))}")
    return table[size]


def build_model(config: dict, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A model of this config with random weights, made in place on the device in `dtype`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = {k: v for k, v in config.items() if k != "model_type"}
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in dtype: an 8B model in fp32 first would be 32 GB of init
    try:
        with torch.device(device):
            torch.manual_seed(0)
            model = LlamaForCausalLM(LlamaConfig(**fields))
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def resident_bytes(size: str, dtype: str) -> dict:
    """What building `size`'s pair holds in memory: its parameters counted on the meta device
    (nothing allocated)."""
    entry = shapes(size)
    counts = {}
    for role in ("target", "draft"):
        model = build_model(entry[role], torch.device("meta"), DTYPES[dtype])
        counts[f"{role}_params"] = sum(p.numel() for p in model.parameters())
    element = torch.empty(0, dtype=DTYPES[dtype]).element_size()
    return {**counts, "bytes": (counts["target_params"] + counts["draft_params"]) * element}


def build_pair(size: str, device: torch.device, dtype: str):
    """The target and draft of `size`, as a ModelPair (no tokenizer: the prices feed token ids)."""
    from dspark_bench.harness.models import ModelPair

    entry = shapes(size)
    target = build_model(entry["target"], device, DTYPES[dtype])
    draft = build_model(entry["draft"], device, DTYPES[dtype])
    return ModelPair(target, draft, None, f"{size} target (random weights)", f"{size} draft (random weights)",
                     device, DTYPES[dtype])


def copy_bandwidth(device: torch.device, megabytes: int, repeats: int = 20) -> float:
    """Bytes per second a device-to-device copy moves (read + written), median of `repeats`."""
    from dspark_bench.decoding.host import synchronize

    source = torch.empty(megabytes * 2**20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    times = []
    for i in range(repeats + 3):  # three warm-ups
        synchronize(device)
        start = time.perf_counter()
        target.copy_(source)
        synchronize(device)
        if i >= 3:
            times.append(time.perf_counter() - start)
    return 2 * source.numel() / statistics.median(times)


def step_bytes(model: torch.nn.Module, context_tokens: int) -> dict:
    """What one batch-1 decode step must read: weights (the untied input embedding excepted) and KV cache."""
    config = model.config
    size = next(model.parameters()).element_size()
    weights = sum(p.numel() for p in model.parameters())  # a tied embedding counts once: the LM head reads it
    if not config.tie_word_embeddings:
        weights -= model.get_input_embeddings().weight.numel()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * context_tokens
    return {"weight_bytes": weights * size, "kv_bytes": kv * size, "bytes": (weights + kv) * size}


@torch.inference_mode()
def plain_step(model: torch.nn.Module, context: list[int], compiled: bool, repeats: int) -> dict:
    """Our plain decode step (CachedLM.forward of one token, what the baseline runs), the cache
    holding `context`: median seconds. Compiled: the static cache and torch.compile ("reduce-overhead",
    a CUDA graph on CUDA), warmed first."""
    from dspark_bench.decoding.cached_lm import CachedLM
    from dspark_bench.decoding.host import synchronize

    device = next(model.parameters()).device
    lm = CachedLM(model, compiled, len(context) + 8)
    lm.prefill(context[:-1])
    start_compile = time.perf_counter()
    for _ in range(3):  # reduce-overhead records its CUDA graph on the third call
        lm.forward(context[-1:])
        lm.rollback(len(context) - 1)
    synchronize(device)
    warm_s = time.perf_counter() - start_compile
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        lm.forward(context[-1:])
        synchronize(device)
        times.append(time.perf_counter() - start)
        lm.rollback(len(context) - 1)
    return {"seconds": statistics.median(times), "warm_s": warm_s, "repeats": repeats}


@torch.inference_mode()
def profile_step(model: torch.nn.Module, context: list[int], compiled: bool, steps: int, out: Path) -> dict:
    """Where a plain step's time goes (issue 53's "profile the compiled step"): torch.profiler over
    `steps` steps after the warm-ups, its table (by device time on CUDA, else by CPU time) written to
    `out`, the heaviest ops returned. A captured step shows as its graph's replay and, where CUPTI sees
    into graphs, the kernels inside it."""
    from torch.profiler import ProfilerActivity, profile

    from dspark_bench.decoding.cached_lm import CachedLM
    from dspark_bench.decoding.host import synchronize

    device = next(model.parameters()).device
    lm = CachedLM(model, compiled, len(context) + 8)
    lm.prefill(context[:-1])
    for _ in range(3):  # compiled: compile, then record the graph
        lm.forward(context[-1:])
        lm.rollback(len(context) - 1)
    synchronize(device)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            lm.forward(context[-1:])
            lm.rollback(len(context) - 1)
        synchronize(device)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    averages = prof.key_averages()
    out.write_text(averages.table(sort_by=key, row_limit=40))
    rows = sorted(averages, key=lambda e: getattr(e, key, 0.0), reverse=True)
    top = [{"name": e.key, "calls": e.count, "self_device_ms": getattr(e, "self_device_time_total", 0.0) / 1e3 / steps,
            "self_cpu_ms": e.self_cpu_time_total / 1e3 / steps} for e in rows[:12]]
    return {"steps": steps, "sorted_by": key, "table": out.name, "top_per_step": top}


@torch.inference_mode()
def round_overheads(pair, context: list[int], cost, gammas, tokens: tuple[int, int], repeats: int) -> dict:
    """What a round of our decoder costs beyond its draft steps and its verify pass (t_round), at
    batch 1: fixed-gamma decodes of two lengths, the difference of their seconds over the
    difference of their rounds (the prefill and the first steps cancel), less replay's price of the
    same rounds (t_draft per draft forward, t_first_draft per round that drafted, t_verify(k) per
    verify). The median over `gammas`."""
    from dspark_bench.config import DecodeConfig
    from dspark_bench.decoding.host import synchronize
    from dspark_bench.decoding.speculative import speculative_decode

    def decode(config):
        synchronize(pair.device)
        start = time.perf_counter()
        result = speculative_decode(pair.target, pair.draft, context, config, frozenset())  # EOS ignored
        synchronize(pair.device)
        priced = sum(r.draft_forwards * cost.t_draft + cost.t_verify[r.drafted]
                     + (cost.t_first_draft if r.draft_forwards else 0.0) for r in result.rounds)
        return time.perf_counter() - start, len(result.rounds), priced, result

    per_gamma = {}
    for gamma in gammas:
        configs = [DecodeConfig.of(schedule="fixed", gamma_max=gamma, min_draft_len=0, max_new_tokens=n)
                   for n in tokens]
        decode(configs[0])  # warm-up
        runs = {n: [] for n in tokens}
        for _ in range(repeats):  # interleaved
            for n, config in zip(tokens, configs):
                runs[n].append(decode(config))
        short, long = (min(runs[n], key=lambda r: r[0]) for n in tokens)  # the least disturbed of each
        rounds = long[1] - short[1]
        seconds, priced = long[0] - short[0], long[2] - short[2]
        accepted = sum(r.accepted for r in long[3].rounds) / max(long[1], 1)
        per_gamma[gamma] = {"seconds_per_round": seconds / rounds, "priced_per_round": priced / rounds,
                            "overhead_s": (seconds - priced) / rounds, "rounds": rounds,
                            "accepted_per_round": accepted}
    t_round = max(statistics.median(g["overhead_s"] for g in per_gamma.values()), 0.0)
    return {"t_round": t_round, "per_gamma": per_gamma}


def cost_files(surface, t_round: float, pair, size: str, machine: dict, out: Path, slug: str) -> dict:
    """Two cost-model files (docs/engines-and-export.md#cost-model-files) naming the device: batch 1
    with the round overhead, and the surface over every batch size (a file with several batch sizes
    carries no t_round: replay prices that at batch size 1 only)."""
    import dataclasses

    from dspark_bench.replay.cost import CostSurface
    from dspark_bench.replay.cost_file import CostFile, now

    entry = shapes(size)
    models = {"target": pair.target_name, "draft": pair.draft_name, "dtype": str(pair.dtype).removeprefix("torch."),
              "shapes": f"benchmarks/gpu/shapes.json#{size}", "source": entry["source"],
              "target_params": sum(p.numel() for p in pair.target.parameters()),
              "draft_params": sum(p.numel() for p in pair.draft.parameters())}
    measured_by = {"name": "ours", "version": f"torch {torch.__version__}",
              "build": {"device": str(pair.device), "gpu": (machine.get("gpu") or {}).get("name"), "capture": "eager",
                        "context_tokens": surface.at(1).context_tokens}}
    method = ("benchmarks/gpu: interleaved medians of timed forwards with the caches at "
              f"{surface.at(1).context_tokens} tokens (measure/cost_model.py measure_surface); t_round from "
              "fixed-gamma decodes of two lengths less replay's price of their rounds (round_overheads, "
              "benchmarks/gpu/prices.py)")
    at_one = dataclasses.replace(surface.at(1), t_round=t_round)
    paths = {}
    for name, costs in ((f"cost-model-{slug}-{size}.json", CostSurface({1: at_one})),
                        (f"cost-surface-{slug}-{size}.json", surface)):
        paths[name] = str(CostFile(costs, measured_by, models, method, machine, now()).save(out / name))
    return paths


def replay_picks(rec, space, prices: dict) -> list[dict]:
    """For each named cost model: the best policy and the best fixed gamma replay predicts on it."""
    from dspark_bench.replay.simulate import simulate_grid

    rows = []
    for name, cost in prices.items():
        table = simulate_grid(rec, space, cost)
        for kind, part in (("best policy", table[table["schedule"] != "fixed"]),
                           ("best fixed γ", table[table["schedule"] == "fixed"])):
            i = int(part["predicted_speedup"].idxmax())
            rows.append({"prices": name, "pick": kind, "policy": space[i].label(),
                         "predicted_speedup": float(table.loc[i, "predicted_speedup"]),
                         "tokens_per_round": float(table.loc[i, "tokens_per_round"])})
    return rows


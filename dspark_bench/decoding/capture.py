"""Capture: on CUDA every pass after the prefill runs from a captured CUDA graph, by default.

An eager pass on a GPU costs what launching its kernels one by one costs: on an H200 the
8B-shaped plain step took 12.3× its bandwidth bound eager and verify(k) was flat in k
(docs/gpu.md). The engines a user deploys (vLLM, SGLang, TensorRT-LLM) capture their passes in
CUDA graphs, so prices, confirmations and picks made on eager passes describe our loop, not
theirs. So on CUDA a policy the capture path can run decodes through it: the static KV cache and
torch.compile's "reduce-overhead" mode (cached_lm.py), one graph per input length — the draft's
1 and 2 tokens, verify's 1 … gamma_max + 1 — warmed before any clock runs. A batch above 1 does
the same on a static batched cache (static_batch_lm.py): one graph per (B, k), B the batch size.
`--eager` opts out; on a CPU (no graphs) nothing changes unless `--compile` asks for the compiled
path there.

What is not captured runs eagerly and is said so in the run's metadata (`describe`): a drafter
other than the draft model, a model whose cache cannot be static (sliding-window layers).
"""

from __future__ import annotations

import torch

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.cached_lm import static_blocker
from dspark_bench.errors import DsparkError

GRAPHS, EAGER, COMPILED = "cuda-graphs", "eager", "compiled"  # COMPILED: --compile without graphs (a CPU)


def blocker(config: DecodeConfig, models=()) -> str | None:
    """Why this policy's passes cannot be captured (None: they can)."""
    if config.drafting.drafter != "model":
        return f"the {config.drafting.drafter} drafter"
    for model in models:
        why = static_blocker(model)
        if why:
            return why
    return None


def default_on(device: torch.device, eager: bool) -> bool:
    """Whether passes are captured unless a policy cannot be: on CUDA, unless --eager."""
    return device.type == "cuda" and not eager


def captured(configs: list[DecodeConfig], device: torch.device, eager: bool, models=()) -> list[DecodeConfig]:
    """`configs` with the capture path turned on where it is the default and the policy allows it
    (the others as they were: an explicit --compile stays)."""
    if eager and any(c.verification.compiled for c in configs):
        raise DsparkError("--eager and --compile ask for opposite passes: drop one")
    if not default_on(device, eager):
        return list(configs)
    return [c if c.verification.compiled or blocker(c, models) else c.replace(compiled=True) for c in configs]


def priced_captured(configs: list[DecodeConfig], device: torch.device, eager: bool, models=()) -> bool:
    """Whether the passes are priced compiled: when every policy decodes them so here (a space
    mixing in the heads or lookup drafter, which run eagerly, is priced eagerly)."""
    ran = captured(configs, device, eager, models)
    return bool(ran) and all(c.verification.compiled for c in ran)


def pass_mode(compiled: bool, device: torch.device) -> str:
    """How passes run: from CUDA graphs, compiled without graphs (a CPU), or eagerly."""
    if not compiled:
        return EAGER
    return GRAPHS if device.type == "cuda" else COMPILED


def mode_of(config: DecodeConfig, device: torch.device) -> str:
    return pass_mode(config.verification.compiled, device)


def describe(configs: list[DecodeConfig], device: torch.device, eager: bool, models=()) -> dict:
    """The run's metadata: the default on this device, whether --eager was given, how many
    policies ran each way, and why those that ran eagerly under a capturing default did."""
    on = default_on(device, eager)
    modes, because = {}, {}
    for config in configs:
        mode = mode_of(config, device)
        modes[mode] = modes.get(mode, 0) + 1
        why = blocker(config, models) if on and mode == EAGER else None
        if why:
            because[why] = because.get(why, 0) + 1
    return {"default": GRAPHS if device.type == "cuda" else EAGER, "eager_flag": eager,
            "mode": next(iter(modes)) if len(modes) == 1 else ("mixed" if modes else "none"), "policies": modes,
            **({"eager_because": because} if because else {})}


def labelled_as_asked(frame, asked: list[DecodeConfig]):
    """A run's rows (config_id indexing `asked`) under the labels their callers gave them: a
    captured policy runs as `label · compiled`, but the sweep, its confirmations and reports find
    its rows by the label it was asked for (its `compiled` column says how it ran)."""
    if frame is not None and "config_label" in frame:
        frame["config_label"] = [asked[int(i)].label() for i in frame["config_id"]]
    return frame

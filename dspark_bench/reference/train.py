"""Build the offline reference target/draft pair: corpus -> tokenizer -> target -> draft -> export.

Every stage leaves its result in the build folder, and training stages checkpoint
atomically every couple of minutes, so rerunning `build` after a kill resumes where
it stopped instead of starting over.  Time budgets count the seconds of earlier
runs too, so a resumed build still finishes on schedule.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import signal
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import DsparkError
from ..results import atomic_write
from .data import TRAIN_BYTES, stage_corpus, stage_tokenizer
from .export import stage_export

# Shapes, settings and logging are shared by every stage; train's users find them here too.
from .setup import (  # noqa: F401
    CONTEXT,
    DRAFT_SHAPE,
    TARGET_SHAPE,
    Reporter,
    Shape,
    TrainConfig,
    llama_config,
    log,
    n_params,
    next_token_ce,
)
from .tokenizer import VOCAB_SIZE, load_tokenizer

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"

__all__ = ["Shape", "TrainConfig", "batch_at", "build", "default_pair_paths", "info", "llama_config", "main",
           "n_params", "train_model"]


# ---------------------------------------------------------------- training loop


@functools.lru_cache(maxsize=4)
def _epoch_order(seed: int, epoch: int, n_chunks: int) -> tuple[np.ndarray, int]:
    rng = np.random.default_rng([seed, epoch])
    return rng.permutation(n_chunks), int(rng.integers(0, CONTEXT))


def batch_at(tokens: np.ndarray, step: int, batch: int, seq_len: int, seed: int) -> torch.Tensor:
    """The batch for a step, a pure function of the step: resuming needs no data-loader state.

    Each epoch visits every chunk once in a fresh order, with a fresh offset so chunk
    boundaries move between epochs.
    """
    n_chunks = (len(tokens) - CONTEXT) // seq_len
    rows = []
    for i in range(batch):
        g = step * batch + i
        perm, offset = _epoch_order(seed, g // n_chunks, n_chunks)
        start = int(perm[g % n_chunks]) * seq_len + offset
        rows.append(np.asarray(tokens[start:start + seq_len], dtype=np.int64))
    return torch.from_numpy(np.stack(rows))


def lr_at(cfg: TrainConfig, step: int, progress: float) -> float:
    """Linear warm-up by steps, then cosine by progress (0..1) down to min_lr_ratio."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    p = min(max(progress, 0.0), 1.0)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def _optimizer(model, cfg: TrainConfig) -> torch.optim.Optimizer:
    # No weight decay on norms (1-D) — decaying them only fights the normalisation.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
    )


def _distill_loss(logits, ids, teacher, cfg: TrainConfig) -> torch.Tensor:
    # fp32 teacher: on this CPU bf16 autocast makes inference slower, not faster.
    with torch.inference_mode():
        t_logits = teacher(ids).logits
    # Clone outside inference mode: autograd may not save inference tensors.
    t_logp = F.log_softmax(t_logits.float(), dim=-1).clone()
    s_logp = F.log_softmax(logits.float(), dim=-1)
    kl = F.kl_div(s_logp.flatten(0, 1), t_logp.flatten(0, 1), log_target=True, reduction="batchmean")
    return cfg.kl_weight * kl + cfg.ce_weight * next_token_ce(logits, ids)


class _Stop(Exception):
    pass


def train_model(
    stage_dir: Path,
    model_config,
    tokens: np.ndarray,
    budget_s: float,
    cfg: TrainConfig = TrainConfig(),
    teacher=None,
    max_steps: int | None = None,
    stop_at_step: int | None = None,
    name: str = "train",
    init: dict | None = None,
):
    """Train (or resume) one model until its time budget or `max_steps` is used up.

    The LR schedule runs on progress = elapsed/budget (or step/max_steps), so it is
    the same whether the run was interrupted or not.  `stop_at_step` ends this call
    early with a checkpoint, as a kill would: the next call resumes from there.
    `init` (a state dict) starts a fresh run from those weights: continued training, as the
    long-context pair does (reference/long.py); a resumed run reads its checkpoint instead.
    Returns (model, state) where state has step, elapsed_s, tokens_seen, done.
    """
    from transformers import LlamaForCausalLM

    stage_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = stage_dir / "ckpt.pt"
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(model_config)
    if init is not None:
        model.load_state_dict(init)
    opt = _optimizer(model, cfg)
    state = _resume(ckpt_path, model, opt, name)
    if state["done"]:
        return model, state

    def save() -> None:
        atomic_write(ckpt_path, lambda partial: torch.save({
            "model": model.state_dict(), "optimizer": opt.state_dict(),
            "torch_rng": torch.get_rng_state(), "state": dict(state),
            "config": model_config.to_dict(), "train_config": asdict(cfg),
        }, partial))

    model.train()
    if teacher is not None:
        teacher.eval()
    # SIGTERM (kill, nohup shutdown) becomes an exception so the finally-block checkpoints.
    old_handler = install_sigterm()
    try:
        _run_steps(model, opt, cfg, tokens, state, teacher, budget_s, max_steps, stop_at_step, name, save)
    finally:
        save()
        signal.signal(signal.SIGTERM, old_handler)
    log(f"{name}: {'finished' if state['done'] else 'paused'} at step {state['step']}, "
        f"loss {state['loss']:.3f}, {state['tokens_seen']:,} tokens, {state['elapsed_s'] / 60:.1f} min")
    return model, state


def _resume(ckpt_path: Path, model, opt, name: str) -> dict:
    """The training state: a fresh one, or the checkpoint's (loaded into model and optimizer)."""
    if not ckpt_path.exists():
        return {"step": 0, "elapsed_s": 0.0, "tokens_seen": 0, "done": False, "loss": float("nan")}
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    torch.set_rng_state(ckpt["torch_rng"])
    state = ckpt["state"]
    log(f"{name}: resumed at step {state['step']} ({state['elapsed_s'] / 60:.1f} min done)")
    return state


def _run_steps(model, opt, cfg: TrainConfig, tokens, state: dict, teacher, budget_s: float,
               max_steps: int | None, stop_at_step: int | None, name: str, save) -> None:
    """Steps until the budget (or max_steps, or stop_at_step); `state` is updated in place and
    `save()` checkpoints every cfg.ckpt_every_s."""
    def finished() -> bool:
        return state["step"] >= max_steps if max_steps is not None else state["elapsed_s"] >= budget_s

    def progress() -> float:
        return state["step"] / max_steps if max_steps else state["elapsed_s"] / budget_s

    tokens_per_step = cfg.batch_size * cfg.seq_len
    base_elapsed, t0 = state["elapsed_s"], time.perf_counter()
    last_ckpt, ema_loss, rate_t, rate_step = t0, None, t0, state["step"]
    total = float(max_steps) if max_steps else budget_s
    with Reporter(name, total, state["step"] if max_steps else state["elapsed_s"], cfg.log_every_s) as rep:
        while not finished():
            if stop_at_step is not None and state["step"] >= stop_at_step:
                break
            loss = _train_step(model, opt, cfg, tokens, state["step"], progress(), teacher)
            state["step"] += 1
            state["tokens_seen"] += tokens_per_step
            state["elapsed_s"] = base_elapsed + (time.perf_counter() - t0)
            ema_loss = loss if ema_loss is None else 0.95 * ema_loss + 0.05 * loss
            state["loss"] = ema_loss
            now = time.perf_counter()
            tps = (state["step"] - rate_step) * tokens_per_step / max(now - rate_t, 1e-9)
            if now - rate_t > 60:  # tokens/s over roughly the last minute
                rate_t, rate_step = now, state["step"]
            rep.update(state["step"] if max_steps else state["elapsed_s"],
                       f"step {state['step']} loss {ema_loss:.3f} {tps:,.0f} tok/s "
                       f"elapsed {state['elapsed_s'] / 60:.1f}/{budget_s / 60:.1f} min "
                       f"lr {lr_at(cfg, state['step'], progress()):.2e}")
            if now - last_ckpt >= cfg.ckpt_every_s:
                save()
                last_ckpt = now
        state["done"] = finished()


def install_sigterm():
    def handler(signum, frame):
        raise KeyboardInterrupt("SIGTERM")
    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        return signal.getsignal(signal.SIGTERM)


def _train_step(model, opt, cfg: TrainConfig, tokens, step: int, progress: float, teacher) -> float:
    for group in opt.param_groups:
        group["lr"] = lr_at(cfg, step, progress)
    ids = batch_at(tokens, step, cfg.batch_size, cfg.seq_len, cfg.seed)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # ~1.6x faster than fp32 on this CPU
        logits = model(ids).logits
    if teacher is None or progress < cfg.ce_only_fraction:
        loss = next_token_ce(logits, ids)
    else:
        loss = _distill_loss(logits, ids, teacher, cfg)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def _fp16_roundtrip(model):
    """What users get from the shipped fp16 weights, loaded back as fp32."""
    return model.half().float().eval()


def stage_target(out: Path, budget_s: float, cfg: TrainConfig, tokenizer, tokens, **kw):
    model, state = train_model(out / "target", llama_config(TARGET_SHAPE, len(tokenizer),
                                                            tokenizer.eos_token_id),
                               tokens, budget_s, cfg, name="target", **kw)
    return model, state


def stage_draft(out: Path, budget_s: float, cfg: TrainConfig, tokenizer, tokens, teacher, **kw):
    model, state = train_model(out / "draft", llama_config(DRAFT_SHAPE, len(tokenizer),
                                                           tokenizer.eos_token_id),
                               tokens, budget_s, cfg, teacher=teacher, name="draft", **kw)
    return model, state


# ---------------------------------------------------------------- public API


def split_minutes(minutes: float) -> tuple[float, float]:
    """Target gets most of the time; the draft up to 20 minutes (e.g. 105 -> 85 + 20)."""
    draft = min(20.0, 0.2 * minutes)
    return minutes - draft, draft


def build(
    out: Path = Path("build/reference"),
    minutes: float = 100,
    export_to: Path = WEIGHTS_DIR,
    minutes_target: float | None = None,
    minutes_draft: float | None = None,
    cfg_target: TrainConfig | None = None,
    cfg_draft: TrainConfig | None = None,
    byte_budget: dict[str, int] | None = None,
    vocab_size: int = VOCAB_SIZE,
) -> dict:
    """Run (or resume) the whole build and export the pair; returns the reference.json dict."""
    torch.set_num_threads(2)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    split_t, split_d = split_minutes(minutes)
    minutes_t = split_t if minutes_target is None else minutes_target
    minutes_d = split_d if minutes_draft is None else minutes_draft
    cfg_target = cfg_target or TrainConfig()
    cfg_draft = cfg_draft or TrainConfig(lr=2e-3)
    manifest = stage_corpus(out, byte_budget or TRAIN_BYTES)
    counts = stage_tokenizer(out, vocab_size)
    log(f"tokens: {counts}")
    tokenizer = load_tokenizer(out / "tokenizer")
    tokens = np.load(out / "tokens_train.npy")
    target, t_state = stage_target(out, minutes_t * 60, cfg_target, tokenizer, tokens)
    if not t_state["done"]:
        return {"interrupted": "target", **t_state}
    teacher = _fp16_roundtrip(target)  # distil towards the target users will actually load
    for p in teacher.parameters():
        p.requires_grad_(False)
    draft, d_state = stage_draft(out, minutes_d * 60, cfg_draft, tokenizer, tokens, teacher)
    if not d_state["done"]:
        return {"interrupted": "draft", **d_state}
    return stage_export(out, export_to, tokenizer, teacher, draft,
                        {"target": t_state, "draft": d_state}, manifest, counts,
                        {"target": minutes_t, "draft": minutes_d})


def default_heads_path() -> Path:
    """The shipped target's multi-token heads (`dspark-bench models build --heads`)."""
    return WEIGHTS_DIR / "heads"


def default_pair_paths() -> tuple[Path, Path]:
    """(target dir, draft dir) of the shipped reference weights."""
    return WEIGHTS_DIR / "target", WEIGHTS_DIR / "draft"


def info() -> dict:
    """The shipped pair's reference.json; a clear error if the pair was never built."""
    path = WEIGHTS_DIR / "reference.json"
    if not path.exists():
        raise DsparkError(
            f"the reference model pair is not built ({path} is missing); "
            "run `dspark-bench models build` or `python -m dspark_bench.reference.train`"
        )
    report = json.loads(path.read_text())
    # The policy numbers are measured after the build, by `dspark-bench run`, and kept apart.
    policy = WEIGHTS_DIR / "policy.json"
    if policy.exists():
        report["policy"] = json.loads(policy.read_text())
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the offline reference target/draft pair.")
    parser.add_argument("--minutes", type=float, default=100.0, help="total training minutes")
    parser.add_argument("--minutes-target", type=float, default=None)
    parser.add_argument("--minutes-draft", type=float, default=None)
    parser.add_argument("--out", type=Path, default=Path("build/reference"))
    parser.add_argument("--export-to", type=Path, default=WEIGHTS_DIR)
    args = parser.parse_args(argv)
    result = build(args.out, args.minutes, args.export_to, args.minutes_target, args.minutes_draft)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

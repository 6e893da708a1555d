"""Build the offline reference target/draft pair: corpus -> tokenizer -> target -> draft -> export.

Every stage leaves its result in the build folder, and training stages checkpoint
atomically every couple of minutes, so rerunning `build` after a kill resumes where
it stopped instead of starting over.  Time budgets count the seconds of earlier
runs too, so a resumed build still finishes on schedule.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import DsparkError
from . import corpus as corpus_mod
from .tokenizer import EOT, VOCAB_SIZE, load_tokenizer, save_tokenizer, train_tokenizer

CONTEXT = 256
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
MAX_SHIPPED_BYTES = 80 * 1024 * 1024


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    intermediate: int
    heads: int


# Measured on the 2-core CPU (fp32, KV cache, 1/4/8 new tokens): the 16x256 target costs
# about 17/21/22 ms and the 1x192 draft about 1.5-2.4 ms, a ~10x ratio; the target trains
# at ~1,700 tok/s with bf16 autocast, i.e. ~8.5 M tokens in 85 minutes.
TARGET_SHAPE = Shape(layers=16, hidden=256, intermediate=688, heads=4)
DRAFT_SHAPE = Shape(layers=1, hidden=192, intermediate=512, heads=3)

# Training text is a fixed-size, hash-ordered sample of the train split: the full
# install is ~135 MB of text (~40 M tokens), far more than 85 CPU-minutes can see, and
# a sample of ~4 M tokens lets the target make two or more passes.  Prose gets a larger
# share than its natural ~15 % so the pair is useful on English prompts too.
TRAIN_BYTES = {"code": 9_500_000, "prose": 4_000_000, "structured": 400_000}
VAL_TOKENS = 200_000  # per domain, from held-out documents


@dataclass
class TrainConfig:
    batch_size: int = 16
    seq_len: int = CONTEXT
    lr: float = 1.5e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 1234
    ckpt_every_s: float = 120.0
    log_every_s: float = 30.0
    # Distillation (draft only): weight on KL to the teacher and on plain data CE.
    kl_weight: float = 1.0
    ce_weight: float = 0.1
    # The teacher forward costs more than the draft's whole step, so the draft first
    # learns the easy token statistics from data alone, then distils.
    ce_only_fraction: float = 0.25


def llama_config(shape: Shape, vocab_size: int = VOCAB_SIZE, eot_id: int = 0):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=CONTEXT,
        tie_word_embeddings=True,  # halves embedding bytes; matters for the 80 MB cap
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        pad_token_id=eot_id,
    )


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- logging


class Reporter:
    """A rich progress bar on a terminal; a plain log line every `every_s` otherwise."""

    def __init__(self, name: str, total: float, done: float, every_s: float):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.console = Console(stderr=True)
        self.tty = self.console.is_terminal
        self.every_s = every_s
        self.last = 0.0
        self.progress = Progress(
            TextColumn(f"[bold]{name}"), BarColumn(), TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(), console=self.console, disable=not self.tty,
        )
        self.task = self.progress.add_task(name, total=total, completed=done, info="")
        self.name = name

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def update(self, done: float, info: str, force: bool = False) -> None:
        self.progress.update(self.task, completed=done, info=info)
        now = time.monotonic()
        if not self.tty and (force or now - self.last >= self.every_s):
            self.last = now
            log(f"{self.name}: {info}")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- small file helpers


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # a kill mid-write leaves the previous file intact


def _atomic_json(path: Path, obj) -> None:
    _atomic_write_bytes(path, json.dumps(obj, indent=2, sort_keys=True).encode())


def _atomic_torch_save(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _atomic_npy(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, arr)
    os.replace(tmp, path)


# ---------------------------------------------------------------- stage 1: corpus


def _hash_order(key: str) -> bytes:
    return hashlib.sha256(b"order:" + key.encode()).digest()


def select_training_documents(byte_budget: dict[str, int]) -> list[corpus_mod.Document]:
    """A deterministic sample of the train split: documents in hash order up to a budget."""
    chosen = []
    for domain, budget in byte_budget.items():
        docs = sorted(corpus_mod.iter_documents(domain, "train"), key=lambda d: _hash_order(d.key))
        used = 0
        for doc in docs:
            if used >= budget:
                break
            chosen.append(doc)
            used += len(doc.text.encode())
    return chosen


def stage_corpus(out: Path, byte_budget: dict[str, int] = TRAIN_BYTES) -> dict:
    """Write the training sample and held-out texts as JSONL, plus a manifest."""
    manifest_path = out / "corpus_manifest.json"
    if manifest_path.exists():
        return json.loads(manifest_path.read_text())
    log("corpus: reading the local install (stdlib, package sources, docs)")
    train = select_training_documents(byte_budget)
    _write_jsonl(out / "corpus_train.jsonl", train)
    stats = {"train_selected": _domain_stats(train)}
    for domain in corpus_mod.DOMAINS:
        held = sorted(corpus_mod.iter_documents(domain, "heldout"), key=lambda d: _hash_order(d.key))
        _write_jsonl(out / f"corpus_heldout_{domain}.jsonl", held)
        stats[f"heldout_{domain}"] = _domain_stats(held)[domain]
        stats[f"train_all_{domain}"] = _domain_stats(corpus_mod.iter_documents(domain, "train"))[domain]
    manifest = {
        "byte_budget": byte_budget,
        "stats": stats,
        "fingerprints": {f"{d}/{s}": corpus_mod.corpus_fingerprint(d, s)
                         for d in corpus_mod.DOMAINS for s in corpus_mod.SPLITS},
    }
    _atomic_json(manifest_path, manifest)
    log(f"corpus: {json.dumps(stats)}")
    return manifest


def _domain_stats(docs) -> dict:
    stats: dict[str, dict] = {}
    for doc in docs:
        s = stats.setdefault(doc.domain, {"docs": 0, "bytes": 0})
        s["docs"] += 1
        s["bytes"] += len(doc.text.encode())
    return stats


def _write_jsonl(path: Path, docs) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps({"key": doc.key, "domain": doc.domain, "text": doc.text}) + "\n")
    os.replace(tmp, path)


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# ---------------------------------------------------------------- stage 2: tokenizer + token cache


def stage_tokenizer(out: Path, vocab_size: int = VOCAB_SIZE) -> dict:
    """Train the tokenizer on the training sample, then cache token arrays (.npy)."""
    tok_dir = out / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        log("tokenizer: training byte-level BPE")
        texts = [d["text"] for d in _read_jsonl(out / "corpus_train.jsonl")]
        save_tokenizer(train_tokenizer(texts, vocab_size), tok_dir)
    tokenizer = load_tokenizer(tok_dir)
    counts = {}
    train_path = out / "tokens_train.npy"
    if not train_path.exists():
        docs = _read_jsonl(out / "corpus_train.jsonl")
        _atomic_npy(train_path, encode_stream(tokenizer, [d["text"] for d in docs]))
    for domain in corpus_mod.DOMAINS:
        path = out / f"tokens_val_{domain}.npy"
        if not path.exists():
            docs = _read_jsonl(out / f"corpus_heldout_{domain}.jsonl")
            _atomic_npy(path, encode_stream(tokenizer, [d["text"] for d in docs])[:VAL_TOKENS])
        counts[f"val_{domain}"] = int(np.load(path, mmap_mode="r").shape[0])
    counts["train"] = int(np.load(train_path, mmap_mode="r").shape[0])
    return counts


def encode_stream(tokenizer, texts: list[str]) -> np.ndarray:
    """Documents as one packed stream, each preceded by <|endoftext|> as a separator."""
    eot = tokenizer.convert_tokens_to_ids(EOT)
    backend = tokenizer.backend_tokenizer  # the Rust tokenizer: parallel, no length warnings
    parts = []
    for i in range(0, len(texts), 256):
        for enc in backend.encode_batch(texts[i:i + 256], add_special_tokens=False):
            parts.append(np.asarray([eot] + enc.ids, dtype=np.uint16))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


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


def _next_token_ce(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def _distill_loss(logits, ids, teacher, cfg: TrainConfig) -> torch.Tensor:
    # fp32 teacher: on this CPU bf16 autocast makes inference slower, not faster.
    with torch.inference_mode():
        t_logits = teacher(ids).logits
    # Clone outside inference mode: autograd may not save inference tensors.
    t_logp = F.log_softmax(t_logits.float(), dim=-1).clone()
    s_logp = F.log_softmax(logits.float(), dim=-1)
    kl = F.kl_div(s_logp.flatten(0, 1), t_logp.flatten(0, 1), log_target=True, reduction="batchmean")
    return cfg.kl_weight * kl + cfg.ce_weight * _next_token_ce(logits, ids)


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
):
    """Train (or resume) one model until its time budget or `max_steps` is used up.

    The LR schedule runs on progress = elapsed/budget (or step/max_steps), so it is
    the same whether the run was interrupted or not.  `stop_at_step` ends this call
    early with a checkpoint, as a kill would: the next call resumes from there.
    Returns (model, state) where state has step, elapsed_s, tokens_seen, done.
    """
    from transformers import LlamaForCausalLM

    stage_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = stage_dir / "ckpt.pt"
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(model_config)
    opt = _optimizer(model, cfg)
    state = {"step": 0, "elapsed_s": 0.0, "tokens_seen": 0, "done": False, "loss": float("nan")}
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["torch_rng"])
        state = ckpt["state"]
        log(f"{name}: resumed at step {state['step']} ({state['elapsed_s'] / 60:.1f} min done)")
    if state["done"]:
        return model, state

    def save() -> None:
        _atomic_torch_save(ckpt_path, {
            "model": model.state_dict(), "optimizer": opt.state_dict(),
            "torch_rng": torch.get_rng_state(), "state": dict(state),
            "config": model_config.to_dict(), "train_config": asdict(cfg),
        })

    def finished() -> bool:
        if max_steps is not None:
            return state["step"] >= max_steps
        return state["elapsed_s"] >= budget_s

    def progress() -> float:
        return state["step"] / max_steps if max_steps else state["elapsed_s"] / budget_s

    model.train()
    if teacher is not None:
        teacher.eval()
    tokens_per_step = cfg.batch_size * cfg.seq_len
    base_elapsed, t0 = state["elapsed_s"], time.perf_counter()
    last_ckpt, ema_loss, rate_t, rate_step = t0, None, t0, state["step"]
    total = float(max_steps) if max_steps else budget_s
    # SIGTERM (kill, nohup shutdown) becomes an exception so the finally-block checkpoints.
    old_handler = _install_sigterm()
    try:
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
    finally:
        save()
        signal.signal(signal.SIGTERM, old_handler)
    log(f"{name}: {'finished' if state['done'] else 'paused'} at step {state['step']}, "
        f"loss {state['loss']:.3f}, {state['tokens_seen']:,} tokens, {state['elapsed_s'] / 60:.1f} min")
    return model, state


def _install_sigterm():
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
        loss = _next_token_ce(logits, ids)
    else:
        loss = _distill_loss(logits, ids, teacher, cfg)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


# ---------------------------------------------------------------- evaluation


def _windows(tokens: np.ndarray, n: int, seq_len: int = CONTEXT) -> torch.Tensor:
    """n evenly spaced windows: the same positions every time, for comparable numbers."""
    n = max(1, min(n, (len(tokens) - 1) // seq_len))
    starts = np.linspace(0, len(tokens) - seq_len - 1, n).astype(np.int64)
    return torch.from_numpy(np.stack([np.asarray(tokens[s:s + seq_len], dtype=np.int64) for s in starts]))


# Batches of 8 windows: full logits for all windows at once would take ~400 MB.
@torch.inference_mode()
def validation_loss(model, tokens: np.ndarray, n_windows: int = 48, batch: int = 8) -> float:
    model.eval()
    ids = _windows(tokens, n_windows)
    losses = [float(_next_token_ce(model(ids[i:i + batch]).logits, ids[i:i + batch]))
              for i in range(0, len(ids), batch)]
    return float(np.mean(losses))


@torch.inference_mode()
def top1_agreement(draft, target, tokens: np.ndarray, n_windows: int = 48, batch: int = 8) -> float:
    """Share of positions where draft and target pick the same greedy next token."""
    draft.eval()
    target.eval()
    ids = _windows(tokens, n_windows)
    same = [draft(ids[i:i + batch]).logits.argmax(-1) == target(ids[i:i + batch]).logits.argmax(-1)
            for i in range(0, len(ids), batch)]
    return float(torch.cat(same).float().mean())


# ---------------------------------------------------------------- stages 3-5


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


def stage_export(out: Path, export_to: Path, tokenizer, target, draft, states: dict,
                 manifest: dict, counts: dict, minutes: dict) -> dict:
    """fp16 safetensors + tokenizer into complete HF model folders, and reference.json."""
    import transformers
    from transformers import AutoModelForCausalLM

    export_to = Path(export_to)
    for name, model in (("target", target), ("draft", draft)):
        folder = export_to / name
        folder.mkdir(parents=True, exist_ok=True)
        half = _clone_half(model)
        half.config.dtype = torch.float16  # recorded so users know; loading as fp32 still works
        half.generation_config.bos_token_id = tokenizer.eos_token_id
        half.generation_config.eos_token_id = tokenizer.eos_token_id
        half.generation_config.pad_token_id = tokenizer.eos_token_id
        half.save_pretrained(str(folder), safe_serialization=True)
        save_tokenizer(tokenizer, folder)
    # Evaluate what ships, loaded the way a user would, not the in-memory fp32 models.
    shipped = {n: AutoModelForCausalLM.from_pretrained(str(export_to / n), dtype=torch.float32).eval()
               for n in ("target", "draft")}
    val = {d: np.load(out / f"tokens_val_{d}.npy") for d in corpus_mod.DOMAINS}
    report = {
        "models": {n: {**asdict(TARGET_SHAPE if n == "target" else DRAFT_SHAPE),
                       "params": n_params(shipped[n]), "vocab_size": len(tokenizer),
                       "context": CONTEXT,
                       "train_minutes": round(states[n]["elapsed_s"] / 60, 2),
                       "budget_minutes": round(minutes[n], 2),
                       "train_steps": states[n]["step"],
                       "tokens_seen": states[n]["tokens_seen"],
                       "val_loss": {d: round(validation_loss(shipped[n], val[d]), 4) for d in val}}
                   for n in ("target", "draft")},
        "agreement_top1": {d: round(top1_agreement(shipped["draft"], shipped["target"], val[d]), 4)
                           for d in ("code", "prose")},
        "draft_training": "distilled from the target (KL to its softmax + 0.1 data CE)",
        "corpus": {"fingerprints": manifest["fingerprints"], "stats": manifest["stats"],
                   "train_tokens": counts["train"],
                   "val_tokens": {d: counts[f"val_{d}"] for d in corpus_mod.DOMAINS}},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": sys.version.split()[0]},
    }
    _atomic_json(export_to / "reference.json", report)
    size = sum(p.stat().st_size for p in export_to.rglob("*") if p.is_file())
    if size > MAX_SHIPPED_BYTES:
        raise DsparkError(f"shipped reference files are {size / 2**20:.1f} MB, over the 80 MB cap")
    log(f"export: {export_to} ({size / 2**20:.1f} MB); agreement {report['agreement_top1']}")
    return report


def _clone_half(model):
    import copy

    return copy.deepcopy(model).half().eval()


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

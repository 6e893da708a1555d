"""`dspark-bench models build --heads`: train multi-token heads on a frozen target (heads.py).

Only the heads learn: each step runs the target once (no gradient) over a batch of the
reference corpus's training text, and head i learns to predict, from the hidden state at t,
the token at t+1+i. (Self-distillation — the target's own distribution at t+i as the label,
as in Medusa-2 — was tried: in 15 minutes it replayed fewer tokens per round on code than
the corpus's own tokens in 20, 1.48 against 1.64 at fixed γ=4.) The batch is a pure function of the step
(train.batch_at), the heads and
their optimizer are checkpointed every minute and on SIGTERM, and the time budget counts
earlier runs: rerunning the command after a kill resumes. At the end the heads' top-1
accuracy per head is measured on held-out text of each domain, and the heads are written as
a small fp16 file beside the target (or to --export-to).
"""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dspark_bench.decoding import heads as heads_mod
from dspark_bench.errors import DsparkError
from dspark_bench.harness.models import load_tokenizer, model_fingerprint
from dspark_bench.reference import corpus as corpus_mod
from dspark_bench.reference.data import encode_stream, read_jsonl, stage_corpus
from dspark_bench.reference.setup import TRAIN_BYTES, Reporter, log
from dspark_bench.reference.train import WEIGHTS_DIR, batch_at, default_pair_paths, install_sigterm
from dspark_bench.results import atomic_write

HEADS = 4  # k: the longest segment the heads propose
SEQ_LEN, BATCH, LR, SEED = 128, 16, 3e-3, 0
HELD_OUT_TOKENS = 40_000  # per domain, for the accuracy table


def load_target(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    try:
        target = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    except (OSError, ValueError) as err:
        raise DsparkError(f"cannot load the target {str(path)!r}: {str(err).splitlines()[0]}") from None
    for param in target.parameters():
        param.requires_grad_(False)
    return target.eval()


def corpus_tokens(out: Path, tokenizer) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The training sample and held-out text, in the target's own tokens, cached in `out`."""

    stage_corpus(out, TRAIN_BYTES)
    train_path = out / "heads_tokens_train.npy"
    if not train_path.exists():
        docs = read_jsonl(out / "corpus_train.jsonl")
        array = encode_stream(tokenizer, [d["text"] for d in docs])
        atomic_write(train_path, lambda partial: np.save(partial, array))
    held = {}
    for domain in corpus_mod.DOMAINS:
        docs = read_jsonl(out / f"corpus_heldout_{domain}.jsonl")
        held[domain] = encode_stream(tokenizer, [d["text"] for d in docs])[:HELD_OUT_TOKENS]
    return np.load(train_path), held


def heads_loss(heads: heads_mod.Heads, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean over heads of the cross-entropy of head i at t against the token t+1+i."""
    losses = []
    for i, block in enumerate(heads.blocks, start=1):
        h = hidden[:, : ids.shape[1] - 1 - i]
        logits = heads.lm_head(h + F.silu(block(h)))
        losses.append(F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1 + i :].flatten()))
    return torch.stack(losses).mean()


@torch.inference_mode()
def heldout_scores(target, heads: heads_mod.Heads, tokens: np.ndarray) -> tuple[list[float], list[float]]:
    """On held-out text, one target pass per window: top-1 accuracy against the text (the target's
    own next token, then each head's), and how often head i's top-1 at t equals the target's own
    at t+i (what greedy verification accepts, teacher-forced on the text)."""
    k = heads.count
    hits, counts = np.zeros(k + 1), np.zeros(k + 1)
    agree, compared = np.zeros(k), np.zeros(k)
    for start in range(0, len(tokens) - SEQ_LEN, SEQ_LEN):
        ids = torch.from_numpy(np.asarray(tokens[start : start + SEQ_LEN], dtype=np.int64))[None]
        hidden = heads_mod.target_hidden(target, ids)[0]
        own = heads.lm_head(hidden).argmax(-1)  # [T]
        guesses = torch.cat([own[:, None], heads(hidden).argmax(-1)], dim=1)  # [T, 1 + k]
        for i in range(k + 1):
            hits[i] += int((guesses[: SEQ_LEN - 1 - i, i] == ids[0, 1 + i :]).sum())
            counts[i] += SEQ_LEN - 1 - i
            if i:
                agree[i - 1] += int((guesses[: SEQ_LEN - i, i] == own[i:]).sum())
                compared[i - 1] += SEQ_LEN - i
    return (hits / np.maximum(counts, 1)).round(4).tolist(), (agree / np.maximum(compared, 1)).round(4).tolist()


def build_heads(out: Path = Path("build/heads"), minutes: float = 15.0, count: int = HEADS,
                target_path: Path | None = None, export_to: Path | None = None, progress=None) -> dict:
    """Train (or resume) the heads for `minutes` in all, then measure and export them."""

    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    target_path = Path(target_path or default_pair_paths()[0])
    export_to = Path(export_to or (WEIGHTS_DIR / "heads"))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    target = load_target(target_path)
    tokens, held = corpus_tokens(out, load_tokenizer(str(target_path)))
    heads, state = train_heads(target, tokens, out, minutes * 60, count)
    scores = {domain: heldout_scores(target, heads, values) for domain, values in held.items()}
    accuracy = {domain: top1 for domain, (top1, _) in scores.items()}
    agreement = {domain: agrees for domain, (_, agrees) in scores.items()}
    info = {"target_path": str(target_path), "target": heads_mod.target_identity(target),
            "target_fingerprint": model_fingerprint(target), "train_minutes":
            round(state["elapsed_s"] / 60, 2), "steps": state["step"], "tokens_seen": state["tokens_seen"],
            "loss": round(state["loss"], 4), "heldout_top1": accuracy, "heldout_agreement": agreement,
            "heldout_top1_columns": ["target next token"] + [f"head {i} (+{i + 1})" for i in range(1, count + 1)]}
    heads_mod.save(heads, export_to, info)
    log(f"heads: wrote {export_to} (held-out top-1 per head: {accuracy})")
    return info


def train_heads(target, tokens: np.ndarray, out: Path, budget_s: float, count: int = HEADS,
                max_steps: int | None = None) -> tuple[heads_mod.Heads, dict]:
    """Train (or resume, from out/heads_ckpt.pt) `count` heads on `target` until `budget_s`
    seconds of training in all (or `max_steps`); returns the heads and the training state."""
    heads = heads_mod.Heads(target.get_output_embeddings().weight.shape[1], count).attach(target)
    opt = torch.optim.AdamW(heads.parameters(), lr=LR, weight_decay=0.0)
    ckpt = out / "heads_ckpt.pt"
    state = {"step": 0, "elapsed_s": 0.0, "tokens_seen": 0, "loss": math.nan}
    if ckpt.exists():
        saved = torch.load(ckpt, map_location="cpu", weights_only=False)
        if saved["count"] != count:
            raise DsparkError(f"{ckpt} holds {saved['count']} heads, not {count}: use another --out")
        heads.load_state_dict(saved["heads"])
        opt.load_state_dict(saved["optimizer"])
        state = saved["state"]
        log(f"heads: resumed at step {state['step']} ({state['elapsed_s'] / 60:.1f} min done)")

    def save() -> None:
        atomic_write(ckpt, lambda partial: torch.save(
            {"heads": heads.state_dict(), "optimizer": opt.state_dict(), "state": dict(state), "count": count},
            partial))

    old_handler = install_sigterm()
    try:
        train_steps(target, heads, opt, tokens, state, budget_s, save, max_steps)
    finally:
        save()
        signal.signal(signal.SIGTERM, old_handler)
    return heads, state


def train_steps(target, heads: heads_mod.Heads, opt, tokens: np.ndarray, state: dict, budget: float, save,
                max_steps: int | None = None) -> None:
    base, t0, last_save = state["elapsed_s"], time.perf_counter(), time.perf_counter()
    with Reporter("heads", budget, state["elapsed_s"], 30.0) as rep:
        while state["elapsed_s"] < budget and (max_steps is None or state["step"] < max_steps):
            progress = state["elapsed_s"] / budget
            for group in opt.param_groups:  # cosine to a tenth of the rate, by time spent
                group["lr"] = LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
            ids = batch_at(tokens, state["step"], BATCH, SEQ_LEN, SEED)
            # fp32: bf16 autocast ran 5-40x slower on a CPU without bf16 units (an AMD EPYC here).
            with torch.no_grad():
                hidden = heads_mod.target_hidden(target, ids)
            loss = heads_loss(heads, hidden, ids)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            state["step"] += 1
            state["tokens_seen"] += ids.numel()
            value = loss.item()
            state["loss"] = value if math.isnan(state["loss"]) else 0.95 * state["loss"] + 0.05 * value
            state["elapsed_s"] = base + time.perf_counter() - t0
            rep.update(state["elapsed_s"], f"step {state['step']} loss {state['loss']:.3f}")
            if time.perf_counter() - last_save > 60:
                save()
                last_save = time.perf_counter()

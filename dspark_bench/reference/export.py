"""Evaluation of the trained pair, and build stage 5: fp16 Hugging Face folders plus
reference.json (sizes, losses, agreement, corpus fingerprints) for what ships."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from dspark_bench.errors import DsparkError
from dspark_bench.results import write_text

from . import corpus as corpus_mod
from .setup import CONTEXT, DRAFT_SHAPE, MAX_SHIPPED_BYTES, TARGET_SHAPE, log, n_params, next_token_ce
from .tokenizer import save_tokenizer

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
    losses = [float(next_token_ce(model(ids[i:i + batch]).logits, ids[i:i + batch]))
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
    write_text(export_to / "reference.json", json.dumps(report, indent=2, sort_keys=True))
    size = sum(p.stat().st_size for p in export_to.rglob("*") if p.is_file())
    if size > MAX_SHIPPED_BYTES:
        raise DsparkError(f"shipped reference files are {size / 2**20:.1f} MB, over the 80 MB cap")
    log(f"export: {export_to} ({size / 2**20:.1f} MB); agreement {report['agreement_top1']}")
    return report


def _clone_half(model):
    import copy

    return copy.deepcopy(model).half().eval()

"""Replay's record: one greedy decoding pass, kept so that every policy can be simulated from it.

For every prompt: the target's greedy continuation and, at every position of it, the draft's own
greedy rollout of `gamma_record` tokens with every confidence metric (see replay.py for why
that fixes every greedy policy's rounds). Saved as record.npz + record.json (with the models'
and prompts' fingerprints and how it was made) and refused for other models or prompts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import DynamicCache

from dspark_bench import confidence
from dspark_bench.baselines import autoregressive_decode
from dspark_bench.cache import _forward_kwargs
from dspark_bench.config import DecodeConfig
from dspark_bench.errors import DsparkError
from dspark_bench.results import provenance


@dataclass
class Record:
    """Arrays over prompts p, positions j (tokens generated so far) and rollout steps k."""

    continuation: np.ndarray  # [P, N] target greedy tokens, -1 past the end
    lengths: np.ndarray  # [P] tokens in each continuation (EOS included)
    rollout: np.ndarray  # [P, N, G] the draft's greedy proposal at step k from position j
    confidences: dict[str, np.ndarray]  # metric -> [P, N, G] confidence of that proposal
    eos_ids: tuple[int, ...]
    info: dict  # max_new_tokens, gamma_record, topk, fingerprints, prompt ids and categories

    @property
    def max_new_tokens(self) -> int:
        return int(self.info["max_new_tokens"])

    @property
    def gamma_record(self) -> int:
        return self.rollout.shape[2]

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {"continuation": self.continuation, "lengths": self.lengths, "rollout": self.rollout}
        arrays.update({f"confidence_{name}": values for name, values in self.confidences.items()})
        np.savez_compressed(folder / "record.npz", **arrays)
        (folder / "record.json").write_text(json.dumps({**self.info, "eos_ids": list(self.eos_ids)}, indent=2) + "\n")

    @classmethod
    def load(cls, folder: Path) -> "Record":
        folder = Path(folder)
        if not (folder / "record.npz").is_file() or not (folder / "record.json").is_file():
            raise DsparkError(f"{str(folder)!r} holds no replay record (record.npz + record.json)")
        try:
            info = json.loads((folder / "record.json").read_text())
            arrays = np.load(folder / "record.npz")
            confidences = {m: arrays[f"confidence_{m}"] for m in confidence.METRICS}
            return cls(arrays["continuation"], arrays["lengths"], arrays["rollout"], confidences,
                       tuple(info.pop("eos_ids")), info)
        except (OSError, KeyError, ValueError, json.JSONDecodeError) as err:
            raise DsparkError(f"replay record in {str(folder)!r} is unreadable: {err}") from None

    def check_matches(self, models: dict, prompts_fingerprint: str) -> None:
        """Refuse a record made with other models or prompts."""
        for key in ("target_fingerprint", "draft_fingerprint"):
            if self.info["models"].get(key) != models.get(key):
                raise DsparkError(f"replay record was made with another {key.split('_')[0]} model "
                                  f"({self.info['models'].get(key)} vs {models.get(key)}); record again")
        if self.info["prompts_fingerprint"] != prompts_fingerprint:
            raise DsparkError(f"replay record was made with other prompts ({self.info['prompts_fingerprint']} "
                              f"vs {prompts_fingerprint}); record again")


def resolve_record(folder: Path, recorded: str) -> Path | None:
    """A replay record's folder, as a sweep's summary names it: as written (absolute or from the
    sweep's working directory), else in the records/ folder beside the sweep (the default layout)."""
    path = Path(recorded)
    for candidate in (path, folder.parent / "records" / path.name, folder.parent.parent / path):
        if (candidate / "record.npz").is_file():
            return candidate
    return None


# --- recording -------------------------------------------------------------------------------


@torch.inference_mode()
def draft_rollouts(draft: torch.nn.Module, sequence: list[int], prompt_len: int, positions: int, steps: int,
                   topk: int, batch: int = 64):
    """The draft's greedy rollout of `steps` tokens from every position, batched.

    Row j's context is sequence[:prompt_len + j]; rows are left-padded to one length so a
    batch of positions runs together (they are independent).
    """
    device = next(draft.parameters()).device
    cache_name, _ = _forward_kwargs(draft)
    tokens = np.zeros((positions, steps), dtype=np.int64)
    scores = {m: np.zeros((positions, steps), dtype=np.float32) for m in confidence.METRICS}
    for start in range(0, positions, batch):
        rows = [sequence[: prompt_len + j] for j in range(start, min(start + batch, positions))]
        width = max(map(len, rows))
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows], device=device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
        cache = {cache_name: DynamicCache(), "use_cache": True}
        for step in range(steps):
            out = draft(input_ids=ids, attention_mask=mask, position_ids=position_ids, **cache)
            probs = torch.softmax(out.logits[:, -1].float(), dim=-1)
            choice = out.logits[:, -1].argmax(dim=-1)
            tokens[start : start + len(rows), step] = choice.cpu().numpy()
            for name, values in confidence.all_metrics(probs, topk).items():
                scores[name][start : start + len(rows), step] = values.cpu().numpy()
            ids = choice[:, None]
            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
            position_ids = position_ids[:, -1:] + 1
    return tokens, scores


def record(pair, prompt_ids: list[list[int]], max_new_tokens: int, gamma_record: int, topk: int = 5,
           info: dict | None = None, progress=None, eos_ids: frozenset[int] | None = None) -> Record:
    """Record the target's greedy continuation and the draft's rollouts for every prompt.

    `eos_ids` end a sequence (default: the pair's; empty when a run ignores EOS)."""
    eos_ids = pair.eos_ids if eos_ids is None else frozenset(eos_ids)
    config = DecodeConfig(max_new_tokens=max_new_tokens)
    P, N, G = len(prompt_ids), max_new_tokens, gamma_record
    continuation = np.full((P, N), -1, dtype=np.int64)
    lengths = np.zeros(P, dtype=np.int64)
    rollout = np.full((P, N, G), -1, dtype=np.int64)
    scores = {m: np.zeros((P, N, G), dtype=np.float32) for m in confidence.METRICS}
    for p, ids in enumerate(prompt_ids):
        generated = autoregressive_decode(pair.target, ids, config, eos_ids).tokens
        continuation[p, : len(generated)] = generated
        lengths[p] = len(generated)
        tokens, values = draft_rollouts(pair.draft, ids + generated, len(ids), len(generated), G, topk)
        rollout[p, : len(generated)] = tokens
        for name in scores:
            scores[name][p, : len(generated)] = values[name]
        if progress:
            progress()
    meta = {"max_new_tokens": N, "gamma_record": G, "topk": topk, **provenance(), **(info or {}),
            "prompt_tokens": [len(ids) for ids in prompt_ids]}  # what each prefill costs, at batch size B
    return Record(continuation, lengths, rollout, scores, tuple(sorted(eos_ids)), meta)

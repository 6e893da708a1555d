"""Replay's record: one greedy decoding pass, kept so that every policy can be simulated from it.

For every prompt: the target's greedy continuation and, at every position of it, the drafter's
greedy proposal of up to `gamma_record` tokens with every confidence metric (the draft model's
rollout; the heads' segment; the lookup's continuation — `available` says how many it had) (see
replay/simulate.py for why that fixes every greedy policy's rounds). Saved as record.npz +
record.json (with the models' and prompts' fingerprints and how it was made) and refused for
other models or prompts.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import DynamicCache

from dspark_bench.config import DecodeConfig, Drafting
from dspark_bench.decoding import confidence, lookup
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.cached_lm import _forward_kwargs
from dspark_bench.decoding.heads import target_hidden
from dspark_bench.decoding.learned_signal import CONTEXT, agreement
from dspark_bench.errors import DsparkError
from dspark_bench.results import provenance


class RecordBase:
    """What both kinds of replay record share — a greedy `Record` and replay/sampled.py's
    `SampledRecord`: the info they carry (`info`: max_new_tokens, gamma_record, topk,
    fingerprints, the drafter), their rollouts [rows, N, G] (`rollout`), the check against the
    models and prompts in use, and the two files they are saved as (record.npz + record.json,
    read back by `read_files`). A base of the two, not a record itself: a SampledRecord is no
    Record (replay/sampled.py tells the two apart)."""

    @property
    def drafter(self) -> dict:
        """What drafted: {"drafter": ..., "ngram_min": ..., "ngram_max": ...} (the draft model if unsaid)."""
        return {"drafter": "model", "ngram_min": 1, "ngram_max": 3, **self.info.get("drafter", {})}

    @property
    def max_new_tokens(self) -> int:
        return int(self.info["max_new_tokens"])

    @property
    def gamma_record(self) -> int:
        return self.rollout.shape[2]

    def write_files(self, folder: Path, arrays: dict[str, np.ndarray]) -> None:
        """record.npz (`arrays`, the confidences added as confidence_<signal>) and record.json
        (the info, with the EOS ids) in `folder`."""
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {**arrays, **{f"confidence_{name}": values for name, values in self.confidences.items()}}
        np.savez_compressed(folder / "record.npz", **arrays)
        (folder / "record.json").write_text(json.dumps({**self.info, "eos_ids": list(self.eos_ids)}, indent=2) + "\n")

    def check_matches(self, models: dict, prompts_fingerprint: str) -> None:
        """Refuse a record made with other models or prompts."""
        recorded = dict(self.info["models"])
        if self.drafter["drafter"] == "model":  # a record made before drafters were named: its drafter is the draft
            recorded.setdefault("drafter_fingerprint", recorded.get("draft_fingerprint"))
        keys = ["target_fingerprint", "drafter_fingerprint"] if "drafter_fingerprint" in models else \
            ["target_fingerprint", "draft_fingerprint"]
        for key in keys:
            if recorded.get(key) != models.get(key):
                raise DsparkError(f"replay record was made with another {key.split('_')[0]} model "
                                  f"({self.info['models'].get(key)} vs {models.get(key)}); record again")
        if self.info["prompts_fingerprint"] != prompts_fingerprint:
            raise DsparkError(f"replay record was made with other prompts ({self.info['prompts_fingerprint']} "
                              f"vs {prompts_fingerprint}); record again")


@dataclass
class Record(RecordBase):
    """Arrays over prompts p, positions j (tokens generated so far) and rollout steps k."""

    continuation: np.ndarray  # [P, N] target greedy tokens, -1 past the end
    lengths: np.ndarray  # [P] tokens in each continuation (EOS included)
    rollout: np.ndarray  # [P, N, G] the draft's greedy proposal at step k from position j
    # metric -> [P, N, G] confidence of that proposal; a draft model's record also holds the
    # learned signal's context features (learned_signal.CONTEXT) of each proposed token
    confidences: dict[str, np.ndarray]
    eos_ids: tuple[int, ...]
    info: dict  # max_new_tokens, gamma_record, topk, fingerprints, prompt ids and categories, drafter
    available: np.ndarray | None = None  # [P, N] proposals the drafter had at j (None: all G, a draft model)
    # [P, N] how many of the rollout's tokens from j are accepted, where token equality does not
    # say it: a sampled record's replicate (replay/sampled.py), whose coins decide. None: greedy,
    # the rollout against the continuation (simulate.match_lengths).
    matches: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.available is None:
            self.available = np.full(self.rollout.shape[:2], self.rollout.shape[2], dtype=np.int64)

    def save(self, folder: Path) -> None:
        self.write_files(folder, {"continuation": self.continuation, "lengths": self.lengths, "rollout": self.rollout,
                                  "available": self.available})

    @classmethod
    def load(cls, folder: Path) -> Record:
        return read_files(folder, cls.from_files)

    @classmethod
    def from_files(cls, arrays, info: dict) -> Record:
        """The Record of a saved record's open npz `arrays` and its json `info`."""
        confidences = {m: arrays[f"confidence_{m}"] for m in confidence.METRICS}
        confidences.update({m: arrays[f"confidence_{m}"] for m in (*confidence.SIGNALS, *CONTEXT)  # newer records
                            if f"confidence_{m}" in arrays.files})
        available = arrays["available"] if "available" in arrays.files else None  # older records: a draft model
        return cls(arrays["continuation"], arrays["lengths"], arrays["rollout"], confidences,
                   tuple(info.pop("eos_ids")), info, available)


def read_files(folder: Path, build):
    """`build(arrays, info)` of the record saved in `folder`: record.json's info (its "eos_ids"
    still in it) and record.npz's arrays, each file opened once and the npz closed after `build`
    (which reads what it needs from it). A folder without the two files, or a file that does not
    read, is refused in one line."""
    folder = Path(folder)
    if not (folder / "record.npz").is_file() or not (folder / "record.json").is_file():
        raise DsparkError(f"{str(folder)!r} holds no replay record (record.npz + record.json)")
    try:
        info = json.loads((folder / "record.json").read_text())
        with np.load(folder / "record.npz") as arrays:
            return build(arrays, info)
    except (OSError, KeyError, ValueError, json.JSONDecodeError) as err:
        raise DsparkError(f"replay record in {str(folder)!r} is unreadable: {err}") from None


def resolve_record(folder: Path, recorded: str) -> Path | None:
    """A replay record's folder, as a sweep's summary names it: as written (absolute or from the
    sweep's working directory), else in the records/ folder beside the sweep (the default layout)."""
    path = Path(recorded)
    for candidate in (path, folder.parent / "records" / path.name, folder.parent.parent / path):
        if (candidate / "record.npz").is_file():
            return candidate
    return None


# --- recording -------------------------------------------------------------------------------


def greedy_choice(step: int, rows: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """A greedy rollout's token: the draft's most likely one."""
    return logits.argmax(dim=-1)


def softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.float(), dim=-1)


@torch.inference_mode()
def draft_rollouts(draft: torch.nn.Module, sequence: list[int], prompt_len: int, positions: int, steps: int,
                   topk: int, rows: int = 128, choose=greedy_choice, probs_of=softmax):
    """The draft's greedy rollout of `steps` tokens from every position j (context
    sequence[:prompt_len + j]), all positions at once.

    The rollouts are independent and their contexts are prefixes of one sequence, so one
    forward over the sequence gives every position's first proposal and the KV cache they all
    share; each further step feeds one token per position (`rows` positions per pass) under a
    mask that lets position j's token see its own context and its own earlier proposals only —
    a tree of rollouts over one prefix, each exactly what decoding it alone computes.

    `choose(step, positions, logits)` picks each step's tokens and `probs_of(logits)` gives the
    distribution the confidences are read from: greedy by default; a sampled record
    (replay/sampled.py) draws from the processed distribution, its first step from the residual.
    """
    device, dtype = next(draft.parameters()).device, next(draft.parameters()).dtype  # the mask: the model's dtype
    cache_name, can_keep = _forward_kwargs(draft)
    tokens = np.zeros((positions, steps), dtype=np.int64)
    scores = {m: np.zeros((positions, steps), dtype=np.float32) for m in confidence.SIGNALS}
    if positions == 0 or steps == 0:
        return tokens, scores
    prefix = prompt_len + positions - 1  # the longest context a rollout starts from
    cache = DynamicCache()
    keep = {"logits_to_keep": positions} if can_keep else {}  # the LM head over the positions read only
    out = draft(input_ids=torch.tensor([sequence[:prefix]], device=device), **keep,
                **{cache_name: cache, "use_cache": True})
    first = out.logits[0, -positions:]  # position j's first proposal: after sequence[:prompt_len + j]
    for start in range(0, positions, rows):
        js = torch.arange(start, min(start + rows, positions), device=device)
        logits = first[start : start + len(js)]
        for step in range(steps):
            choice = choose(step, js, logits)
            tokens[start : start + len(js), step] = choice.cpu().numpy()
            for name, values in confidence.all_metrics(probs_of(logits), topk).items():
                scores[name][start : start + len(js), step] = values.cpu().numpy()
            if step + 1 < steps:  # feed each position its proposal, at the position it takes
                mask = tree_mask(prompt_len + js, prefix, step + 1, dtype)
                out = draft(input_ids=choice[None], position_ids=(prompt_len + js + step)[None], attention_mask=mask,
                            **{cache_name: cache, "use_cache": True})
                logits = out.logits[0]
        # The next positions' rollouts start from the shared prefix again (a negative crop removes
        # that many tokens, in transformers 4.x and 5.x alike: cached_lm.CachedLM.rollback).
        if steps > 1:
            cache.crop(-(steps - 1) * len(js))
    check_rollout(draft, sequence, prompt_len, positions, tokens, scores["top1"], probs_of)
    return tokens, scores


def tree_mask(context: torch.Tensor, prefix: int, step: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive attention mask [1, 1, R, prefix + step·R] of rollout step `step` for R rows:
    row r sees the shared prefix up to its own context length context[r], and the token it fed
    at each earlier step (block b's column r), nothing else."""
    R = len(context)
    keys = torch.arange(prefix, device=context.device)
    sees = torch.cat([keys[None, :] < context[:, None],
                      torch.eye(R, dtype=torch.bool, device=context.device).repeat(1, step)], dim=1)
    mask = torch.zeros(sees.shape, dtype=dtype, device=context.device)
    return mask.masked_fill_(~sees, torch.finfo(dtype).min)[None, None]


def check_rollout(draft, sequence: list[int], prompt_len: int, positions: int, tokens: np.ndarray,
                  top1: np.ndarray, probs_of=softmax) -> None:
    """Decode the first and the last position's rollout alone and compare: a model that
    ignores a custom attention mask would see other positions' tokens, and its record would be
    wrong. Agreement up to the first different token, where the two must be a near-tie; within
    0.01 in fp32, 0.1 in half precision (bf16 logits move in steps of 1/16 around 20, and the
    two computations take different kernels)."""
    steps = tokens.shape[1]
    tolerance = 1e-2 if next(draft.parameters()).dtype == torch.float32 else 1e-1
    cache_name, can_keep = _forward_kwargs(draft)
    keep = {"logits_to_keep": 1} if can_keep else {}
    device = next(draft.parameters()).device
    for j in sorted({0, positions - 1}):
        cache, ids = DynamicCache(), torch.tensor([sequence[: prompt_len + j]], device=device)
        for k in range(steps):
            logits = draft(input_ids=ids, **keep, **{cache_name: cache, "use_cache": True}).logits[0, -1]
            probs = probs_of(logits)
            if abs(float(probs.max()) - float(top1[j, k])) > tolerance:
                raise DsparkError(f"the draft's batched rollout at position {j} differs from decoding it alone "
                                  f"(confidence {float(top1[j, k]):.4f} vs {float(probs.max()):.4f} at step {k + 1}): "
                                  "this model does not honour a custom 4D attention mask")
            if probs_of is softmax and int(logits.argmax()) != tokens[j, k]:
                break  # a near-tie decided the other way: the rest of the rollout follows another token
            ids = torch.tensor([[int(tokens[j, k])]], device=device)  # the rollout's own token (a sampled one too)


@torch.inference_mode()
def heads_segments(target: torch.nn.Module, heads, sequence: list[int], prompt_len: int, positions: int,
                   steps: int, topk: int):
    """The heads' segment at every position j: read from the target's hidden state at
    sequence[prompt_len + j - 2], the one whose LM head gave the sequence's last token (drafters.py)."""

    count = min(heads.count, steps)
    device = next(target.parameters()).device
    hidden = target_hidden(target, torch.tensor([sequence[: prompt_len + positions - 1]], device=device))[0]
    tokens = np.full((positions, steps), -1, dtype=np.int64)
    scores = {m: np.zeros((positions, steps), dtype=np.float32) for m in confidence.SIGNALS}
    first = max(0, 2 - prompt_len)  # a one-token prompt has no hidden state before its first round
    rows = hidden[prompt_len + first - 2 : prompt_len + positions - 2]
    if len(rows):
        logits = heads(rows, count)  # [rows, count, vocab]
        tokens[first:, :count] = logits.argmax(-1).cpu().numpy()
        for name, values in confidence.all_metrics(torch.softmax(logits.float(), dim=-1), topk).items():
            scores[name][first:, :count] = values.cpu().numpy()
    available = np.full(positions, count, dtype=np.int64)
    available[:first] = 0
    return tokens, scores, available


def lookup_continuations(sequence: list[int], prompt_len: int, positions: int, steps: int, topk: int,
                         ngram_min: int, ngram_max: int, vocab: int):
    """The lookup drafter's proposal at every position j (lookup.py), from sequence[:prompt_len + j]."""

    tokens = np.full((positions, steps), -1, dtype=np.int64)
    scores = {m: np.zeros((positions, steps), dtype=np.float32) for m in confidence.SIGNALS}
    available = np.zeros(positions, dtype=np.int64)
    for j in range(positions):
        proposed, votes = lookup.continuation(sequence[: prompt_len + j], ngram_min, ngram_max, steps)
        available[j] = n = len(proposed)
        tokens[j, :n] = proposed
        for name, values in lookup.scores(votes, vocab, topk).items():
            scores[name][j, :n] = values.numpy()
    return tokens, scores, available


def drafter_proposals(pair, drafter: Drafting, sequence: list[int], prompt_len: int, positions: int, steps: int,
                      topk: int):
    """(tokens [j, k], scores per metric, available [j]) of `drafter.drafter` at every position."""
    if drafter.drafter == "heads":
        return heads_segments(pair.target, pair.heads, sequence, prompt_len, positions, steps, topk)
    if drafter.drafter == "lookup":
        vocab = pair.target.get_output_embeddings().weight.shape[0]
        return lookup_continuations(sequence, prompt_len, positions, steps, topk, drafter.ngram_min,
                                    drafter.ngram_max, vocab)
    tokens, scores = draft_rollouts(pair.draft, sequence, prompt_len, positions, steps, topk)
    scores.update(context_features(sequence, prompt_len, tokens))
    return tokens, scores, np.full(positions, steps, dtype=np.int64)


def context_features(sequence: list[int], prompt_len: int, tokens: np.ndarray) -> dict[str, np.ndarray]:
    """The learned signal's context features (learned_signal.agreement) of every rollout token
    tokens[j, k], after what it was drafted from: sequence[:prompt_len + j] and tokens[j, :k]."""
    positions, steps = tokens.shape
    values = np.zeros((positions, steps, len(CONTEXT)), dtype=np.float32)
    context = np.empty(len(sequence) + steps, dtype=np.int64)
    for j in range(positions):
        start = prompt_len + j
        context[:start] = sequence[:start]
        context[start : start + steps] = tokens[j]
        for k in range(steps):
            values[j, k] = agreement(context[: start + k], tokens[j, k])
    return {name: values[:, :, i] for i, name in enumerate(CONTEXT)}


@dataclass
class PromptRecord:
    """One prompt's share of a record: the target's continuation and the drafter's proposals at
    each of its positions (tokens [j, k], scores per signal, available [j])."""

    generated: list[int]
    tokens: np.ndarray
    scores: dict[str, np.ndarray]
    available: np.ndarray


def record_prompt(pair, drafter: Drafting, ids: list[int], generated: list[int], gamma_record: int,
                  topk: int) -> PromptRecord:
    tokens, scores, available = drafter_proposals(pair, drafter, ids + generated, len(ids), len(generated),
                                                  gamma_record, topk)
    return PromptRecord(list(generated), tokens, scores, available)


def assemble(parts, prompt_ids: list[list[int]], max_new_tokens: int, gamma_record: int, topk: int,
             eos_ids: frozenset[int], drafter: Drafting, info: dict | None = None) -> Record:
    """A Record from every prompt's PromptRecord (an iterable, in the prompts' order)."""
    P, N, G = len(prompt_ids), max_new_tokens, gamma_record
    continuation = np.full((P, N), -1, dtype=np.int64)
    lengths = np.zeros(P, dtype=np.int64)
    rollout = np.full((P, N, G), -1, dtype=np.int64)
    scores = {m: np.zeros((P, N, G), dtype=np.float32) for m in confidence.SIGNALS}
    available = np.zeros((P, N), dtype=np.int64)
    for p, part in enumerate(parts):
        n = len(part.generated)
        continuation[p, :n] = part.generated
        lengths[p] = n
        rollout[p, :n] = part.tokens
        available[p, :n] = part.available
        for name, values in part.scores.items():
            scores.setdefault(name, np.zeros((P, N, G), dtype=np.float32))[p, :n] = values
    meta = {"max_new_tokens": N, "gamma_record": G, "topk": topk, **provenance(), **(info or {}),
            "prompt_tokens": [len(ids) for ids in prompt_ids],  # what each prefill costs, at batch size B
            "drafter": dataclasses.asdict(drafter)}
    return Record(continuation, lengths, rollout, scores, tuple(sorted(eos_ids)), meta, available)


def record(pair, prompt_ids: list[list[int]], max_new_tokens: int, gamma_record: int, topk: int = 5,
           info: dict | None = None, progress=None, eos_ids: frozenset[int] | None = None,
           drafter: Drafting | None = None, continuations: list[list[int]] | None = None) -> Record:
    """Record the target's greedy continuation and the drafter's proposals for every prompt.

    `eos_ids` end a sequence (default: the pair's; empty when a run ignores EOS); `drafter`: a
    config naming the drafter and its knobs (default: the draft model); `continuations`: the
    target's greedy continuations, where another record of the same prompts, or an engine's
    continuations file (replay/continuations.py), has them already."""
    eos_ids = pair.eos_ids if eos_ids is None else frozenset(eos_ids)
    config = DecodeConfig.of(max_new_tokens=max_new_tokens)
    drafter = drafter or Drafting()

    def parts():
        for p, ids in enumerate(prompt_ids):
            generated = (continuations[p] if continuations is not None
                         else autoregressive_decode(pair.target, ids, config, eos_ids).tokens)
            yield record_prompt(pair, drafter, ids, generated, gamma_record, topk)
            if progress:
                progress()

    return assemble(parts(), prompt_ids, max_new_tokens, gamma_record, topk, eos_ids, drafter, info)

"""Making replay's greedy record: the target decoded here (or its continuations taken from an
engine's file) and the drafter's proposals at every position of them, with every confidence metric.

The draft model's rollouts are computed all positions at once (`draft_rollouts`: a tree of
rollouts over one prefix, checked against decoding one alone); the heads' segments from the
target's hidden states (`heads_segments`); the lookup's continuations on the host. What a record
is, how it is saved and read, and how it is simulated are replay's (replay/record.py,
replay/simulate.py).
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import DynamicCache

from dspark_bench.config import DecodeConfig, Drafting
from dspark_bench.decoding import confidence, lookup
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.cached_lm import forward_kwargs
from dspark_bench.decoding.heads import target_hidden
from dspark_bench.decoding.learned_signal import CONTEXT, agreement
from dspark_bench.errors import DsparkError
from dspark_bench.replay.record import PromptRecord, Record, assemble


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
    (measure/sampled_recording.py) draws from the processed distribution, its first step from the residual.
    """
    device, dtype = next(draft.parameters()).device, next(draft.parameters()).dtype  # the mask: the model's dtype
    cache_name, can_keep = forward_kwargs(draft)
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
    cache_name, can_keep = forward_kwargs(draft)
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


def record_prompt(pair, drafter: Drafting, ids: list[int], generated: list[int], gamma_record: int,
                  topk: int) -> PromptRecord:
    tokens, scores, available = drafter_proposals(pair, drafter, ids + generated, len(ids), len(generated),
                                                  gamma_record, topk)
    return PromptRecord(list(generated), tokens, scores, available)


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

"""Confidence signals of the drafter: pure functions of a probability vector.

Each maps probabilities `probs` [..., vocab] to a confidence in [0, 1] [...], 1 meaning the
draft is sure of its next token, so that one threshold range fits every metric.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dspark_bench import schedules
from dspark_bench.config import LEARNED
from dspark_bench.decoding import learned_signal


def top1(probs: torch.Tensor, topk: int = 5) -> torch.Tensor:
    return probs.max(dim=-1).values


def entropy(probs: torch.Tensor, topk: int = 5) -> torch.Tensor:
    # 1 - H(p) / log(V): 1 for a one-hot distribution, 0 for a uniform one.
    h = -(probs * torch.log(probs.clamp_min(1e-12))).sum(dim=-1)
    return (1.0 - h / math.log(probs.shape[-1])).clamp(0.0, 1.0)


def gini(probs: torch.Tensor, topk: int = 5) -> torch.Tensor:
    # Σ p², the complement of the Gini impurity 1 − Σ p²: 1 for a one-hot distribution, 1/V for a
    # uniform one. Like entropy, a pass over the whole vocabulary on the device (no top-k gives it).
    return (probs * probs).sum(dim=-1).clamp(0.0, 1.0)


def topk_mass(probs: torch.Tensor, topk: int = 5) -> torch.Tensor:
    k = min(topk, probs.shape[-1])
    return probs.topk(k, dim=-1).values.sum(dim=-1).clamp(0.0, 1.0)


def margin(probs: torch.Tensor, topk: int = 5) -> torch.Tensor:
    best_two = probs.topk(2, dim=-1).values
    return best_two[..., 0] - best_two[..., 1]


LLAMACPP_TOPK = 10  # llama.cpp's draft sampler keeps its 10 most likely tokens (common/speculative.cpp, top_k = 10)


def llamacpp_top1(probs: torch.Tensor, topk: int = 5) -> torch.Tensor:
    """llama.cpp's draft probability, what --spec-draft-p-min is compared with: the top-1 of the
    draft's 10 most likely tokens, renormalised over those 10 (above `top1`, by a lot where the
    draft is unsure: the rest of the vocabulary's mass is left out)."""
    top = probs.topk(min(LLAMACPP_TOPK, probs.shape[-1]), dim=-1).values
    return top[..., 0] / top.sum(dim=-1)


# The metrics every replay record holds, however old (replay/record.py requires them on loading).
METRICS = {"top1": top1, "entropy": entropy, "topk_mass": topk_mass, "margin": margin}
# What drafters compute and records hold: the metrics, those added since (gini: an older record
# lacks it and is recorded again, tuning/replay_sweep.py), and the engines' own variants of them.
# The metrics a user picks are config.METRICS: these but llamacpp_top1.
SIGNALS = {**METRICS, "gini": gini, "llamacpp_top1": llamacpp_top1}


def signal_of(config) -> str:
    """The signal `config`'s rule compares with its threshold: its metric, except that under
    llama.cpp's rule top1 is llama.cpp's own (so a tuned threshold is its --spec-draft-p-min).
    Goodput is our schedule whatever the rule: it reads its metric's fitted curve."""
    engine_own = (config.stopping.semantics == "llamacpp" and config.stopping.metric == "top1"
                  and not schedules.of(config).cost_aware)
    return "llamacpp_top1" if engine_own else config.stopping.metric


def score(config, probs: torch.Tensor) -> torch.Tensor:
    """The confidence `config`'s rule reads from the drafter's distribution `probs` (not the
    learned signal's: it reads the drafted tokens too, `draft_signals` and `host_scores`)."""
    if config.stopping.metric == LEARNED:
        raise ValueError("the learned signal is scored on the host (draft_signals, host_scores)")
    return SIGNALS[signal_of(config)](probs, config.stopping.topk)


def top_count(topk: int, vocab: int) -> int:
    """How many of the most likely tokens every top-derived signal needs (topk_mass's k, llama.cpp's 10, margin's 2)."""
    return min(max(topk, LLAMACPP_TOPK, 2), vocab)


def draft_signals(config, probs: torch.Tensor) -> torch.Tensor:
    """What the host reads of a draft step to score it [..., 1 or top_count]: the rule's
    confidence, or for the learned signal the probabilities of the draft's most likely tokens
    (one top-k on the device; the host derives the signals it reads from them,
    learned_signal.raw_signals)."""
    if config.stopping.metric == LEARNED:
        signal = learned_signal.load(config.stopping.signal_model)
        return probs.topk(top_count(signal.topk, probs.shape[-1]), dim=-1).values
    return score(config, probs)[..., None]


def host_scores(config, read: list, contexts: list | None, tokens: list[int], steps: list[int]) -> list[float]:
    """Each row's score from what `draft_signals` gave, read on the host ([rows][...]): the
    confidence itself, or the learned signal of the raw signals and of what the lookup says of
    each row's drafted `tokens[i]` after `contexts[i]` (its sequence and its draft so far), at
    0-based draft `steps[i]`. In float64 on the CPU, as replay computes it from the record."""
    if config.stopping.metric != LEARNED:
        return [row[0] for row in read]
    return learned_scores(learned_signal.load(config.stopping.signal_model), read, contexts, tokens, steps)


def learned_scores(signal, read: list, contexts: list, tokens: list[int], steps: list[int]) -> list[float]:
    """`signal` (a LearnedSignal) of each row, from its top probabilities `read` (host_scores')."""
    top = np.array(read, dtype=np.float32)
    return learned_signal.step_scores(signal, top, min(signal.topk, top.shape[1]), min(LLAMACPP_TOPK, top.shape[1]),
                                      contexts, tokens, steps)


def all_metrics(probs: torch.Tensor, topk: int = 5) -> dict[str, torch.Tensor]:
    """Every signal at once (replay records them all): one top-k serves four of them, each the
    very value its own function gives (entropy and gini, full-vocabulary passes, are their own)."""
    V = probs.shape[-1]
    top = probs.topk(top_count(topk, V), dim=-1).values
    return {"top1": top[..., 0], "entropy": entropy(probs),
            "topk_mass": top[..., : min(topk, V)].sum(dim=-1).clamp(0.0, 1.0), "margin": top[..., 0] - top[..., 1],
            "gini": gini(probs), "llamacpp_top1": top[..., 0] / top[..., : min(LLAMACPP_TOPK, V)].sum(dim=-1)}

"""Confidence signals of the drafter: pure functions of a probability vector.

Each maps probabilities `probs` [..., vocab] to a confidence in [0, 1] [...], 1 meaning the
draft is sure of its next token, so that one threshold range fits every metric.
"""

from __future__ import annotations

import math

import torch


def top1(probs: torch.Tensor, topk: int = 5) -> torch.Tensor:
    return probs.max(dim=-1).values


def entropy(probs: torch.Tensor, topk: int = 5) -> torch.Tensor:
    # 1 - H(p) / log(V): 1 for a one-hot distribution, 0 for a uniform one.
    h = -(probs * torch.log(probs.clamp_min(1e-12))).sum(dim=-1)
    return (1.0 - h / math.log(probs.shape[-1])).clamp(0.0, 1.0)


def topk_mass(probs: torch.Tensor, topk: int = 5) -> torch.Tensor:
    k = min(topk, probs.shape[-1])
    return probs.topk(k, dim=-1).values.sum(dim=-1).clamp(0.0, 1.0)


def margin(probs: torch.Tensor, topk: int = 5) -> torch.Tensor:
    best_two = probs.topk(2, dim=-1).values
    return best_two[..., 0] - best_two[..., 1]


METRICS = {"top1": top1, "entropy": entropy, "topk_mass": topk_mass, "margin": margin}


def all_metrics(probs: torch.Tensor, topk: int = 5) -> dict[str, torch.Tensor]:
    """Every metric at once (replay records them all)."""
    return {name: fn(probs, topk) for name, fn in METRICS.items()}

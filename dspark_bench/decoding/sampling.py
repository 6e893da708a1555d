"""Logits to probabilities and token choice, shared by the decoder and the baseline.

Target and draft go through the same `distribution`, so temperature and top-p are applied to
both identically — the rejection rule is only lossless if they are.
"""

from __future__ import annotations

import torch

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.host import fetch


def distribution(logits: torch.Tensor, config: DecodeConfig) -> torch.Tensor:
    """logits [..., vocab] -> the probabilities tokens are drawn from [..., vocab].

    Greedy decoding still needs probabilities for the confidence signal: plain softmax.
    """
    if config.greedy:
        return torch.softmax(logits.float(), dim=-1)
    probs = torch.softmax(logits.float() / config.verification.temperature, dim=-1)
    if config.verification.top_p < 1.0:
        probs = top_p_filter(probs, config.verification.top_p)
    return probs


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p; renormalise."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return kept / kept.sum(dim=-1, keepdim=True)


def make_generator(config: DecodeConfig, device: torch.device | str, seed: int | None = None) -> torch.Generator | None:
    """The sampling generator of one decode, seeded by `seed` (default: the config's)."""
    if config.greedy:
        return None
    return torch.Generator(device=device).manual_seed(config.verification.seed if seed is None else seed)


def pick(logits: torch.Tensor, probs: torch.Tensor | None, config: DecodeConfig, generator) -> torch.Tensor:
    """The next token of each row, left on the device: argmax when greedy, else a draw from `probs`."""
    if config.greedy:
        return logits.argmax(dim=-1)
    return draw(probs, generator)


def draw(probs: torch.Tensor, generator) -> torch.Tensor:
    """One sample from each row of `probs` [..., vocab], without a host sync.

    The exponential race: argmax of p / E with E ~ Exp(1) picks token x with probability p(x).
    It is what torch.multinomial computes for one sample (same generator stream, same token),
    without multinomial's host-side check of the probabilities."""
    race = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / race).argmax(dim=-1)


def choose(logits: torch.Tensor, probs: torch.Tensor, config: DecodeConfig, generator) -> int:
    """The next token as a Python int (one host sync)."""
    return fetch(pick(logits, probs, config, generator))

"""Stopping rules: when does the drafter stop proposing tokens in a round?

The rule is asked about draft position i (1-based) after the token at i was proposed with
confidence c_i. `keeps` says whether that token passes. Under our semantics the token that fails
the rule is DROPPED (the seed's example: confidences 0.9, 0.85, 0.65 at threshold 0.7 give a
draft of length 2), positions <= min_draft_len are always kept, and position gamma_max is the last.

The engines people deploy mean other things by the same knobs (config.semantics), and each is
replayed and run exactly:
  "hf"        HF assisted generation KEEPS the failing token, then stops (0.9, 0.85, 0.65 → 3);
  "llamacpp"  llama.cpp drops it, keeps no position unconditionally, and DISCARDS a draft shorter
              than min_draft_len (--draft-min): that step decodes normally.
The goodput schedule (goodput.py) decides after each token whether to draft the next one, so
its last token stays too, as under "hf".
"""

from __future__ import annotations

import torch

from dspark_bench.config import DecodeConfig


def threshold_at(config: DecodeConfig, position: int) -> float:
    """The confidence a token at this draft position must reach to be kept."""
    if config.schedule == "fixed":
        return 0.0
    if config.schedule == "ramp":
        if config.gamma_max == 1:
            return config.threshold_start
        frac = (position - 1) / (config.gamma_max - 1)
        return config.threshold_start + frac * (config.threshold_end - config.threshold_start)
    return config.threshold  # "threshold" and "cumulative"


def keeps_failing(config: DecodeConfig) -> bool:
    """Whether the token that fails the rule stays in the draft (which then stops)."""
    return config.semantics == "hf" or config.schedule == "goodput"


def forced(config: DecodeConfig) -> int:
    """Draft positions kept whatever their confidence (none under llama.cpp's rule)."""
    return 0 if config.semantics == "llamacpp" else config.min_draft_len


def discards_below(config: DecodeConfig) -> int:
    """A draft shorter than this is thrown away before verification (llama.cpp's --draft-min)."""
    return config.min_draft_len if config.semantics == "llamacpp" else 0


def keeps(config: DecodeConfig, position: int, confidence: float, cumulative: float) -> bool:
    """Whether the token proposed at `position` stays in the draft.

    `cumulative` is the product of the confidences at positions 1..position: the "cumulative"
    schedule stops when that estimate of the whole block surviving drops below the threshold.
    """
    if position <= forced(config):
        return True
    signal = cumulative if config.schedule == "cumulative" else confidence
    return signal >= threshold_at(config, position)


def kept_on_device(config: DecodeConfig, scores: torch.Tensor, tokens: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    """How many of a full draft's n tokens the rule keeps, decided on the device (0-d tensor).

    Verify-side truncation drafts up to the round's limit without stopping and lets this cut the
    block: the same rule as engine.Proposal applies token by token (a failing token dropped, or
    kept under keeps_failing; EOS ends the draft; llama.cpp's discard), in one pass of tensor
    operations, in float64 as the host compares Python floats. `scores` [n], `tokens` [n]."""
    n = scores.shape[0]
    position = torch.arange(1, n + 1, device=scores.device)
    if config.schedule == "goodput":
        from dspark_bench import goodput

        passes = goodput.rule_for(config).continues_on_device(scores)
    else:
        signal = scores.double()
        if config.schedule == "cumulative":
            signal = torch.cumprod(signal, dim=0)
        thresholds = torch.tensor([threshold_at(config, k) for k in range(1, n + 1)], dtype=torch.float64,
                                  device=scores.device)
        passes = signal >= thresholds
    passes = passes | (position <= forced(config))
    leading = passes.long().cumprod(dim=0).sum()  # tokens before the first that fails
    kept = leading + 1 if keeps_failing(config) else leading
    before_eos = (~torch.isin(tokens, eos)).long().cumprod(dim=0).sum()  # tokens before the first EOS
    kept = torch.minimum(torch.minimum(kept, before_eos + 1), torch.tensor(n, device=scores.device))
    return torch.where(kept < discards_below(config), 0, kept)

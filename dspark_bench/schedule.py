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

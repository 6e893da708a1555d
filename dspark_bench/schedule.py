"""Stopping rules: when does the drafter stop proposing tokens in a round?

The rule is asked about draft position i (1-based) after the token at i was proposed with
confidence c_i. `keeps` says whether that token stays in the draft. The token that fails the
rule is DROPPED (the seed's example: confidences 0.9, 0.85, 0.65 at threshold 0.7 give a draft
of length 2), positions <= min_draft_len are always kept, and position gamma_max is the last.
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


def keeps(config: DecodeConfig, position: int, confidence: float, cumulative: float) -> bool:
    """Whether the token proposed at `position` stays in the draft.

    `cumulative` is the product of the confidences at positions 1..position: the "cumulative"
    schedule stops when that estimate of the whole block surviving drops below the threshold.
    """
    if position <= config.min_draft_len:
        return True
    signal = cumulative if config.schedule == "cumulative" else confidence
    return signal >= threshold_at(config, position)


def draft_length(config: DecodeConfig, confidences: list[float], budget: int | None = None) -> tuple[int, str]:
    """Drive the rule with given confidences: the kept draft length and the stop reason.

    A pure helper for tests (the seed's worked example); the engine applies `keeps` as it
    drafts, and replay applies the same rule to recorded confidences in its own vectorised form.
    """
    limit = config.gamma_max if budget is None else min(config.gamma_max, budget)
    cumulative = 1.0
    for position, confidence in enumerate(confidences[:limit], start=1):
        cumulative *= confidence
        if not keeps(config, position, confidence, cumulative):
            return position - 1, "threshold"
    if budget is not None and budget < config.gamma_max and len(confidences) >= limit:
        return limit, "budget"
    return min(len(confidences), limit), "gamma_max"

"""A run's rows, one per sample (a prompt decoded by one policy, timed beside the baseline) and, with
a trace, one per round: the policy's metrics, both sides' times and outputs, and where they part."""

from __future__ import annotations

import numpy as np

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.types import DecodeResult
from dspark_bench.depth import round_depths
from dspark_bench.harness.depth_breakdown import depth_fields
from dspark_bench.metrics import position_acceptance, rates, round_totals, speedup_ratio


def sample_row(result: DecodeResult, config: DecodeConfig) -> dict:
    """Per-sample metrics of one speculative decode."""
    drafted = np.array([r.drafted for r in result.rounds], dtype=np.int64)
    accepted = np.array([r.accepted for r in result.rounds], dtype=np.int64)
    emitted = np.array([r.emitted for r in result.rounds], dtype=np.int64)
    totals = round_totals(drafted, accepted, emitted, [r.stop_reason for r in result.rounds])
    position_drafted, position_accepted = position_acceptance(drafted, accepted, config.stopping.gamma_max)
    new_tokens = len(result.tokens)
    return {
        **totals,
        **rates(totals),
        "new_tokens": new_tokens,
        "target_forwards": result.target_forwards,
        "draft_forwards": result.draft_forwards,
        "target_forwards_per_token": result.target_forwards / new_tokens if new_tokens else np.nan,
        "draft_forwards_per_token": result.draft_forwards / new_tokens if new_tokens else np.nan,
        "position_drafted": position_drafted,
        "position_accepted": position_accepted,
    }


def round_rows(result: DecodeResult, base: dict, prompt_tokens: int) -> list[dict]:
    depths = round_depths(prompt_tokens, [r.emitted for r in result.rounds])  # context tokens as each round starts
    return [
        {**base, "round": i, "depth": int(depth), "drafted": r.drafted, "accepted": r.accepted,
         "emitted": r.emitted, "stop_reason": r.stop_reason, "draft_tokens": r.draft_tokens,
         "confidences": r.confidences, "target_token": r.target_token, "draft_forwards": r.draft_forwards}
        for i, (r, depth) in enumerate(zip(result.rounds, depths))
    ]


def config_columns(config: DecodeConfig, config_id: int) -> dict:
    return {"config_id": config_id, "config_label": config.label(), **config.to_dict()}


def first_divergence(output: list[int], baseline: list[int]) -> int | None:
    """The first position where two outputs differ (a length difference counts); None if equal."""
    if output == baseline:
        return None
    return next((i for i, (a, b) in enumerate(zip(output, baseline)) if a != b), min(len(output), len(baseline)))


def identical_share(output: list[int], baseline: list[int]) -> float:
    """The share of positions where two outputs hold the same token (over the longer one)."""
    longest = max(len(output), len(baseline))
    return sum(a == b for a, b in zip(output, baseline)) / longest if longest else 1.0


def sample_fields(base: dict, spec: DecodeResult, baseline: DecodeResult, config: DecodeConfig, prompt_tokens: int,
                  base_time: float, spec_time: float) -> dict:
    """One sample row: the policy metrics of `spec`, both sides' times and outputs."""
    return {
        **base,
        **sample_row(spec, config),
        "prompt_tokens": prompt_tokens,
        **depth_fields(spec.rounds, prompt_tokens),
        "baseline_new_tokens": len(baseline.tokens),
        "baseline_time_s": float(base_time),
        "spec_time_s": float(spec_time),
        "speedup": float(speedup_ratio(base_time, len(baseline.tokens), spec_time, len(spec.tokens))),
        # Only greedy outputs must be identical; sampled ones differ by design.
        "identical_to_baseline": (spec.tokens == baseline.tokens) if config.greedy else None,
        # Where they part (greedy): in reduced precision a k-token verify pass and k single-token
        # passes, or a batched pass and a single-row one, can round a near-tie differently.
        "first_divergence": first_divergence(spec.tokens, baseline.tokens) if config.greedy else None,
        "identical_share": identical_share(spec.tokens, baseline.tokens) if config.greedy else None,
        "output_ids": spec.tokens,
        "baseline_ids": baseline.tokens,
    }

"""The tables replay's walks become: one row per policy (`grid_table`), and one per policy and
depth bucket (`depth_table`), with predicted speedups where a cost model prices them — each round
and plain decoding's every token at its own depth where the cost model has a depth axis
(CostModel.by_depth; docs/depth.md), with each prompt's prefill on both sides where it timed those.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dspark_bench import schedules
from dspark_bench.config import FIELDS, LEARNED, DecodeConfig
from dspark_bench.depth import DEPTH_LABELS, depth_bucket
from dspark_bench.metrics import rates
from dspark_bench.replay.cost import CostModel
from dspark_bench.replay.record import Record


def learned_everywhere(config: DecodeConfig) -> bool:
    """Every draft step pays the learned signal's host work (t_learned): a learned policy's; a depth
    policy's learned buckets pay it on their own rounds' steps (simulate.simulate_priced)."""
    return config.stopping.metric == LEARNED and not schedules.of(config).by_depth


def record_depths(rec: Record) -> np.ndarray:
    """[P, N] the context depth of a round starting at each position: prompt tokens + j."""
    return prompt_tokens(rec)[:, None] + np.arange(rec.rollout.shape[1])[None, :]


def tables(rec: Record, configs: list[DecodeConfig], cost, counts: np.ndarray, verify: np.ndarray,
            by_depth: np.ndarray, depths: np.ndarray, bucket: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
    """replay.simulate.simulate_grid_by_depth's two tables from its walk's totals (`by_depth[c, b]`:
    rounds, drafted, accepted, full blocks, draft forwards, emitted, verify and draft seconds)."""
    priced = cost is not None and bool(cost.by_depth)
    plain, prefill = (plain_by_depth(rec, cost, depths, bucket), prefill_by_depth(rec, configs, cost)) if priced \
        else (None, None)
    table = grid_table(configs, counts, verify, rec, cost)
    if priced:  # at depth: the draft's seconds and plain decoding's each at its own depth, and the prefills
        step = np.array([cost.t_learned if learned_everywhere(c) else 0.0 for c in configs])  # on the host
        table["predicted_time"] = by_depth[:, :, 7].sum(axis=1) + counts[:, 4] * step + verify + prefill.sum(axis=1)
        table["predicted_baseline_time"] = plain.sum()
        table["predicted_speedup"] = table["predicted_baseline_time"] / table["predicted_time"]
    return table, depth_table(configs, by_depth, plain, cost, prefill)


def grid_table(configs: list[DecodeConfig], counts: np.ndarray, verify: np.ndarray, rec: Record, cost) -> pd.DataFrame:
    tokens = int(rec.lengths.sum())
    totals = {"rounds": counts[:, 0], "drafted_total": counts[:, 1], "accepted_total": counts[:, 2],
              "emitted_total": np.full(len(configs), tokens), "full_blocks": counts[:, 3]}
    knobs = [c.to_dict() for c in configs]
    table = pd.DataFrame({
        "config_id": np.arange(len(configs)), "config_label": [c.label() for c in configs],
        **{name: [k[name] for k in knobs] for name in FIELDS},
        **totals, **rates(totals),
        "draft_forwards": counts[:, 4], "new_tokens": tokens, "draft_forwards_per_token": counts[:, 4] / max(tokens, 1),
    })
    if cost is not None:  # in cost-model seconds; plain decoding takes tokens × its plain step
        step = np.array([cost.draft_step(c.drafting.drafter, learned_everywhere(c)) for c in configs])
        table["predicted_time"] = counts[:, 4] * step + verify  # verify: each round's round_costs()
        table["predicted_speedup"] = cost.speedup(tokens, table["predicted_time"])
    return table


def plain_by_depth(rec: Record, cost: "CostModel", depths: np.ndarray, bucket: np.ndarray) -> np.ndarray:
    """Plain decoding's predicted seconds per depth bucket: every generated token's step at its own
    depth, and each prompt's prefill (CostModel.prefills) in its prompt's bucket. A measured plain
    step (t_plain: an engine's, or ours inside decodes) was measured at the model's own depth
    (context_tokens): its one-token pass follows depth as the axis says, what the step adds past
    that pass does not. (Held flat, it priced plain decoding at a long prompt's depth for a short
    one: llama.cpp's 256-1k prompts read 44-68 % above their measured speedup, its 2k-4k prompts
    up to 25 % below.)"""
    empty = cost.round_costs()[0] - cost.t_verify[0]  # what a round adds past its pass (t_round_empty)
    steps = cost.at_depths(depths)[1][..., 0] - empty  # the one-token pass at each depth
    if cost.t_plain:
        steps = steps + cost.t_plain - (cost.at_depths(np.array([cost.context_tokens]))[1][0, 0] - empty)
    generated = np.arange(depths.shape[1])[None, :] < rec.lengths[:, None]
    decoded = np.bincount(bucket[generated], weights=steps[generated], minlength=len(DEPTH_LABELS))
    return decoded + np.bincount(bucket[:, 0], weights=cost.prefills(prompt_tokens(rec))[0],
                                 minlength=len(DEPTH_LABELS))


def prefill_by_depth(rec: Record, configs: list[DecodeConfig], cost: "CostModel") -> np.ndarray:
    """[C, buckets] each policy's prefill seconds in its prompts' buckets: the target's, and the
    draft model's where it drafts (the heads and the lookup prefill nothing of their own)."""
    target, draft = cost.prefills(prompt_tokens(rec))
    bucket = depth_bucket(prompt_tokens(rec))
    per_bucket = {role: np.bincount(bucket, weights=seconds, minlength=len(DEPTH_LABELS))
                  for role, seconds in (("target", target), ("draft", draft))}
    return np.stack([per_bucket["target"] + (per_bucket["draft"] if c.drafting.drafter == "model" else 0.0)
                     for c in configs])


def prompt_tokens(rec: Record) -> np.ndarray:
    return np.asarray(rec.info.get("prompt_tokens", [0] * len(rec.lengths)), dtype=np.int64)


def depth_table(configs: list[DecodeConfig], by_depth: np.ndarray, plain, cost, prefill=None) -> pd.DataFrame:
    """One row per policy and depth bucket with rounds: the bucket's totals and metrics (and its
    predicted speedup, with a cost model: the bucket's plain time over its rounds' time, the
    prefills of the prompts in the bucket on both sides where the cost model prices them)."""
    c, b = np.nonzero(by_depth[:, :, 0])
    rows = by_depth[c, b]
    totals = {"rounds": rows[:, 0].astype(np.int64), "drafted_total": rows[:, 1].astype(np.int64),
              "accepted_total": rows[:, 2].astype(np.int64), "emitted_total": rows[:, 5].astype(np.int64),
              "full_blocks": rows[:, 3].astype(np.int64)}
    table = pd.DataFrame({"config_id": c, "depth_bucket": np.asarray(DEPTH_LABELS)[b], **totals, **rates(totals),
                          "draft_forwards": rows[:, 4].astype(np.int64)})
    if cost is not None:
        step = np.array([cost.draft_step(x.drafting.drafter, learned_everywhere(x)) for x in configs])
        learned = np.array([cost.t_learned if learned_everywhere(x) else 0.0 for x in configs])
        draft = rows[:, 7] + rows[:, 4] * learned[c] if cost.by_depth else rows[:, 4] * step[c]
        table["predicted_time"] = draft + rows[:, 6] + (prefill[c, b] if prefill is not None else 0.0)
        baseline = plain[b] if plain is not None else table["emitted_total"].to_numpy() * cost.plain_step
        table["predicted_baseline_time"] = baseline
        table["predicted_speedup"] = baseline / table["predicted_time"]
    return table

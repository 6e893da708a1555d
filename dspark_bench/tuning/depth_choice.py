"""The depth-keyed policy a replay sweep proposes, and what its record says by depth (docs/depth.md).

Given the record, a round's outcome depends only on the policy in force where it starts, so the
choice per depth bucket is separable, up to the one round that crosses a bucket's edge: the
search takes, in each bucket, the plain threshold policy (fixed γ being threshold 0) whose rounds
starting there cost the fewest predicted seconds per token they emit, within each family of
policies sharing the metric, min_draft_len and rule semantics; the family whose buckets' best add
up to the least time wins. That is the per-bucket best, not a product of every bucket's choices.
The composed depth policy is then replayed exactly, round by round (`simulate_priced`), so its
prediction is the record's, not the sum assumed in the search.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.depth import DEPTH_LABELS, spans_depth
from dspark_bench.replay.simulate import record_depths, simulate_grid_by_depth, simulate_priced

FAMILY = ["metric", "min_draft_len", "semantics"]  # what a depth policy keeps the same in every bucket


@dataclass
class DepthChoice:
    """What the depth search found: the composed policy and its replayed row, every candidate's
    rows per bucket, and each bucket's choice."""

    config: DecodeConfig
    row: pd.DataFrame  # simulate_grid's columns, one row: the depth policy replayed exactly
    by_depth: pd.DataFrame  # every candidate and the depth policy, per bucket (config_id as in the sweep)
    per_bucket: pd.DataFrame  # the winning family's best policy per bucket


def candidates(configs: list[DecodeConfig]) -> list[int]:
    """The policies a depth policy is made of: batch 1, the draft model, the plain threshold rule
    or fixed γ, drafting early-stop, each row on its own (no quorum)."""
    plain = set(schedules.names(one_threshold=True, cumulative=False, cost_aware=False, by_depth=False))
    return [i for i, c in enumerate(configs)
            if c.batching.batch_size == 1 and c.drafting.drafter == "model" and c.stopping.batch_quorum == 0
            and c.verification.draft_mode == "early-stop" and c.stopping.metric in DEPTH_METRICS
            and (c.stopping.schedule in plain or schedules.of(c).baseline)]


DEPTH_METRICS = ("top1", "entropy", "topk_mass", "margin")  # raw signals; learned and llama.cpp's own not composed


def per_bucket_best(by_depth: pd.DataFrame, configs: list[DecodeConfig]) -> tuple[tuple, pd.DataFrame]:
    """(the winning family, its best candidate per bucket): seconds per emitted token, lowest."""
    rows = by_depth.assign(seconds_per_token=by_depth["predicted_time"] / by_depth["emitted_total"].clip(lower=1))
    knobs = pd.DataFrame([{k: getattr(configs[i].stopping, k) for k in FAMILY} | {
        "fixed": schedules.of(configs[i]).baseline} for i in rows["config_id"]], index=rows.index)
    rows = pd.concat([rows, knobs], axis=1)
    fixed, scheduled = rows[rows["fixed"]], rows[~rows["fixed"]]
    best = None
    for family, members in scheduled.groupby(FAMILY, sort=True):
        pool = pd.concat([members, fixed]).sort_values(["seconds_per_token", "config_id"], kind="stable")
        chosen = pool.groupby("depth_bucket", sort=False).head(1)
        total = chosen["predicted_time"].sum() / chosen["emitted_total"].sum()
        if best is None or total < best[0]:
            best = (total, family, chosen)
    if best is None:  # fixed γ only: the depth policy picks a γ per bucket
        chosen = fixed.sort_values(["seconds_per_token", "config_id"], kind="stable").groupby("depth_bucket").head(1)
        best = (0.0, ("top1", 0, "dspark"), chosen)
    order = {label: i for i, label in enumerate(DEPTH_LABELS)}
    return best[1], best[2].sort_values("depth_bucket", key=lambda s: s.map(order), kind="stable")


def compose(family: tuple, chosen: pd.DataFrame, configs: list[DecodeConfig], base: DecodeConfig) -> DecodeConfig:
    """The depth policy of each bucket's choice: a bucket without rounds takes the next deeper
    bucket's choice (none shallower were seen), the deepest holds beyond."""
    picked = {row.depth_bucket: configs[row.config_id].stopping for row in chosen.itertuples()}
    seen = [label for label in DEPTH_LABELS if label in picked]
    entries = []
    for label in DEPTH_LABELS[: DEPTH_LABELS.index(seen[-1]) + 1]:
        stop = picked.get(label) or picked[next(s for s in seen if DEPTH_LABELS.index(s) > DEPTH_LABELS.index(label))]
        threshold = 0.0 if schedules.of(stop).baseline else stop.threshold
        entries.append(f"{threshold:g}/{stop.gamma_max}")
    metric, min_draft_len, semantics = family
    return base.replace(schedule=schedules.DEPTH, depth_policy=",".join(entries), metric=metric,
                        min_draft_len=min_draft_len, semantics=semantics,
                        gamma_max=max(int(e.split("/")[1]) for e in entries))


def depth_search(rec, configs: list[DecodeConfig], cost) -> DepthChoice | None:
    """The depth-keyed policy of `rec` (a greedy record of the draft model) among `configs`, priced
    on `cost` at each round's depth; None where the record's rounds sit in one bucket or no
    policy can be composed."""
    if not spans_depth(record_depths(rec)[np.arange(rec.rollout.shape[1])[None, :] < rec.lengths[:, None]]):
        return None
    ids = candidates(configs)
    if not ids:
        return None
    _, by_depth = simulate_grid_by_depth(rec, [configs[i] for i in ids], cost)
    by_depth["config_id"] = np.asarray(ids)[by_depth["config_id"].to_numpy()]
    family, chosen = per_bucket_best(by_depth, configs)
    base = configs[ids[0]]
    depth = compose(family, chosen, configs, base)
    row, depth_rows = simulate_priced(rec, depth, cost)
    new_id = len(configs)
    row = row.assign(config_id=new_id)
    depth_rows = depth_rows.assign(config_id=new_id)
    return DepthChoice(depth, row, pd.concat([by_depth, depth_rows], ignore_index=True), chosen)


def depth_summary(choice: DepthChoice, table: pd.DataFrame, configs: list[DecodeConfig], rec, cost) -> dict:
    """summary.json's "depth_search": each bucket's choice, and per bucket the depth policy beside
    the best single policy and the best fixed γ (each bucket's metrics and predicted speedup); the
    best by measured speedup where the sweep timed them, else by replay's prediction (`ranked_by`)."""
    table = table[(table["batch_size"] == 1) & (table["drafter"] == "model")]  # where the depth policy runs
    timed = "speedup" in table and table["speedup"].notna().any()
    column = "speedup" if timed else "predicted_speedup"
    ranked = table.dropna(subset=[column]).sort_values(column, ascending=False, kind="stable")
    single = ranked[~schedules.where(ranked, by_depth=True) & ~schedules.where(ranked, baseline=True)]
    best_single = single["config_id"].iloc[0]
    best_fixed = ranked[schedules.where(ranked, baseline=True)]["config_id"].iloc[0]
    shown = ["depth_bucket", "rounds", "emitted_total", "tokens_per_round", "acceptance_rate", "avg_draft_len",
             "predicted_speedup"]

    def buckets(config_id: int) -> list[dict]:
        rows = choice.by_depth[choice.by_depth["config_id"] == config_id]
        if rows.empty:  # not a candidate (a cost-aware or learned policy): its buckets replayed now
            rows = simulate_grid_by_depth(rec, [configs[config_id]], cost)[1]
        return rows[[c for c in shown if c in rows]].to_dict(orient="records")

    labels = dict(zip(table["config_id"], table["config_label"]))
    return {
        "buckets": [b for b in DEPTH_LABELS if b in set(choice.by_depth["depth_bucket"])],
        "per_bucket_best": [{"depth_bucket": r.depth_bucket, "config_label": labels[r.config_id],
                             "threshold": 0.0 if schedules.of(configs[r.config_id]).baseline
                             else configs[r.config_id].stopping.threshold,
                             "gamma_max": configs[r.config_id].stopping.gamma_max,
                             "predicted_speedup": float(r.predicted_speedup)} for r in choice.per_bucket.itertuples()],
        "depth_policy": {"config_label": choice.config.label(), "buckets": buckets(int(choice.row["config_id"][0]))},
        "best_single": {"config_label": labels[best_single], "buckets": buckets(int(best_single))},
        "best_fixed": {"config_label": labels[best_fixed], "buckets": buckets(int(best_fixed))},
        "ranked_by": column,
    }


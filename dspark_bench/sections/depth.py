"""A sweep's depth search (summary.json's `depth_search` and `depth_verdict`): the depth-keyed
policy a replay sweep proposes, what its record says by depth (docs/depth.md), and how the console
and the report say it. Figure 14 is drawn by reporting/depth_tables.py from this section's result.

Given the record, a round's outcome depends only on the policy in force where it starts, so the
choice per depth bucket is separable, up to the one round that crosses a bucket's edge: the
search takes, in each bucket, the policy of any family a depth policy's entry may run (threshold
and cumulative rules, goodput, fixed γ; on any metric, the learned signal's too) whose rounds
starting there cost the fewest predicted seconds per token they emit, among the policies of one
rule semantics (the entries share it); the semantics whose buckets' best add up to the least time
wins. That is the per-bucket best, not a product of every bucket's choices.
The composed depth policy is then replayed exactly, round by round (`simulate_priced`), so its
prediction is the record's, not the sum assumed in the search.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.depth import DEPTH_LABELS, DepthEntry, spans_depth
from dspark_bench.harness.verdicts import same_work_verdict
from dspark_bench.paired import compare
from dspark_bench.replay.simulate import record_depths, simulate_grid_by_depth, simulate_priced
from dspark_bench.results import write_parquet
from dspark_bench.sections.base import BY_DEPTH, UNDER_HEADLINE, Line, ReportView, Rows, cell, known

FILE = "depth.parquet"  # every depth candidate's replayed totals per depth bucket


@dataclass
class DepthChoice:
    """What the depth search found: the composed policy and its replayed row, every candidate's
    rows per bucket, and each bucket's choice."""

    config: DecodeConfig
    row: pd.DataFrame  # simulate_grid's columns, one row: the depth policy replayed exactly
    by_depth: pd.DataFrame  # every candidate and the depth policy, per bucket (config_id as in the sweep)
    per_bucket: pd.DataFrame  # the winning family's best policy per bucket


def candidates(configs: list[DecodeConfig]) -> list[int]:
    """The policies a depth policy is made of: batch 1, the draft model, drafting early-stop, each
    row on its own (no quorum), of any family a depth policy's entry may run (schedules.ENTRY_SCHEDULES:
    threshold and cumulative rules, goodput, fixed γ; on any metric, the learned signal's included)."""
    return [i for i, c in enumerate(configs)
            if c.batching.batch_size == 1 and c.drafting.drafter == "model" and c.stopping.batch_quorum == 0
            and c.verification.draft_mode == "early-stop" and c.stopping.schedule in schedules.ENTRY_SCHEDULES]


def per_bucket_best(by_depth: pd.DataFrame, configs: list[DecodeConfig]) -> tuple[str, pd.DataFrame]:
    """(the rule semantics, its best candidate per bucket): seconds per emitted token, lowest, among
    the policies of one semantics (a depth policy's entries share it) and fixed γ; the semantics
    whose buckets' best add up to the least time wins."""
    rows = by_depth.assign(seconds_per_token=by_depth["predicted_time"] / by_depth["emitted_total"].clip(lower=1))
    rows["semantics"] = [configs[i].stopping.semantics for i in rows["config_id"]]
    fixed = rows["config_id"].map(lambda i: schedules.of(configs[i]).baseline)
    best, kinds = None, sorted(set(rows.loc[~fixed, "semantics"])) or sorted(set(rows["semantics"]))  # fixed γ alone
    for semantics in kinds:
        pool = rows[fixed | (rows["semantics"] == semantics)]
        chosen = pool.sort_values(["seconds_per_token", "config_id"], kind="stable").groupby("depth_bucket").head(1)
        total = chosen["predicted_time"].sum() / chosen["emitted_total"].sum()
        if best is None or total < best[0]:
            best = (total, semantics, chosen)
    order = {label: i for i, label in enumerate(DEPTH_LABELS)}
    return best[1], best[2].sort_values("depth_bucket", key=lambda s: s.map(order), kind="stable")


def compose(semantics: str, chosen: pd.DataFrame, configs: list[DecodeConfig], base: DecodeConfig) -> DecodeConfig:
    """The depth policy of each bucket's choice: a bucket without rounds takes the next deeper
    bucket's choice (none shallower were seen), the deepest holds beyond. The shallowest choice's
    metric and min_draft_len are the policy's own; an entry of a threshold rule with both is written
    threshold/γ_max, any other names its family (depth.DepthEntry)."""
    picked = {row.depth_bucket: configs[row.config_id] for row in chosen.itertuples()}
    seen = [label for label in DEPTH_LABELS if label in picked]
    order = DEPTH_LABELS[: DEPTH_LABELS.index(seen[-1]) + 1]
    stops = [(picked.get(label) or picked[next(s for s in seen if DEPTH_LABELS.index(s) > DEPTH_LABELS.index(label))])
             .stopping for label in order]
    own = stops[0]
    entries = [entry_text(s, own) for s in stops]
    files = {name: next((getattr(s, name) for s in stops if getattr(s, name)), "")
             for name in ("signal_model", "goodput_model")}  # the one of the sweep that its learned and goodput read
    return base.replace(schedule=schedules.DEPTH, depth_policy=",".join(entries), metric=own.metric,
                        min_draft_len=own.min_draft_len, semantics=semantics,
                        gamma_max=max(s.gamma_max for s in stops), **files)


def entry_text(stop, own) -> str:
    """A bucket's entry for its choice `stop` (a StoppingPolicy) in a depth policy whose own metric and
    min_draft_len are `own`'s, as DepthEntry writes it."""
    if (stop.schedule, stop.metric, stop.min_draft_len) == (schedules.THRESHOLD, own.metric, own.min_draft_len):
        return DepthEntry(stop.threshold, stop.gamma_max).text()
    threshold = stop.threshold if schedules.of(stop).one_threshold else 0  # fixed γ and goodput read none
    return DepthEntry(threshold, stop.gamma_max, stop.metric, stop.schedule, stop.min_draft_len).text()


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
    semantics, chosen = per_bucket_best(by_depth, configs)
    depth = compose(semantics, chosen, configs, configs[ids[0]])
    row, depth_rows = simulate_priced(rec, depth, cost)
    new_id = len(configs)
    row = row.assign(config_id=new_id)
    depth_rows = depth_rows.assign(config_id=new_id)
    return DepthChoice(depth, row, pd.concat([by_depth, depth_rows], ignore_index=True), chosen)


def every_family(rec, configs: list[DecodeConfig], cost) -> dict | None:
    """The most keying by depth could win in replay's prices over every family the sweep searched
    (budget rules, ramps and the engines' controllers at batch 1 too, which no depth policy's entry
    runs; learned, goodput and cumulative rules, every metric and min_draft_len): in each bucket the
    batch-1 draft-model policy whose rounds starting there cost the fewest predicted seconds per
    token, at the best single policy's (by prediction) tokens in that bucket, against that policy.
    A bound, not a policy: each bucket's best whatever its family, every round as the bucket it
    starts in says (docs/depth.md#a-policy-keyed-by-depth)."""
    ids = [i for i, c in enumerate(configs) if c.batching.batch_size == 1 and c.drafting.drafter == "model"
           and c.stopping.batch_quorum == 0 and c.verification.draft_mode == "early-stop"
           and not schedules.of(c).by_depth]
    if not ids:
        return None
    grid, by_depth = simulate_grid_by_depth(rec, [configs[i] for i in ids], cost)
    single = int(grid.sort_values(["predicted_speedup", "config_id"], ascending=[False, True],
                                  kind="stable")["config_id"].iloc[0])
    rows = by_depth.assign(per_token=by_depth["predicted_time"] / by_depth["emitted_total"].clip(lower=1))
    best = rows.sort_values(["per_token", "config_id"], kind="stable").groupby("depth_bucket", sort=False).head(1)
    best = best.set_index("depth_bucket")
    mine = rows[rows["config_id"] == single]
    per_bucket, bound = [], 0.0
    for bucket in (b for b in DEPTH_LABELS if b in set(mine["depth_bucket"])):
        own = mine[mine["depth_bucket"] == bucket].iloc[0]
        there = best.loc[bucket]
        seconds = float(there["per_token"] * own["emitted_total"])
        bound += seconds
        per_bucket.append({"depth_bucket": bucket, "config_label": configs[ids[int(there["config_id"])]].label(),
                           "predicted_speedup": float(own["predicted_baseline_time"] / seconds),
                           "best_single_there": float(own["predicted_speedup"])})
    baseline, spent = float(mine["predicted_baseline_time"].sum()), float(mine["predicted_time"].sum())
    return {"bound_speedup": baseline / bound, "gain": spent / bound - 1, "per_bucket": per_bucket,
            "best_single": {"config_label": configs[ids[single]].label(), "predicted_speedup": baseline / spent}}


def threshold_of(config: DecodeConfig) -> float | None:
    """The threshold a bucket's choice reads: 0 for a fixed γ, none for a rule without one (goodput)."""
    if schedules.of(config).baseline:
        return 0.0
    return config.stopping.threshold if schedules.of(config).one_threshold else None


def depth_search_of(choice: DepthChoice, table: pd.DataFrame, configs: list[DecodeConfig], rec, cost) -> DepthSearch:
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
    return DepthSearch(
        buckets=[b for b in DEPTH_LABELS if b in set(choice.by_depth["depth_bucket"])],
        per_bucket_best=[{"depth_bucket": r.depth_bucket, "config_label": labels[r.config_id],
                          "threshold": threshold_of(configs[r.config_id]),
                          "gamma_max": configs[r.config_id].stopping.gamma_max,
                          "predicted_speedup": float(r.predicted_speedup)} for r in choice.per_bucket.itertuples()],
        depth_policy={"config_label": choice.config.label(), "buckets": buckets(int(choice.row["config_id"][0]))},
        best_single={"config_label": labels[best_single], "buckets": buckets(int(best_single))},
        best_fixed={"config_label": labels[best_fixed], "buckets": buckets(int(best_fixed))},
        ranked_by=column, every_family=every_family(rec, configs, cost))



def join_depth_policy(folder: Path, configs: list[DecodeConfig], table: pd.DataFrame, rec, cost,
                      ours=None) -> tuple[list[DecodeConfig], pd.DataFrame, DepthChoice | None]:
    """The depth-keyed policy joins the space where the draft model's greedy record `rec` spans
    more than one depth bucket: its row in the table (`ours`: our decoder's batch-1 cost model,
    where an engine's `cost` prices the ranking), every candidate's rows per bucket in depth.parquet."""
    if rec is None or rec.info.get("sampling") is not None:  # sampled replicates: not searched by depth yet
        return configs, table, None
    depth = depth_search(rec, configs, cost)
    if depth is None:
        return configs, table, None
    row = depth.row.assign(source="replay")
    if ours is not None:  # what our decoder, which confirms, is predicted to measure
        row["predicted_speedup_ours"] = simulate_priced(rec, depth.config, ours)[0]["predicted_speedup"]
    write_parquet(folder / FILE, depth.by_depth)
    return configs + [depth.config], pd.concat([table, row], ignore_index=True), depth


def depth_verdict(table: pd.DataFrame, samples: pd.DataFrame, same_work: dict | None) -> dict | None:
    """The depth policy against the best single scheduled policy, both timed at batch 1, paired on
    the same prompts (`same_work`: the confirmation's config ids timed as one); None where either
    was not timed."""
    timed = table[(table["batch_size"] == 1) & table["speedup"].notna()] if "speedup" in table else table.iloc[:0]
    depth = timed[schedules.where(timed, by_depth=True)]
    single = timed[~schedules.where(timed, by_depth=True) & ~schedules.where(timed, baseline=True)]
    if depth.empty or single.empty:
        return None
    best = single.sort_values("speedup", ascending=False, kind="stable").iloc[0]
    mine, theirs = int(depth["config_id"].iloc[0]), int(best["config_id"])
    shared = {int(k): int(v) for k, v in (same_work or {}).items()}
    mine, theirs = shared.get(mine, mine), shared.get(theirs, theirs)
    labels = (depth["config_label"].iloc[0], best["config_label"])
    if mine == theirs:
        return same_work_verdict(*labels)
    return compare(samples[samples["config_id"] == mine], samples[samples["config_id"] == theirs], *labels).to_dict()


def _upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]


def _number(value, digits: int = 3) -> str:
    return "—" if value is None or pd.isna(value) else f"{value:.{digits}f}"


def _speedup(row) -> str:
    if pd.isna(row.get("speedup")):
        return "—"
    return f"{row['speedup']:.2f}× [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]"


@dataclass(frozen=True)
class DepthSearch:
    """The section: each bucket's choice, and the depth policy, the best single policy and the best
    fixed γ per bucket (depth_search_of), with the paired verdict of the first two where both were timed."""

    KEYS: ClassVar[tuple[str, ...]] = ("depth_search", "depth_verdict")
    ABSENT: ClassVar[dict] = {}  # a sweep that searched nothing by depth says nothing of it
    CONSOLE_AT: ClassVar[int] = UNDER_HEADLINE
    REPORT_AT: ClassVar[str] = BY_DEPTH

    buckets: list
    per_bucket_best: list
    depth_policy: dict
    best_single: dict
    best_fixed: dict
    ranked_by: str
    every_family: dict | None = None  # `every_family`: what keying by depth could win over every family, a bound
    verdict: dict | None = None

    @classmethod
    def from_json(cls, summary: dict) -> DepthSearch | None:
        search = summary.get("depth_search")
        return cls(**known(cls, search), verdict=summary.get("depth_verdict")) if search else None

    def to_json(self) -> dict:
        search = {"buckets": self.buckets, "per_bucket_best": self.per_bucket_best, "depth_policy": self.depth_policy,
                  "best_single": self.best_single, "best_fixed": self.best_fixed, "ranked_by": self.ranked_by}
        if self.every_family is not None:  # a summary written before the bound reads back as it was
            search["every_family"] = self.every_family
        return {"depth_search": search,
                "depth_verdict": self.verdict}

    def console(self) -> list:
        """Each bucket's best policy (predicted), then the depth policy composed of them against the
        best single policy, paired on the same prompts."""
        rows = [[b["depth_bucket"], b["config_label"], cell(b["predicted_speedup"])] for b in self.per_bucket_best]
        said = self.verdict["sentence"] if self.verdict else (
            f"{self.depth_policy['config_label']}: no paired verdict (nothing timed with --confirm-top 0: replay's "
            "answer alone)")
        return [Rows("by context depth: each bucket's best policy (replayed, its rounds there priced at their depth)",
                     ("depth", "best policy there", "predicted"), rows, left=("depth", "best policy there")),
                Line(f"depth policy vs best single policy, paired on the same prompts: {said}", "bold"),
                *([Line(self.bound_sentence())] if self.every_family else [])]

    def bound_sentence(self) -> str:
        """`every_family` in words: the most keying by depth could win over every family."""
        bound = self.every_family
        picks = "; ".join(f"{b['depth_bucket']} {b['config_label']}" for b in bound["per_bucket"])
        single = bound["best_single"]
        return (f"keyed by depth over every family (learned, goodput, budget included), replay's bound: "
                f"{bound['bound_speedup']:.3f}× against the best single policy's {single['predicted_speedup']:.3f}× "
                f"({single['config_label']}), {bound['gain']:+.1%} at most ({picks})")

    @classmethod
    def report_blocks(cls, found: dict[str, DepthSearch], view: ReportView) -> list[tuple]:
        """The search in words: each bucket's best policy beside the best single policy there, the
        composed depth policy, and its paired verdict against the best single policy."""
        if not found:
            return []
        lines, words = [], []
        for run_id, search in found.items():
            run = [view.short(run_id)] if view.several else []
            single = {b["depth_bucket"]: b for b in search.best_single["buckets"]}
            lines += [[*run, b["depth_bucket"], b["config_label"], _number(b["threshold"], 2), str(b["gamma_max"]),
                       _number(b["predicted_speedup"]),
                       _number(single.get(b["depth_bucket"], {}).get("predicted_speedup"))]
                      for b in search.per_bucket_best]
            label = search.depth_policy["config_label"]
            row, whole = view.policy(run_id, label), ""
            if row is not None:
                measured = _speedup(row)
                whole = (f": predicted {_number(row.get('predicted_speedup'), 2)}× over the whole workload"
                         + ("" if measured == "—" else f", measured {measured}"))
            words.append((f"{view.short(run_id)}: " if view.several else "")
                         + f"Each bucket's best composed into the depth policy {label}{whole}; best single policy "
                         f"{search.best_single['config_label']}. "
                         + (f"Depth policy vs best single policy, paired on the same prompts: "
                            f"{search.verdict['sentence']}." if search.verdict
                            else "The two were not both timed, so no paired verdict.")
                         + (f" {_upper_first(search.bound_sentence())}." if search.every_family else ""))
        return [("p", "The depth search (summary.json's `depth_search`): in each depth bucket, the policy of any "
                      "family a depth policy's entry runs (threshold and cumulative rules, goodput, fixed γ) whose "
                      "rounds starting there cost the fewest predicted seconds per token, beside the best single "
                      "policy's prediction over the same bucket (threshold —: a rule without one). " + " ".join(words)),
                ("table", [*(["run"] if view.several else []), "depth", "best policy there", "threshold", "γ_max",
                           "predicted there", "best single policy there"], lines)]

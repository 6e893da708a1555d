"""A replay sweep's confirmation: time the best policies of each kind, each kind's work once,
and say how the best scheduled one compares with the best fixed γ on the same prompts.

Policies whose replayed rounds are identical do the same work (a threshold that never binds is
fixed γ): they are recognised on the record before any clock runs, timed once, and every one
of them gets that measurement, labelled with the policy it shares it with.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from dspark_bench import schedules
from dspark_bench.config import LEARNED, DecodeConfig
from dspark_bench.decoding import controllers
from dspark_bench.decoding.rules import bucket_policies
from dspark_bench.harness.runner import another_pass, run, stage_steps
from dspark_bench.harness.verdicts import judge
from dspark_bench.metrics import summarize
from dspark_bench.objectives import OBJECTIVES, rank
from dspark_bench.replay.simulate import simulate

if TYPE_CHECKING:
    from dspark_bench.harness.runner import StageProgress
    from dspark_bench.tuning.spec import SweepSpec

MEASURED = ["speedup", "speedup_low", "speedup_high", "baseline_tokens_per_s", "spec_tokens_per_s",
            "baseline_mean_new_tokens", "spec_mean_new_tokens", "identical_to_baseline",
            "spec_latency_per_token_s", "baseline_latency_per_token_s", "layout"]


def chosen_kinds(ranked: pd.DataFrame, top: int, shipped: dict | None = None) -> list[pd.DataFrame]:
    """What `confirm` times of one batch size's and drafter's policies, ranked best first: `top`
    policies in all (`--confirm-top`) — the best, then the best of each kind the headroom compares
    that is not yet among them (a per-row rule on the learned signal, each cost-aware schedule), then the next best —
    and beside them the depth policy where there is one, each engine controller tuned (its best) and at its
    engine's defaults (`shipped`: a controller policy's config id -> its defaults') with our best beside
    them (sections/controllers.py sets them side by side), and the best fixed γ: the reference every
    verdict is paired against."""
    baseline = schedules.where(ranked, baseline=True)
    # The depth policy, where a sweep composed one, is timed beside the `top` single policies (its
    # verdict is against the best of them: sections/depth.py), whatever --confirm-top leaves out.
    depth = ranked[schedules.where(ranked, by_depth=True)].head(1)
    scheduled = ranked[~baseline & ~schedules.where(ranked, by_depth=True)]
    per_row = scheduled[~schedules.where(scheduled, cost_aware=True)]
    kinds = [per_row[per_row["metric"] == LEARNED],  # a stopping rule on the learned signal
             *(scheduled[scheduled["schedule"] == name] for name in schedules.names(cost_aware=True))]
    leaders = pd.concat([scheduled.head(1), *(kind.head(1) for kind in kinds), scheduled])
    tuned = ranked[schedules.where(ranked, controlled=True)].drop_duplicates("schedule")
    defaults = [(shipped or {}).get(int(i)) for i in tuned["config_id"]]
    ours = scheduled[~schedules.where(scheduled, controlled=True)].head(1 if len(tuned) else 0)  # beside them
    engines = [tuned, ranked[ranked["config_id"].isin([i for i in defaults if i is not None])], ours]
    return [leaders.drop_duplicates("config_id").head(top), depth, *engines, ranked[baseline].head(1)]


def work_of(config: DecodeConfig, records: dict) -> tuple:
    """What timing a policy measures: its batch size, whether its draft steps pay for the learned
    signal (a depth policy's: in each bucket), and its rounds on every prompt (drafted, accepted,
    draft forwards) as replay walks them. Rounds that depend on the whole batch (a quorum, the budget
    or a controller at B > 1) are its own."""
    batch_wide = schedules.of(config).whole_batch or schedules.of(config).controlled  # one decision for every row
    if config.stopping.batch_quorum > 0 or (batch_wide and config.batching.batch_size > 1):
        return ("batch-dependent", config)
    rounds = simulate(records[config.drafting], config)
    learned = tuple(dict.fromkeys(p.stopping.metric == LEARNED for p in bucket_policies(config))) \
        if schedules.of(config).by_depth else (config.stopping.metric == LEARNED,)  # (True,): every step pays it
    return (config.batching.batch_size, learned, config.drafting,
            tuple(tuple((r.drafted, r.accepted, r.draft_forwards) for r in prompt) for prompt in rounds))


def same_work(ids: list[int], configs: list[DecodeConfig], records: dict) -> dict[int, int]:
    """Each chosen policy -> the chosen policy it shares its timing with: the first doing the same
    work, a fixed γ before any other (it is what the others are compared with)."""
    work = {i: work_of(configs[i], records) for i in ids}
    first: dict[tuple, int] = {}
    for i in sorted(ids, key=lambda i: not schedules.of(configs[i]).baseline):
        first.setdefault(work[i], i)
    return {i: first[work[i]] for i in ids}


def confirm(table: pd.DataFrame, configs: list[DecodeConfig], records: dict, spec: SweepSpec, prepared,
            progress: StageProgress | None = None, repeats: int | None = None, say=None):
    """Time the best `confirm_top` policies (chosen_kinds: the best of each kind among them) and
    the best fixed gamma (by the replay's ranking), `repeats`
    interleaved pairs each (default: the spec's), each kind of work once, on `prepared`'s models and
    prompts (preparation.LoadedSweep). Returns the table with
    their measured columns, their samples, and the paired verdicts (with the precision loop's
    account where the spec sets a precision target)."""

    objective = OBJECTIVES[spec.objective[0]]
    ranked = rank(table, objective.name, objective.column("replay"))
    # Per batch size (which policy wins depends on what a step costs at B) and drafter: each kind
    # the headroom compares.
    shipped = {i: configs.index(controllers.shipped(c)) for i, c in enumerate(configs) if schedules.of(c).controlled
               and controllers.shipped(c) in configs}
    chosen = pd.concat([part for _, by_batch in ranked.groupby(["batch_size", "drafter"], sort=True)
                        for part in chosen_kinds(by_batch, spec.confirm_top, shipped)]).drop_duplicates("config_id")
    shared = same_work([int(i) for i in chosen["config_id"]], configs, records)
    timed = np.array(list(dict.fromkeys(shared.values())))  # each kind of work once, in the chosen order
    settings = dataclasses.replace(spec.runner_settings(), repeats=repeats or spec.repeats)
    output = run(prepared.pair, prepared.prompts, [configs[i] for i in timed], settings,
                 progress=stage_steps(progress, f"confirming the best {len(shared)}" + (
                     f" ({len(timed)} timed: the others do the same work)" if len(timed) < len(shared) else ""),
                     len(prepared.prompts) * len(timed)))
    samples = output.samples.assign(config_id=timed[output.samples["config_id"].to_numpy()])
    measured = with_measured(table, samples, shared)
    again = functools.partial(another_pass, prepared.pair, prepared.prompts, configs, settings)
    samples, paired = judge(samples, measured[measured["config_id"].isin(list(shared))], again, spec.precision,
                            spec.precision_budget_s, say, shared)
    if "precision" in paired:  # the headline pair's further passes join its measurements
        measured = with_measured(table, samples, shared)
    paired["same_work"] = {int(i): int(j) for i, j in shared.items() if i != j}
    return measured, samples, paired


def with_measured(table: pd.DataFrame, samples: pd.DataFrame, shared: dict[int, int]) -> pd.DataFrame:
    """The table with each confirmed policy's measured columns: those of the policy whose work it
    shares, where it was not timed itself (`same_as` names it)."""
    measured = summarize(samples)
    measured = measured[["config_id", *[c for c in MEASURED if c in measured]]].set_index("config_id")
    rows = pd.DataFrame([{"config_id": i, **measured.loc[j].to_dict(), "same_as": j if j != i else None}
                         for i, j in shared.items()])
    labels = dict(zip(table["config_id"], table["config_label"]))
    rows["same_as"] = [labels[j] if pd.notna(j) else None for j in rows["same_as"]]
    table = (table.drop(columns=[c for c in (*MEASURED, "same_as") if c in table])
             .merge(rows, on="config_id", how="left"))
    table.loc[table["speedup"].notna(), "source"] = "confirmed"
    return table

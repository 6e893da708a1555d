"""The report's depth view: the best configuration's and the best fixed γ's metrics by the depth
each round started at, and their measured speedup by the prompt's length (harness/depth_breakdown.py).

Shown only where it says something new: the round table when a run's rounds span more than one
depth bucket, the speedup table when its prompts do. A short-prompt run shows neither. A sweep
that searched by depth (summary.json's `depth_search`, sections/depth.py, whose blocks it places
first) adds each bucket's best policy and the depth verdict, and the report's figure 14 against
depth (`depth_figure`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd

from dspark_bench.depth import DEPTH_EDGES, depth_labels
from dspark_bench.harness.depth_breakdown import by_prompt_depth
from dspark_bench.metrics import summarize_by_depth
from dspark_bench.reporting import plots
from dspark_bench.reporting.plots.depth import CHOSEN
from dspark_bench.reporting.plots.depth import ROLES as DRAWN
from dspark_bench.reporting.report_inputs import (
    SUMMARY_METRICS,
    Inputs,
    Skip,
    best_and_classic,
    samples_of,
    section_blocks,
)
from dspark_bench.sections.base import BY_DEPTH
from dspark_bench.sections.depth import DepthSearch

ROLES = ("best", "classic (best fixed γ)")


def _number(value, digits: int = 3) -> str:
    return "—" if value is None or pd.isna(value) else f"{value:.{digits}f}"


def _speedup(row: pd.Series) -> str:
    if pd.isna(row.get("speedup")):
        return "—"
    return f"{row['speedup']:.2f}× [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]"


def depth_tables(inputs: Inputs, run_id: str, policies: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One run's best and classic rows (column role): by round depth, and by prompt length."""
    labels = depth_labels(inputs.summaries.get(run_id, {}).get("depth_edges", DEPTH_EDGES))
    rounds, prompts = [], []
    for role, row in zip(ROLES, best_and_classic(inputs, policies)):
        samples = samples_of(inputs, row)
        if samples.empty:
            continue
        rounds.append(summarize_by_depth(samples, labels).assign(role=role))
        if "spec_time_s" in samples and samples["spec_time_s"].notna().all():
            prompts.append(by_prompt_depth(samples).assign(role=role))
    return (pd.concat(rounds, ignore_index=True) if rounds else pd.DataFrame(),
            pd.concat(prompts, ignore_index=True) if prompts else pd.DataFrame())


def depth_blocks(inputs: Inputs) -> list[tuple]:
    """The "By depth" section: a round table per run whose rounds span several depth buckets, and
    a speedup table per run whose prompts do."""
    several = inputs.policies["run_id"].nunique() > 1
    round_lines, prompt_lines = [], []
    for run_id, policies in inputs.policies.groupby("run_id", sort=False):
        rounds, prompts = depth_tables(inputs, run_id, policies)
        run = [plots.short_run(run_id)] if several else []
        if not rounds.empty and rounds["depth"].nunique() > 1:
            round_lines += [[*run, r["role"], r["config_label"], r["depth"], str(r["prompts"]), str(r["rounds"]),
                             str(r["emitted_total"]), *(_number(r[m]) for m in SUMMARY_METRICS)]
                            for _, r in rounds.iterrows()]
        if not prompts.empty and prompts["prompt_depth"].nunique() > 1:
            prompt_lines += [[*run, r["role"], r["config_label"], r["prompt_depth"], str(r["prompts"]), _speedup(r),
                              _number(r["tokens_per_round"]), _number(r["acceptance_rate"])]
                             for _, r in prompts.iterrows()]
    searched = section_blocks(inputs, BY_DEPTH)
    if not round_lines and not prompt_lines and not searched:
        return []
    run = ["run"] if several else []
    blocks: list[tuple] = [("h3", "By depth"), *searched]
    if round_lines:
        blocks += [("p", ("Each round counted at its depth, the tokens in the context when it started (the prompt's "
                          "and those generated before it; summary.json's `by_depth`). `prompts`: how many prompts "
                          "had a round there; `tokens`: what those rounds emitted.")),
                   ("table", [*run, "", "configuration", "depth", "prompts", "rounds", "tokens", *SUMMARY_METRICS],
                    round_lines)]
    if prompt_lines:
        blocks += [("p", ("Measured speedup by the prompt's length (summary.json's `by_prompt_depth`): a decode is "
                          "timed whole, so speed can only be cut by whole prompts, with the same 95 % bootstrap "
                          "interval over prompts as every speedup here.")),
                   ("table", [*run, "", "configuration", "prompt length", "prompts", "speedup [95% CI]",
                              "tokens_per_round", "acceptance_rate"], prompt_lines)]
    return blocks


# --- a depth search's choice (sweeps) ------------------------------------------------------------

# The depth search's policies (sections/depth.DepthSearch's fields) and their names in the figure.
SEARCHED = tuple(zip(("depth_policy", "best_single", "best_fixed"), DRAWN))
MEASURED = ("depth_policy", "best_single")  # the two a sweep times and pairs
COLUMNS = ("run_id", "task", "role", "source", "config_label", "depth_bucket", "acceptance_rate", "tokens_per_round",
           "gamma_max", "threshold", "predicted_speedup", "prompts", "speedup", "speedup_low", "speedup_high")


def _searched(inputs: Inputs) -> dict[str, DepthSearch]:
    return {run_id: found for run_id, s in inputs.summaries.items() if (found := DepthSearch.from_json(s)) is not None}


def task_names(inputs: Inputs, run_ids) -> dict[str, str]:
    """Each folder's task for a legend: its task or dataset (a file by its name alone), with the
    run beside it where two folders share one."""
    names = {}
    for run_id in run_ids:
        tasks = inputs.policies.loc[inputs.policies["run_id"] == run_id, "task"].dropna()
        task = str(tasks.iloc[0]) if len(tasks) else plots.short_run(run_id)
        names[run_id] = Path(task).name if Path(task).suffix else task
    counts = Counter(names.values())
    return {r: f"{name} ({plots.short_run(r)})" if counts[name] > 1 else name for r, name in names.items()}


def timed_samples(inputs: Inputs, run_id: str, label: str) -> pd.DataFrame:
    """A policy's timed samples: its own, or, where a confirmation timed the same work once, those
    of the policy it shares them with (trials' `same_as`)."""
    policies = inputs.policies
    row = policies[(policies["run_id"] == run_id) & (policies["config_label"] == label)]
    if row.empty:
        return inputs.samples.iloc[:0]
    samples = samples_of(inputs, row.iloc[0])
    same = row.iloc[0].get("same_as")
    if samples.empty and isinstance(same, str):
        samples = samples_of(inputs, pd.Series({"run_id": run_id, "config_label": same}))
    timed = not samples.empty and "spec_time_s" in samples and samples["spec_time_s"].notna().all()
    return samples if timed else samples.iloc[:0]


def depth_search_rows(inputs: Inputs) -> pd.DataFrame:
    """What figure 14 draws, per sweep with a depth search: one row per task, role and bucket.
    Source "replay": the depth policy's, the best single policy's and the best fixed γ's replayed
    metrics by the depth each round started at (summary.json's depth_search buckets), and the
    search's choice in each bucket (role "each bucket's best": threshold, gamma_max). Source
    "measured": the depth policy's and the best single policy's timed speedup with its 95 %
    interval over the prompts of each prompt length bucket (harness/depth_breakdown.py by_prompt_depth)."""
    found = _searched(inputs)
    names = task_names(inputs, found)
    rows = []
    for run_id, search in found.items():
        mark = {"run_id": run_id, "task": names[run_id]}
        for key, role in SEARCHED:
            rows += [{**mark, "role": role, "source": "replay", "config_label": getattr(search, key)["config_label"],
                      **bucket} for bucket in getattr(search, key)["buckets"]]
        rows += [{**mark, "role": CHOSEN, "source": "replay", **best} for best in search.per_bucket_best]
        for key, role in ((k, r) for k, r in SEARCHED if k in MEASURED):
            label = getattr(search, key)["config_label"]
            samples = timed_samples(inputs, run_id, label)
            rows += [{**mark, "role": role, "source": "measured", "config_label": label, "depth_bucket": r.prompt_depth,
                      "prompts": r.prompts, "speedup": r.speedup, "speedup_low": r.speedup_low,
                      "speedup_high": r.speedup_high} for r in by_prompt_depth(samples).itertuples()]  # none untimed
    table = pd.DataFrame(rows)
    return table.reindex(columns=[*COLUMNS, *(c for c in table if c not in COLUMNS)])


def depth_figure(inputs: Inputs):
    """Figure 14 and its caption; Skip where no sweep searched by depth."""
    rows = depth_search_rows(inputs)
    if rows.empty:
        raise Skip("no sweep searched by depth (a replay sweep whose rounds fill more than one depth bucket)")
    names = task_names(inputs, _searched(inputs))
    policies = [f"{names[run_id]}: " + ", ".join(f"{role} {getattr(search, key)['config_label']}"
                                                 for key, role in SEARCHED)
                for run_id, search in _searched(inputs).items()]
    return plots.depth_axis(rows), (
        "Each sweep that searched by depth (sections/depth.py): (a) the acceptance_rate of the depth policy "
        "(wide, pale), the best single policy and the best fixed γ over the rounds that started in each depth bucket, "
        "replayed from the record; (b), (c) the γ_max and threshold of the policy the search chose in each bucket "
        "(threshold 0: a fixed γ; none drawn: goodput, which reads none), which the depth policy runs there; (d) "
        "each policy's predicted speedup over the rounds starting in the bucket, priced at their depth, and, hollow "
        "with its 95 % bootstrap interval, the measured speedup of the confirmed depth policy and best single "
        "policy over the prompts whose length falls in the bucket (a decode is timed whole, so a measured speedup "
        "is cut by prompt, not by round: a prompt's rounds start at its length and deeper). "
        + "; ".join(policies) + ".")

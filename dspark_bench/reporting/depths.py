"""The report's depth view: the best configuration's and the best fixed γ's metrics by the depth
each round started at, and their measured speedup by the prompt's length (harness/depths.py).

Shown only where it says something new: the round table when a run's rounds span more than one
depth bucket, the speedup table when its prompts do. A short-prompt run shows neither.
"""

from __future__ import annotations

import pandas as pd

from dspark_bench.depth import DEPTH_EDGES, depth_labels
from dspark_bench.harness.depths import by_prompt_depth
from dspark_bench.metrics import summarize_by_depth
from dspark_bench.reporting import plots
from dspark_bench.reporting.report_inputs import SUMMARY_METRICS, Inputs, best_and_classic, samples_of

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
    if not round_lines and not prompt_lines:
        return []
    run = ["run"] if several else []
    blocks: list[tuple] = [("h3", "By depth")]
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

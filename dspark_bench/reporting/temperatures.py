"""The report's temperature axis (figure 13): each task's sweeps at several temperatures, the
best policy of each by replay, and the greedy-tuned policy replayed at each temperature
(replay/sampled.py replays sampled traffic)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dspark_bench import schedules
from dspark_bench.config import LEARNED, POLICY_FIELDS
from dspark_bench.reporting import plots
from dspark_bench.reporting.report_inputs import Skip


def temperature_rows(inputs) -> pd.DataFrame:
    """Per replay sweep: its task, temperature and best scheduled policy by replay (the predicted
    speedup: every policy replayed alike, where a confirmation times a few), with that policy's
    knobs; and, at a temperature > 0, the predicted speedup there of the best policy of the
    same task's greedy sweep among the runs that a sampled record can replay (the same knobs)."""
    rows = []
    for run_id, summary in inputs.summaries.items():
        spec = inputs.infos[run_id].get("spec") or {}
        if summary.get("evaluation") != "replay":
            continue
        replayed = inputs.policies[inputs.policies["run_id"] == run_id]
        replayed = replayed[~schedules.where(replayed, baseline=True)].sort_values("predicted_speedup", ascending=False)
        if replayed.empty:
            continue
        best = replayed.iloc[0]
        # What a sampled record can replay of it: the best on the distribution's signals (the
        # learned signal reads drafted tokens).
        portable = replayed[replayed["metric"] != LEARNED].iloc[0]
        one = schedules.named(best["schedule"]).one_threshold  # goodput and budget have none
        rows.append({"run_id": run_id, "task": spec.get("task") or spec.get("dataset"),
                     "temperature": best["temperature"], "top_p": best["top_p"], "policy": best["config_label"],
                     "threshold": best["threshold"] if one else np.nan, "gamma_max": best["gamma_max"],
                     "tokens_per_round": best["tokens_per_round"], "predicted_speedup": best["predicted_speedup"],
                     "portable": portable["config_label"], "knobs": {k: portable[k] for k in POLICY_FIELDS}})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    greedy = {r.task: r for r in table.itertuples() if r.temperature == 0}
    table["greedy_tuned"] = [greedy[r.task].portable if r.task in greedy else None for r in table.itertuples()]
    table["greedy_tuned_speedup"] = [replayed_as(inputs.policies, r.run_id, greedy[r.task].knobs) if r.task in greedy
                                     else np.nan for r in table.itertuples()]
    return table.drop(columns="knobs")


def replayed_as(policies: pd.DataFrame, run_id: str, knobs: dict) -> float:
    """The predicted speedup a run replayed for the policy with these knobs (NaN if not in its space)."""
    rows = policies[policies["run_id"] == run_id]
    for name, value in knobs.items():
        if name in rows and name not in ("goodput_model", "signal_model"):  # each sweep's own fitted files
            rows = rows[rows[name] == value]
    return float(rows["predicted_speedup"].iloc[0]) if len(rows) else np.nan


def temperature_figure(inputs):
    """Figure 13 and its caption; Skip where no task was swept at two temperatures."""
    table = temperature_rows(inputs)
    if table.empty or table.groupby("task")["temperature"].nunique().max() < 2:
        raise Skip("no task swept at two temperatures or more (sweep --temperature T, then report the sweeps together)")
    sentences = [f"{task}: " + ", ".join(f"T = {r.temperature:g} {r.policy}" for r in group.itertuples())
                 for task, group in table.sort_values("temperature").groupby("task", sort=True)]
    for r in table[table["temperature"] > 0].itertuples():
        if r.greedy_tuned and not np.isnan(r.greedy_tuned_speedup):
            verdict = "still the best" if r.greedy_tuned == r.policy else (
                f"predicted {r.greedy_tuned_speedup:.2f}× against {r.predicted_speedup:.2f}× for {r.policy}")
            sentences.append(f"{r.task} at T = {r.temperature:g}: the greedy-tuned {r.greedy_tuned} is {verdict}")
    return plots.temperature_axis(table), (
        "Each task's sweeps, one per temperature: the best scheduled policy by replay's prediction, its threshold "
        "(none for a goodput or budget winner), γ_max, tokens per round and predicted speedup (replayed on a sampled "
        "record at T > 0: replay/sampled.py), and the best policy tuned on the greedy record that a sampled record "
        "can replay (not the learned signal's) at each temperature (dashed). A threshold tuned greedy meets a "
        "different acceptance under sampling: the target's own uncertainty rejects tokens the draft is sure of. "
        "Predicted, not measured: time the two policies paired at the traffic's temperature before deploying "
        "(docs/measurements.md does). "
        "The best by replay: " + "; ".join(sentences) + ("." if sentences else ""))

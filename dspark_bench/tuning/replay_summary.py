"""A replay sweep's summary.json: the confirmed policies (or, nothing timed, the best predicted
one of each schedule), the best fixed γ, the cost model's accuracy, the view per batch size and per
drafter, and the sections the sweep found (sections/registry.py), written in one file."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dspark_bench import schedules
from dspark_bench.objectives import OBJECTIVES, rank
from dspark_bench.results import write_json
from dspark_bench.sections import registry
from dspark_bench.tuning.preparation import SweepResult
from dspark_bench.tuning.spec import SweepSpec


def write_replay_summary(folder: Path, table: pd.DataFrame, spec: SweepSpec, cost, record_dir: Path,
                         timing_health: dict | None = None, predictions_trusted: bool = True,
                         paired: dict | None = None, found: list | None = None, **plain) -> SweepResult:
    """summary.json of a replay sweep, with the sections `found` (sections/registry.py) and the
    `plain` keys written among them; returns it with the confirmed policies, best first."""
    objective = OBJECTIVES[spec.objective[0]]
    confirmed = table[table["source"] == "confirmed"]
    column = "predicted_speedup_ours" if "predicted_speedup_ours" in confirmed else "predicted_speedup"
    if len(confirmed):
        shown = confirmed = rank(confirmed, objective.name, objective.column("real"))
    else:  # nothing timed (--confirm-top 0): replay's answer, the best predicted policy of each schedule
        shown = rank(table, objective.name, objective.column("replay")).groupby(
            ["batch_size", "drafter", "schedule"], sort=False).head(1)
    baseline = schedules.where(shown, baseline=True)
    summary = {
        "evaluation": "replay", "objective": list(spec.objective), "policies_simulated": len(table),
        "record": str(record_dir), "cost_model": cost.to_dict(),
        "cost_model_accuracy": accuracy(confirmed, column) if len(confirmed) else None,
        "best": shown[~baseline].head(1).to_dict(orient="records"),
        "classic": shown[baseline].to_dict(orient="records"),
        **{name: shown[shown["schedule"] == name].to_dict(orient="records")  # "goodput", "budget"
           for name in schedules.names(cost_aware=True)},
        "confirmed": confirmed.to_dict(orient="records"),
        "timing_health": timing_health,
        # False: the cost table never passed its checks, so predicted speedups are not to be trusted
        # (the ranking by them is still exact in its rounds; the measured speedups say what won).
        "predictions_trusted": predictions_trusted,
        # Each confirmed policy against the best fixed γ on the same prompts (harness/verdicts.py);
        # the headline is the best scheduled one's, the sweep's first answer.
        **(paired or {}),
        **registry.summary_json(found or [], **plain),
    }
    if (table["batch_size"] > 1).any():
        summary["by_batch_size"] = by_batch_size(table, confirmed, objective)
    if table["drafter"].nunique() > 1:
        summary["by_drafter"] = by_drafter(shown)
    write_json(folder / "summary.json", summary)
    return SweepResult(folder, shown, summary, spec, list(found or []))


def by_drafter(confirmed: pd.DataFrame) -> list[dict]:
    """The best confirmed policy of each drafter (scheduled or fixed γ), best first: the side-by-side
    comparison the report shows."""
    columns = ["drafter", "config_label", "speedup", "speedup_low", "speedup_high", "tokens_per_round",
               "acceptance_rate", "avg_draft_len", "identical_to_baseline"]
    best = confirmed.groupby("drafter", sort=False).head(1)  # `confirmed` is ranked best first
    return best[[c for c in columns if c in best]].to_dict(orient="records")


def accuracy(confirmed: pd.DataFrame, column: str = "predicted_speedup") -> dict:
    """How far the predicted speedup (`column`: priced on the engine that measured) is from the measured one."""
    ratio = confirmed["speedup"] / confirmed[column]
    return {"measured_over_predicted_median": float(ratio.median()),
            "mean_abs_error": float((confirmed["speedup"] - confirmed[column]).abs().mean()), "priced_by": column}


def by_batch_size(table: pd.DataFrame, confirmed: pd.DataFrame, objective) -> list[dict]:
    """Per batch size: the best scheduled policy and the best fixed gamma, predicted in both
    layouts and measured (padded) where confirmed, with the cost model's accuracy at that B."""
    rows = []
    for batch_size, group in table.groupby("batch_size", sort=True):
        row = {"batch_size": int(batch_size), "layout_measured": "padded"}
        for layout, column in (("padded", "predicted_speedup"), ("packed", "predicted_speedup_packed")):
            baseline = schedules.where(group, baseline=True)
            scheduled, fixed = rank(group[~baseline], "speedup", column), rank(group[baseline], "speedup", column)
            row[f"{layout}_predicted"] = {
                "best_scheduled": scheduled.iloc[0]["config_label"],
                "best_scheduled_speedup": float(scheduled.iloc[0][column]),
                "best_fixed": fixed.iloc[0]["config_label"], "best_fixed_speedup": float(fixed.iloc[0][column]),
                "scheduled_over_fixed": float(scheduled.iloc[0][column] / fixed.iloc[0][column])}
        measured = confirmed[confirmed["batch_size"] == batch_size]
        columns = ["config_label", "schedule", "speedup", "speedup_low", "speedup_high", "predicted_speedup",
                   "baseline_tokens_per_s", "spec_tokens_per_s"]
        row["measured"] = [] if measured.empty else measured[columns].to_dict(orient="records")
        row["cost_model_accuracy"] = (accuracy(measured, "predicted_speedup_ours"
                                               if "predicted_speedup_ours" in measured else "predicted_speedup")
                                      if len(measured) else None)
        rows.append(row)
    return rows



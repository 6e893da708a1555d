"""The report's batch-size view: per batch size B and layout, the best confidence-scheduled
policy and the best budget schedule against the best fixed gamma, predicted by replay and,
where confirmed, measured.

The table a serving engineer copies (best policy per B) and the rows the batch-size figure
draws come from one function, `batch_rows`, over a sweep's policies table (trials.parquet):
padded speedups are measured where the sweep confirmed them (with their intervals) and
predicted everywhere; packed ones are predicted only, and say so.
"""

from __future__ import annotations

import pandas as pd

from dspark_bench import schedules
from dspark_bench.objectives import best

LAYOUTS = {"padded": ("predicted_speedup", "predicted_time"),
           "packed": ("predicted_speedup_packed", "predicted_time_packed")}
# The per-row schedules, the budget schedule (it decides for the whole batch: decoding/budget.py), fixed γ.
KINDS = ("best scheduled", "budget schedule", "best fixed γ")


def kind_parts(group: pd.DataFrame) -> list[pd.DataFrame]:
    """A batch size's policies split by KINDS."""
    whole_batch, baseline = schedules.where(group, whole_batch=True), schedules.where(group, baseline=True)
    return [group[~baseline & ~whole_batch], group[whole_batch], group[baseline]]


def has_batch_sizes(policies: pd.DataFrame) -> bool:
    return "batch_size" in policies and policies["batch_size"].nunique() > 1 and "predicted_speedup" in policies


def batch_rows(policies: pd.DataFrame) -> pd.DataFrame:
    """One row per (batch_size, layout, kind): the predicted best and, padded, the measured best."""
    rows = []
    for batch_size, group in policies.groupby("batch_size", sort=True):
        for layout, (column, seconds) in LAYOUTS.items():
            if column not in group or group[column].isna().all():
                continue
            for kind, part in zip(KINDS, kind_parts(group)):
                if part.empty:
                    continue
                top = best(part, "speedup", column)
                row = {"batch_size": int(batch_size), "layout": layout, "kind": kind,
                       "predicted_label": top["config_label"], "predicted": float(top[column]),
                       "predicted_tokens_per_s": float(top["new_tokens"] / top[seconds]),
                       "predicted_baseline_tokens_per_s": float(top["new_tokens"] / top["predicted_baseline_time"])
                       if "predicted_baseline_time" in top else float("nan")}
                measured = part[part["speedup"].notna()] if layout == "padded" and "speedup" in part else part.iloc[:0]
                if not measured.empty:
                    top = best(measured, "speedup", "speedup")
                    row.update(measured_label=top["config_label"], speedup=float(top["speedup"]),
                               speedup_low=float(top["speedup_low"]), speedup_high=float(top["speedup_high"]),
                               measured_predicted=float(top["predicted_speedup"]),
                               spec_tokens_per_s=float(top["spec_tokens_per_s"]),
                               baseline_tokens_per_s=float(top["baseline_tokens_per_s"]))
                rows.append(row)
    return pd.DataFrame(rows)


def _cell(row: pd.Series | None) -> tuple[str, str]:
    """(policy, speedup) cells: measured with its interval and prediction, else predicted."""
    if row is None:
        return "—", "—"
    if pd.notna(row.get("speedup")):
        return (str(row["measured_label"]), f"{row['speedup']:.2f}× [{row['speedup_low']:.2f}, "
                f"{row['speedup_high']:.2f}] (predicted {row['measured_predicted']:.2f}×)")
    return str(row["predicted_label"]), f"{row['predicted']:.2f}× predicted"


def _over(row: pd.Series | None, fixed: pd.Series | None) -> str:
    """row's speedup over fixed γ's: measured where both were, else predicted (and said so)."""
    if row is None or fixed is None:
        return "—"
    if pd.notna(row.get("speedup")) and pd.notna(fixed.get("speedup")):
        return f"{row['speedup'] / fixed['speedup']:.3f}"
    return f"{row['predicted'] / fixed['predicted']:.3f} (predicted)"


def batch_blocks(policies: pd.DataFrame) -> list[tuple]:
    """The best policy per batch size and layout, as a report table with its reading."""
    table = batch_rows(policies)
    if table.empty:
        return []
    lines = []
    table["order"] = table["layout"].map(list(LAYOUTS).index)  # padded (measured) first
    for (batch_size, _, layout), group in table.groupby(["batch_size", "order", "layout"], sort=True):
        by_kind = {row["kind"]: row for _, row in group.iterrows()}
        scheduled, joint, fixed = (by_kind.get(kind) for kind in KINDS)
        baseline = fixed if fixed is not None else scheduled
        rate = baseline.get("baseline_tokens_per_s") if baseline is not None else None
        lines.append([str(batch_size), layout, *_cell(scheduled), *_cell(joint), *_cell(fixed), _over(scheduled, fixed),
                      _over(joint, fixed), f"{rate:.0f}" if rate is not None and pd.notna(rate) else "—"])
    header = ["B", "layout", "best scheduled", "speedup", "budget schedule", "speedup", "best fixed γ", "speedup",
              "scheduled / fixed", "budget / fixed", "autoregressive tok/s (measured)"]
    text = ("Per batch size B: the best confidence-scheduled policy deciding row by row, the best budget schedule "
            "(one decision for the whole batch after each draft step, from the cost surface; at B = 1 it is goodput) "
            "and the best fixed gamma. Padded (a round "
            "verifies every row padded to its longest draft) is what the batched decoder runs: measured where the "
            "sweep confirmed it, each against the batched autoregressive baseline on the same batches, with a 95 % "
            "bootstrap interval over prompts. Packed (each row verifies only its own tokens, as vLLM, SGLang and "
            "TensorRT-LLM do) is predicted by replay and the cost surface only.")
    return [("h2", "Batch sizes"), ("table", header, lines), ("p", text)]

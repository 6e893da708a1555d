"""What every figure shares: the Agg figure factory, colours, and which rows to show."""

from __future__ import annotations

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dspark_bench import objectives, schedules

CURVE_METRICS = ("avg_draft_len", "block_acceptance_rate", "accepted_per_round", "speedup")
THRESHOLD_SCHEDULES = schedules.names(one_threshold=True)  # drawn against their one threshold
COLORS = {"accepted": "#2e9e44", "rejected": "#d6423b", "target": "#3a63c4", "best": "#e6a100"}


def figure(width: float, height: float, rows: int = 1, cols: int = 1, **kwargs):
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False, **kwargs)
    return fig, axes


def short_run(run_id: str) -> str:
    """`20250101-120000-sweep-abc123` -> `sweep-abc123`, for legends."""
    parts = str(run_id).split("-")
    return "-".join(parts[2:]) if len(parts) > 3 else str(run_id)


# --- choosing what to show ---------------------------------------------------------------------


def complete(policies: pd.DataFrame) -> pd.DataFrame:
    """Rows that finished: Optuna trials in state COMPLETE, every other row as is."""
    if "state" in policies:
        return policies[policies["state"].isna() | (policies["state"] == "COMPLETE")]
    return policies


def best_row(policies: pd.DataFrame, column: str | None = None, fixed: bool = False,
             objective: str = "speedup") -> pd.Series | None:
    """The best row by `objective` (objectives.rank: its direction; read from `column`, by
    default the measured metric where any row has it, else the replay's prediction) among
    confidence-scheduled policies (fixed=False) or classic fixed-gamma ones (fixed=True)."""
    table = complete(policies)
    if "schedule" in table:
        is_fixed = schedules.where(table, baseline=True)
        table = table[is_fixed] if fixed else table[~is_fixed]
    return objectives.best(table, objective, column or objectives.ranking_column(policies, objective))


def names_of(table: pd.DataFrame) -> str:
    return " / ".join(dict.fromkeys(table["_value"]))

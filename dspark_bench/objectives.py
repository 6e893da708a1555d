"""What a policy can be optimised for, and the one ranking that sweep, calibrate, report, plots
and the notebook all use.

An objective is a metric name of docs/policy-and-metrics.md with a direction. Under replay a speedup is not
measured but predicted by the cost model, in its own column (`predicted_speedup`); every other
objective is counted exactly by replay and by real runs alike, in the column of its own name.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from dspark_bench.errors import DsparkError


@dataclass(frozen=True)
class Objective:
    name: str  # the metric, as named in results tables
    direction: str  # "maximize" | "minimize" (Optuna's words)
    predicted: str | None = None  # the column replay ranks by instead, where it predicts the metric

    def column(self, engine: str) -> str:
        """The table column this objective is read from under `engine` ("replay" or "real")."""
        return self.predicted if engine == "replay" and self.predicted else self.name


OBJECTIVES = {o.name: o for o in (
    Objective("speedup", "maximize", predicted="predicted_speedup"),
    Objective("tokens_per_round", "maximize"),
    Objective("acceptance_rate", "maximize"),
    Objective("block_acceptance_rate", "maximize"),
    Objective("accepted_per_round", "maximize"),
    Objective("avg_draft_len", "maximize"),
    Objective("draft_forwards_per_token", "minimize"),
)}


def get(name: str) -> Objective:
    if name not in OBJECTIVES:
        raise DsparkError(f"unknown objective {name!r}; choose from {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]


def ranking_column(table: pd.DataFrame, objective: str = "speedup") -> str | None:
    """The column `table` is ranked by: the measured metric where any row has it, else the
    replay's prediction of it; None when the table has neither."""
    spec = get(objective)
    for name in (spec.name, spec.predicted):
        if name and name in table and table[name].notna().any():
            return name
    return None


def rank(table: pd.DataFrame, objective: str = "speedup", column: str | None = None) -> pd.DataFrame:
    """Rows best first by `objective` (read from `column`, by default its ranking_column).

    Rows without a value go last; ties keep the table's own order (a stable sort), which for a
    sweep is the search space's order.
    """
    column = column or ranking_column(table, objective)
    if column is None or column not in table:
        raise DsparkError(f"nothing to rank by: the table has no {objective} column")
    ascending = get(objective).direction == "minimize"
    return table.sort_values(column, ascending=ascending, kind="mergesort", na_position="last")


def best(table: pd.DataFrame, objective: str = "speedup", column: str | None = None) -> pd.Series | None:
    """The best row of `table` (None if no row has a value to rank by)."""
    column = column or ranking_column(table, objective)
    if column is None or column not in table or table[column].notna().sum() == 0:
        return None
    return rank(table, objective, column).iloc[0]


# --- under load (replay/under_load.py): the best policy at an arrival rate -----------------------------

LOAD_OBJECTIVES = {
    "tpot_p50": "the lowest median time per output token",
    "throughput": "output tokens per second, among the policies whose p99 TPOT is within --tpot-limit (if given)",
    "goodput": "output tokens per second of the requests whose TPOT met --tpot-limit",
}


def rank_under_load(group: pd.DataFrame, objective: str, tpot_limit: float | None = None) -> pd.DataFrame:
    """One load's policies, best first by `objective` (LOAD_OBJECTIVES); ties go to the lower p50 TPOT.
    Under `throughput` with a TPOT limit, policies over it at p99 are left out."""
    if objective not in LOAD_OBJECTIVES:
        raise DsparkError(f"unknown load objective {objective!r}; choose one of {', '.join(LOAD_OBJECTIVES)}")
    if objective == "throughput" and tpot_limit is not None:
        group = group[group["tpot_p99_s"] <= tpot_limit]
    if objective == "tpot_p50":
        return group.sort_values(["tpot_p50_s", "throughput"], ascending=[True, False], kind="stable")
    return group.sort_values([objective, "tpot_p50_s"], ascending=[False, True], kind="stable")

"""One ranking for sweep, calibrate, report and plots: an objective's direction and column."""

import math

import pandas as pd
import pytest

from dspark_bench import objectives
from dspark_bench.errors import DsparkError
from dspark_bench.reporting import plots
from dspark_bench.reporting.report import Inputs, best_and_classic, run_objective


def table() -> pd.DataFrame:
    return pd.DataFrame({
        "config_id": [0, 1, 2, 3],
        "config_label": ["a", "b", "c", "fixed γ=4"],
        "schedule": ["threshold", "threshold", "cumulative", "fixed"],
        "speedup": [math.nan, 1.4, 1.3, 1.5],  # measured for the confirmed ones only
        "predicted_speedup": [1.9, 1.5, 1.45, 1.6],
        "draft_forwards_per_token": [0.9, 0.5, 0.7, 0.3],
    })


def test_rank_follows_the_objectives_direction():
    ranked = objectives.rank(table(), "draft_forwards_per_token")
    assert ranked["config_label"].tolist() == ["fixed γ=4", "b", "c", "a"]  # minimised
    assert objectives.rank(table(), "speedup")["config_label"].tolist() == ["fixed γ=4", "b", "c", "a"]  # NaN last
    by_prediction = objectives.rank(table(), "speedup", objectives.OBJECTIVES["speedup"].column("replay"))
    assert by_prediction["config_label"].tolist() == ["a", "fixed γ=4", "b", "c"]


def test_measured_values_rank_before_predicted_ones():
    assert objectives.ranking_column(table(), "speedup") == "speedup"
    assert objectives.ranking_column(table().drop(columns="speedup"), "speedup") == "predicted_speedup"
    assert objectives.ranking_column(table(), "tokens_per_round") is None
    with pytest.raises(DsparkError, match="unknown objective"):
        objectives.get("throughput")


def test_plots_and_report_take_the_sweeps_own_objective():
    # A sweep that minimised draft forwards: its "best" is the fewest, not the most.
    assert plots.best_row(table(), objective="draft_forwards_per_token")["config_label"] == "b"
    infos = {"r": {"spec": {"objective": ["draft_forwards_per_token"]}}}
    assert run_objective(infos) == "draft_forwards_per_token" and run_objective({"r": {}}) == "speedup"
    inputs = Inputs([], infos, {}, table(), pd.DataFrame(), pd.DataFrame(), "draft_forwards_per_token",
                    "draft_forwards_per_token")
    best, classic = best_and_classic(inputs)
    assert best["config_label"] == "b" and classic["config_label"] == "fixed γ=4"

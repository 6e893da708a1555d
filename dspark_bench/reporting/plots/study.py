"""Figures of searches: an Optuna study's history, importances and Pareto front, and the
calibration's per-domain threshold curves."""

from __future__ import annotations

import warnings

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from dspark_bench.reporting.plots.base import complete, figure

# --- Optuna -------------------------------------------------------------------------------------


def optimization_history(trials: pd.DataFrame, objective: str = "objective_0", direction: str = "maximize",
                         name: str = "speedup") -> Figure:
    """Objective value per trial number, with the best value so far."""
    done = complete(trials).sort_values("trial")
    done = done[done[objective].notna()]
    if done.empty:
        raise ValueError("no complete trial")
    fig, axes = figure(7.5, 4)
    ax = axes[0, 0]
    ax.plot(done["trial"], done[objective], "o", label=f"trial {name}")
    best = done[objective].cummax() if direction == "maximize" else done[objective].cummin()
    ax.step(done["trial"], best, where="post", color="C3", label="best so far")
    failed = trials[trials["state"].isin(["FAIL", "PRUNED"])] if "state" in trials else trials.iloc[:0]
    for t in failed["trial"]:
        ax.axvline(t, color="grey", alpha=0.3, lw=1)
    ax.set_xlabel("trial")
    ax.set_ylabel(name)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _optuna_figure(axes) -> Figure:
    import matplotlib.pyplot as plt

    first = axes if not isinstance(axes, np.ndarray) else axes.flat[0]
    fig = first.figure
    plt.close(fig)  # keep it, but out of pyplot's registry
    fig.set_layout_engine("constrained")
    return fig


def param_importances(study, target_name: str = "speedup") -> Figure:
    """Optuna's parameter importances (fANOVA); needs >= 2 complete trials and >= 2 parameters
    that vary."""
    import optuna
    from optuna.visualization.matplotlib import plot_param_importances

    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    varied = {name for t in trials for name in t.params if len({str(u.params.get(name)) for u in trials}) > 1}
    if len(trials) < 2 or len(varied) < 2:
        raise ValueError(f"{len(trials)} complete trial(s) and {len(varied)} varied parameter(s): nothing to rank")
    with warnings.catch_warnings(), matplotlib.rc_context():  # optuna switches on the ggplot style for good
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        axes = plot_param_importances(study, params=sorted(varied), target=(lambda t: t.values[0])
                                      if len(study.directions) > 1 else None, target_name=target_name)
    return _optuna_figure(axes)


def pareto_front(study, target_names: list[str]) -> Figure:
    """Optuna's Pareto front of a two-objective study."""
    import optuna
    from optuna.visualization.matplotlib import plot_pareto_front

    if len(study.directions) < 2:
        raise ValueError("a single-objective study has no Pareto front")
    with warnings.catch_warnings(), matplotlib.rc_context():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        axes = plot_pareto_front(study, target_names=target_names)
    return _optuna_figure(axes)


# --- calibration ---------------------------------------------------------------------------------


def domain_threshold_curves(curves: pd.DataFrame, ylabel: str, global_threshold: float | None = None) -> Figure:
    """Each domain's objective against the threshold on one axis, each domain's best starred
    (`curves`: calibrate.threshold_curves' table: domain, threshold, value, best, curve)."""
    fig, axes = figure(8, 5)
    axis = axes[0, 0]
    for i, (domain, line) in enumerate(curves.groupby("domain", sort=False)):
        color = f"C{i % 10}"
        axis.plot(line["threshold"], line["value"], marker="o", markersize=3, color=color,
                  label=f"{domain} ({line['curve'].iloc[0]})")
        best = line[line["best"]]
        axis.scatter(best["threshold"], best["value"], s=140, marker="*", color=color, edgecolor="black",
                     zorder=5)
        for _, row in best.iterrows():
            axis.annotate(f"{row['threshold']:g}", (row["threshold"], row["value"]), textcoords="offset points",
                          xytext=(0, 9), ha="center", fontsize=9, color=color,
                          bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85})
    if global_threshold is not None:
        axis.axvline(global_threshold, color="grey", linestyle="--", linewidth=1,
                     label=f"global policy threshold {global_threshold:g}")
    if "speedup" in ylabel:
        axis.axhline(1.0, color="black", linewidth=0.8, alpha=0.6)  # break-even with plain decoding
    axis.margins(y=0.12)  # room for the labels above the stars
    axis.set_xlabel("threshold (confidence below which drafting stops)")
    axis.set_ylabel(ylabel)
    axis.set_title("Calibration: objective vs threshold per domain (★ = domain's best)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="best")
    return fig

"""Figures over policies: the metrics against the threshold, and the speedup heatmap."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.colors import Normalize, TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from dspark_bench import objectives, schedules
from dspark_bench.reporting.plots.base import (
    COLORS,
    CURVE_METRICS,
    THRESHOLD_SCHEDULES,
    best_row,
    complete,
    figure,
    names_of,
    short_run,
)


def _curve_groups(table: pd.DataFrame, overlay_runs: bool) -> list[str]:
    keys = ["run_id"] if overlay_runs and "run_id" in table else []
    keys.append("gamma_max")
    if "min_draft_len" in table and table["min_draft_len"].nunique() > 1:
        keys.append("min_draft_len")
    return keys


def _group_label(keys: list[str], values) -> str:
    values = values if isinstance(values, tuple) else (values,)
    names = {"gamma_max": "γ≤{}", "min_draft_len": "min{}", "run_id": "{}"}
    return " ".join(names[k].format(short_run(v) if k == "run_id" else v) for k, v in zip(keys, values))


def _draw_curve(axes, rows: pd.DataFrame, label: str, color: str) -> None:
    """One group's lines on the four panels; repeated Optuna trials of one policy give their mean."""
    columns = [c for c in ("avg_draft_len", "block_acceptance_rate", "accepted_per_round", "tokens_per_round",
                           "speedup", "speedup_low", "speedup_high", "predicted_speedup") if c in rows]
    curve = rows.groupby("threshold")[columns].mean(numeric_only=True).sort_index()
    for ax, name in zip(axes.flat[:3], CURVE_METRICS[:3]):
        ax.plot(curve.index, curve[name], "o-", color=color, label=label)
    if "tokens_per_round" in curve:
        axes[1, 0].plot(curve.index, curve["tokens_per_round"], "s--", color=color, alpha=0.6)
    ax = axes[1, 1]
    if "predicted_speedup" in curve and curve["predicted_speedup"].notna().any():
        ax.plot(curve.index, curve["predicted_speedup"], "--", color=color, alpha=0.8, label=f"{label} predicted")
    if "speedup" in curve and curve["speedup"].notna().any():
        measured = curve[curve["speedup"].notna()]
        low = measured.get("speedup_low", measured["speedup"])
        high = measured.get("speedup_high", measured["speedup"])
        ax.errorbar(measured.index, measured["speedup"], yerr=[measured["speedup"] - low, high - measured["speedup"]],
                    fmt="o-", color=color, capsize=3, label=f"{label} measured")


def threshold_curves(policies: pd.DataFrame, column: str | None = None, by: str | None = None,
                     objective: str = "speedup") -> Figure:
    """avg_draft_len, block_acceptance_rate, accepted_per_round (+ tokens_per_round) and speedup
    against the threshold: one line per gamma_max (and min_draft_len where it varies), for the
    threshold schedule of the best policy's metric; the best policy starred.

    speedup is drawn with its bootstrap interval where measured and predicted_speedup dashed
    where replayed. Several runs (or by="run") get one set of lines each.
    """
    column = column or objectives.ranking_column(policies, objective)
    best = best_row(policies, column, objective=objective)
    if best is None:
        raise ValueError("no confidence-scheduled policy to plot")
    schedule = best["schedule"] if schedules.named(best["schedule"]).one_threshold else THRESHOLD_SCHEDULES[0]
    table = complete(policies)
    table = table[(table["metric"] == best["metric"]) & (table["schedule"] == schedule)]
    if table["min_draft_len"].nunique() > 1 and table.groupby(["gamma_max", "min_draft_len"]).ngroups > 8:
        # A dense sweep (say 6 gamma_max x 3 min_draft_len) buries its lines under each other:
        # keep the best policy's min_draft_len.
        table = table[table["min_draft_len"] == best["min_draft_len"]]
        fixed_min = f" (min_draft_len {best['min_draft_len']}, the best's)"
    else:
        fixed_min = ""
    overlay = by == "run" or table["run_id"].nunique() > 1 if "run_id" in table else False
    keys = _curve_groups(table, overlay)
    fig, axes = figure(11, 7.5, 2, 2, sharex=True)
    fig.suptitle(f"{best['metric']} · {schedule} schedule · one line per "
                 + " × ".join("run" if k == "run_id" else k for k in keys) + fixed_min, fontsize=11)
    for i, (group, rows) in enumerate(table.groupby(keys, sort=True)):
        _draw_curve(axes, rows, _group_label(keys, group), f"C{i % 10}")
    axes[1, 1].axhline(1.0, color="grey", lw=0.8, ls=":")
    ylabels = ("avg_draft_len", "block_acceptance_rate", "accepted_per_round / tokens_per_round (dashed)",
               "speedup (measured, 95% CI) / predicted_speedup (dashed)")
    for ax, ylabel in zip(axes.flat, ylabels):
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("threshold")
    axes[0, 1].set_ylim(-0.03, 1.03)
    # The best policy: a star on every panel, at its own threshold.
    for ax, name in zip(axes.flat, CURVE_METRICS):
        value = best.get(name) if name != "speedup" else best.get(column)
        if value is not None and pd.notna(value) and best["schedule"] == schedule:
            ax.plot([best["threshold"]], [value], marker="*", ms=18, color=COLORS["best"], mec="black", zorder=5,
                    ls="none", label=f"best: {best['config_label']}")
    axes[0, 0].legend(fontsize=8, loc="best")
    handles, labels = axes[1, 1].get_legend_handles_labels()
    if handles:
        axes[1, 1].legend(handles, labels, fontsize=7, loc="best", ncol=1 + len(handles) // 8)
    return fig


def heatmap_value(policies: pd.DataFrame) -> str:
    """speedup where every policy was measured, else predicted_speedup (replay), else speedup."""
    table = complete(policies)
    table = table[~schedules.where(table, baseline=True)] if "schedule" in table else table
    if "speedup" in table and table["speedup"].notna().all():
        return "speedup"
    if "predicted_speedup" in table and table["predicted_speedup"].notna().any():
        return "predicted_speedup"
    return "speedup"


def speedup_heatmap(policies: pd.DataFrame, value: str | None = None) -> Figure:
    """speedup (or predicted_speedup) over threshold × gamma_max, one panel per metric / schedule
    (and run); cells take the best over any other knob (min_draft_len). Without `value`, each
    run shows what `heatmap_value` picks for it (the panel title says which)."""
    table = complete(policies)
    table = table[~schedules.where(table, baseline=True)].copy()
    several = "run_id" in table and table["run_id"].nunique() > 1
    table["_value"] = value or "speedup"
    if value is None and several:
        for run_id, part in table.groupby("run_id"):
            table.loc[part.index, "_value"] = heatmap_value(part)
    elif value is None:
        table["_value"] = heatmap_value(table)
    table["_cell"] = [row.get(row["_value"], np.nan) for _, row in table.iterrows()]
    table = table[table["_cell"].notna()]
    keys = (["run_id"] if several else []) + ["metric", "schedule", "_value"]
    panels = list(table.groupby(keys, sort=False))
    if not panels:
        raise ValueError(f"no {value or 'speedup'} to show")
    cols = min(len(panels), 3)
    rows = -(-len(panels) // cols)
    fig, axes = figure(4.2 * cols + 0.8, 3.4 * rows, rows, cols)
    grids = [part.pivot_table(index="gamma_max", columns="threshold", values="_cell", aggfunc="max")
             for _, part in panels]
    values = np.concatenate([grid.to_numpy(float).ravel() for grid in grids])  # the cells drawn
    low, high = float(np.nanmin(values)), float(np.nanmax(values))
    speedups = "speedup" in names_of(table)
    if speedups and low < 1.0 < high:  # red slower, green faster than autoregressive decoding
        cmap, norm = "RdYlGn", TwoSlopeNorm(vcenter=1.0, vmin=low, vmax=high)
    else:  # one side of 1 (or not a speedup): spread the colours over the values there are
        cmap, norm = ("YlOrRd_r" if speedups and high <= 1.0 else "YlGn"), Normalize(low, high)
    image = None
    for ax, (key, _), grid in zip(axes.flat, panels, grids):
        cells = grid.to_numpy(float)
        image = ax.imshow(cells, origin="lower", aspect="auto", cmap=cmap, norm=norm)
        every = -(-grid.shape[1] // 8)  # at most 8 threshold labels: more overlap
        ax.set_xticks(range(0, grid.shape[1], every), [f"{t:g}" for t in grid.columns[::every]])
        ax.set_yticks(range(grid.shape[0]), [str(g) for g in grid.index])
        ax.set_xlabel("threshold")
        ax.set_ylabel("gamma_max")
        ax.set_title(" · ".join(short_run(k) if n == "run_id" else str(k) for n, k in zip(keys, key)), fontsize=9)
        best = np.unravel_index(np.nanargmax(cells), cells.shape)
        for (r, c), v in np.ndenumerate(cells):
            # Every value fits in a cell of a small grid; in a dense one only the best's does.
            if np.isfinite(v) and (grid.shape[1] <= 8 or (r, c) == best):
                ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=8,
                        bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.7})
        ax.add_patch(Rectangle((best[1] - 0.5, best[0] - 0.5), 1, 1, fill=False, lw=2, ec="black"))
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.colorbar(image, ax=axes, label=names_of(table), shrink=0.9)
    return fig


def temperature_axis(rows: pd.DataFrame) -> Figure:
    """The best policy of each task's sweeps against their temperature (one sweep per
    temperature, reporting.report's temperature_rows): its threshold, gamma_max and tokens per
    round; where a greedy sweep of the task is among them, the greedy-tuned policy's predicted
    speedup at each temperature beside the best one's."""
    panels = [("threshold", "best policy's threshold"), ("gamma_max", "best policy's γ_max"),
              ("tokens_per_round", "tokens_per_round (best)"), ("predicted_speedup", "predicted speedup")]
    fig, axes = figure(13, 3.4, 1, len(panels), sharex=True)  # which policy won: the caption says
    for i, (task, group) in enumerate(rows.sort_values("temperature").groupby("task", sort=True)):
        color = f"C{i}"
        for ax, (column, title) in zip(axes[0], panels):
            ax.plot(group["temperature"], group[column], marker="o", color=color, label=f"{task}: tuned at each T")
            if column == "predicted_speedup" and group["greedy_tuned_speedup"].notna().any():
                ax.plot(group["temperature"], group["greedy_tuned_speedup"], marker="s", linestyle="--", color=color,
                        label=f"{task}: tuned at T = 0")
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("temperature")
    axes[0][0].set_ylim(0, 1)  # a goodput or budget winner has no threshold: no point
    axes[0][1].set_ylim(0, rows["gamma_max"].max() + 1)
    axes[0][-1].axhline(1.0, color="grey", linewidth=0.8)
    axes[0][-1].legend(fontsize=8)
    return fig

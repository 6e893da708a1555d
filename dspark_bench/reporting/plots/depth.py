"""Against context depth: a depth search's acceptance, choices and speedup per bucket
(rows of reporting.depth_tables.depth_search_rows: one per task, role, source and bucket)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.legend_handler import HandlerTuple
from matplotlib.lines import Line2D

from dspark_bench.depth import DEPTH_LABELS
from dspark_bench.reporting.plots.base import figure

# The roles of depth_search_rows, drawn in this order; colours as the other figures' best and fixed γ.
ROLES = {"depth policy": "#8e44ad", "best single policy": "#e6a100", "best fixed γ": "#3a63c4"}
CHOSEN = "each bucket's best"  # the depth search's choice per bucket: panels (b) and (c)
MARKERS, LINES = ("o", "s", "^", "D", "v", "P"), ("-", "--", ":", "-.")
MEASURED_SHIFT, MEASURED_STEP = 0.1, 0.07  # measured points right of their bucket (cut by prompt, not round)


def bucket_order(rows: pd.DataFrame) -> list[str]:
    """The buckets any row has, shallowest first (DEPTH_LABELS order; unknown names after)."""
    seen = list(dict.fromkeys(rows["depth_bucket"]))
    known = {b: i for i, b in enumerate(DEPTH_LABELS)}
    return sorted(seen, key=lambda b: (known.get(b, len(known)), seen.index(b)))


def _line(ax, x, y, color: str, style: tuple[str, str], thick: bool) -> None:
    """One series; the depth policy wide and pale beneath the others, so a policy it equals shows through."""
    line, marker = style
    if not len(x):
        return
    if thick:
        ax.plot(x, y, line, color=color, lw=7, alpha=0.3, solid_capstyle="round", zorder=1)
        ax.plot(x, y, line, color=color, lw=1.2, marker=marker, ms=6, zorder=2)
    else:
        ax.plot(x, y, line, color=color, lw=1.8, marker=marker, ms=5, zorder=3)


def depth_axis(rows: pd.DataFrame, title: str = "") -> Figure:
    """Four panels against the depth bucket, one line and marker style per task: (a) acceptance_rate
    of the depth policy, the best single policy and the best fixed γ, replayed by the depth each round
    started at; (b) and (c) the γ_max and threshold the search chose in each bucket (threshold 0: a
    fixed γ; none, a gap: goodput, which reads none); (d) the three policies' predicted speedup per
    bucket, and the measured speedup (95 % interval) of the confirmed depth policy and best single
    policy over the prompts whose length falls in each bucket, beside it."""
    order = bucket_order(rows)
    where = {b: i for i, b in enumerate(order)}
    tasks = list(dict.fromkeys(rows["task"]))
    styles = {t: (LINES[i % len(LINES)], MARKERS[i % len(MARKERS)]) for i, t in enumerate(tasks)}
    nudge = {t: 0.05 * (i - (len(tasks) - 1) / 2) for i, t in enumerate(tasks)}  # tasks side by side
    timed = [r for r in ROLES if ((rows["role"] == r) & (rows["source"] == "measured")).any()]
    fig, axes = figure(12, 7.6, 2, 2, sharex=True)
    (accept, gamma), (threshold, speed) = axes
    for t, task in enumerate(tasks):
        style = styles[task]

        def series(role: str, source: str = "replay", shift: float = 0.0, task=task) -> pd.DataFrame:
            part = rows[(rows["task"] == task) & (rows["role"] == role) & (rows["source"] == source)]
            return part.assign(x=part["depth_bucket"].map(where).astype(float) + nudge[task] + shift).sort_values("x")

        for role, color in ROLES.items():
            part = series(role)
            _line(accept, part["x"], part["acceptance_rate"], color, style, role == "depth policy")
            _line(speed, part["x"], part["predicted_speedup"], color, style, role == "depth policy")
        chosen = series(CHOSEN)
        _line(gamma, chosen["x"], chosen["gamma_max"], ROLES["depth policy"], style, False)
        _line(threshold, chosen["x"], chosen["threshold"], ROLES["depth policy"], style, False)
        for i, role in enumerate(timed):  # side by side: each task's, each policy's
            part = series(role, "measured", MEASURED_SHIFT + MEASURED_STEP * (t * len(timed) + i) - nudge[task])
            speed.errorbar(part["x"], part["speedup"], yerr=[part["speedup"] - part["speedup_low"],
                                                             part["speedup_high"] - part["speedup"]],
                           fmt=style[1], mfc="white", color=ROLES[role], capsize=3, ms=6, lw=1.4, zorder=4)
    speed.axhline(1.0, color="grey", ls=":", lw=1.2, zorder=0)
    top = np.nanmax(rows["gamma_max"].to_numpy(float)) if rows["gamma_max"].notna().any() else 1
    gamma.set_ylim(0, top + 1)
    gamma.yaxis.get_major_locator().set_params(integer=True)
    threshold.set_ylim(-0.05, 1.05)
    accept.set_ylim(0, 1.05)
    panels = ((accept, "(a) acceptance_rate, replayed", "acceptance_rate"),
              (gamma, "(b) γ_max the search chose in each bucket", "gamma_max"),
              (threshold, "(c) threshold the search chose in each bucket", "threshold (0: fixed γ)"),
              (speed, "(d) speedup over autoregressive", "speedup (1: autoregressive)"))
    for ax, name, label in panels:
        ax.set_title(name, fontsize=10, loc="left")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.set_xticks(range(len(order)), order)
        ax.set_xlim(-0.35, len(order) - 0.8 + MEASURED_SHIFT + MEASURED_STEP * len(tasks) * len(timed))
        ax.tick_params(labelbottom=True)
    for ax in (accept, gamma, threshold):
        ax.set_xlabel("depth bucket: tokens in the context when a round starts")
    speed.set_xlabel("depth bucket: a round's start (predicted) or the prompt's length (measured)")
    fig.legend(*_legend(rows, tasks, styles), loc="outside lower center", ncols=3, fontsize=8, frameon=False,
               handler_map={tuple: HandlerTuple(ndivide=None, pad=0)})
    fig.suptitle(title or "Against context depth. Predicted by replay: acceptance, each bucket's best policy and "
                 "speedup, cut by the depth a round starts at.\nMeasured (hollow, 95 % interval): the confirmed "
                 "policies' speedup over the prompts whose length falls in the bucket.", fontsize=10)
    return fig


def _legend(rows: pd.DataFrame, tasks: list, styles: dict) -> tuple[list, list[str]]:
    """(handles, labels): colours name the policies (with their labels where one task is shown),
    styles the tasks, filled and hollow markers predicted and measured."""
    shown = []
    for role, color in ROLES.items():
        named = rows.loc[rows["role"] == role, "config_label"].dropna().unique()
        thin = Line2D([], [], color=color, lw=1.8)
        shown.append(((Line2D([], [], color=color, lw=7, alpha=0.3), thin) if role == "depth policy" else thin,
                      f"{role}: {named[0]}" if len(tasks) == 1 and len(named) else role))
    shown.append((Line2D([], [], color=ROLES["depth policy"], marker="o", lw=1.8),
                  "(b), (c): the depth policy's choice per bucket"))
    if len(tasks) > 1:
        shown += [(Line2D([], [], color="black", ls=styles[t][0], marker=styles[t][1]), str(t)) for t in tasks]
    shown += [(Line2D([], [], color="grey", marker="o", lw=1.8), "predicted (replay; rounds by their start)"),
              (Line2D([], [], color="grey", marker="o", mfc="white", ls="none"),
               "measured (timed; prompts by their length, 95 % CI)")]
    return [h for h, _ in shown], [label for _, label in shown]

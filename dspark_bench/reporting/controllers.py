"""The report's figure of the engines' own controllers (sections/controllers.py, whose tables the
report places): the draft length each controller picks step by step as it serves the sweep's
prompts (how fast it adapts, where it oscillates), and the rows set side by side by batch size and,
under load, by arrival rate. Everything here is replayed, measured where the confirm stage timed it."""

from __future__ import annotations

import numpy as np
from matplotlib.patches import Patch

from dspark_bench import schedules
from dspark_bench.reporting.plots.base import figure
from dspark_bench.reporting.report_inputs import Inputs, Skip
from dspark_bench.results import read_parquet
from dspark_bench.sections.controllers import FIXED, OURS, EngineControllers

# A controller's rows in one hue (tuned dark, at its defaults light), in the registry's order; fixed γ
# gray, our best red: one color a row, every panel.
HUES = [("#3a63c4", "#9db4ea"), ("#2e9e4f", "#98d8a8"), ("#8a4fbf", "#c9a8e6"), ("#b5651d", "#e3b48a")]
PLAIN = {FIXED: "#555555", OURS: "#d6423b"}


def row_colors(roles) -> dict:
    """Each row's color: its controller's hue (SGLang's, TensorRT-LLM's, vLLM's), or fixed γ's or ours."""
    hues = dict(zip(schedules.names(controlled=True), HUES))
    colors = {}
    for role in roles:
        name = role.split(" · ")[0]
        colors[role] = PLAIN.get(role) or hues[name][role.endswith("its defaults")]
    return colors


def controllers_of(inputs: Inputs):
    """The first run folder's controllers section and its steps, if any has them."""
    for run_id, summary in inputs.summaries.items():
        found = EngineControllers.from_json(summary)
        if found is not None:
            return found, read_parquet(inputs.folder_of[run_id] / found.table)
    raise Skip("no engine controller in the sweep (sweep --schedule sglang-adaptive, trtllm-schedule or "
               "vllm-adaptive)")


def steps_panel(ax, steps, batch_size: int, colors: dict) -> None:
    """The length each controller row picked at every step of its walk at `batch_size` (vLLM's: the
    mean length it verified of the K drafted), with the step's mean accepted drafts beneath it (thin)."""
    here = steps[steps["batch_size"] == batch_size]
    for role, rows in here.groupby("role", sort=False):
        color = colors[role]
        ax.step(rows["step"], rows["length"], where="post", color=color, label=f"{role}: length picked")
        ax.plot(rows["step"], rows["accepted"], color=color, alpha=0.35, lw=0.8)
    ax.set_title(f"B = {batch_size}", fontsize=9)
    ax.set_xlabel("step (the sweep's prompts served in turn)")
    ax.set_ylabel("draft length (thin: mean accepted)")
    ax.grid(alpha=0.3)


def rows_panel(ax, groups: list[tuple[str, list[dict]]], column: str, name: str, colors: dict) -> None:
    """Grouped bars: one group per batch size or load, one bar per row (role), each row's `column`
    relative to the best fixed γ's in its group (%): the differences, which bars from 0 would hide."""
    roles = [role for role in dict.fromkeys(r["role"] for _, rows in groups for r in rows) if role != FIXED]
    width = 0.8 / max(len(roles), 1)
    for j, role in enumerate(roles):
        heights = []
        for _, rows in groups:
            fixed = next((r[column] for r in rows if r["role"] == FIXED), None)
            mine = next((r[column] for r in rows if r["role"] == role), None)
            heights.append(np.nan if not fixed or mine is None else 100 * (mine / fixed - 1))
        ax.bar(np.arange(len(groups)) + j * width, heights, width, color=colors[role], label=role)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(np.arange(len(groups)) + width * (len(roles) - 1) / 2, [g for g, _ in groups], fontsize=8)
    ax.set_ylabel(f"{name} vs best fixed γ (%)")
    ax.grid(alpha=0.3, axis="y")


def controllers_figure(inputs: Inputs):
    found, steps = controllers_of(inputs)
    sizes = [b["batch_size"] for b in found.by_batch][:3]
    roles = dict.fromkeys(r["role"] for part in (*found.by_batch, *found.by_rate) for r in part["rows"])
    colors = row_colors(roles)
    fig, axes = figure(13, 7.5, 2, max(len(sizes), 2))
    for ax, batch_size in zip(axes[0], sizes):
        steps_panel(ax, steps, batch_size, colors)
    rows_panel(axes[1][0], [(f"B={b['batch_size']}", b["rows"]) for b in found.by_batch], "predicted_speedup",
               "predicted speedup", colors)
    if found.by_rate:
        rows_panel(axes[1][1], [(rate["arrival"], rate["rows"]) for rate in found.by_rate], "tpot_p50_s",
                   "TPOT p50 (lower: better)", colors)
    free = [*axes[0][len(sizes):], *axes[1][1 + bool(found.by_rate):]]
    for ax in free:
        ax.set_axis_off()
    # One legend for every panel (a row's color is the same in each), where a panel is free, else below.
    handles = [Patch(color=color, label=role) for role, color in colors.items()]
    (free[-1].legend(handles=handles, fontsize=8, loc="center") if free
     else fig.legend(handles=handles, fontsize=7, loc="lower center", ncol=4))
    caption = ("Top: the draft length each engine controller picks at every step of the sweep's prompts served in "
               "turn (replayed; at its engine's defaults and tuned), thin lines the step's mean accepted drafts. "
               "Bottom: each controller at its defaults and tuned and our best policy against the best fixed γ, by "
               "batch size (predicted speedup, higher is better) and, under load, by arrival rate (median time per "
               "output token, lower is better). "
               f"{found.verdict[0].upper()}{found.verdict[1:]}.")
    return fig, caption

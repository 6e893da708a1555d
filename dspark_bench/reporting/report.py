"""Run folders -> figures, report.md and a self-contained report.html.

`build_report` reads one or more run folders (runs or sweeps) with `results.load` /
`load_table`, draws the figures of `plots`, and writes them under `plots/` beside `report.md`
and `report.html` (figures embedded as data URIs) — in the first run folder, or `out`. Every
file is written under a temporary name and renamed into place, so a crash never leaves a
half-written report and the run's own results are never touched. A figure whose data is absent
is skipped, and report.md says why.
"""

from __future__ import annotations

import base64
import io
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from dspark_bench import schedules
from dspark_bench.errors import DsparkError, first_line
from dspark_bench.objectives import OBJECTIVES
from dspark_bench.reporting import plots
from dspark_bench.reporting.batch_sizes import batch_blocks, batch_rows
from dspark_bench.reporting.controllers import controllers_figure
from dspark_bench.reporting.depth_tables import depth_figure
from dspark_bench.reporting.reliability import reliability_data, reliability_figure
from dspark_bench.reporting.report_inputs import (
    Inputs,
    Skip,
    best_and_classic,
    engine_costs,
    load_inputs,
    run_objective,
    samples_of,
    section_blocks,
)
from dspark_bench.reporting.temperatures import temperature_figure
from dspark_bench.reporting.text import summary_blocks, to_html, to_markdown
from dspark_bench.reporting.under_load import load_figure
from dspark_bench.results import check_writable, describe_machine, evaluation_of, provenance, write_bytes, write_text
from dspark_bench.sections.analyses import Analyses
from dspark_bench.sections.base import END

FORMATS = ("png", "svg")
GROUPINGS = ("category", "task", "run")


# --- figures -----------------------------------------------------------------------------------


@dataclass
class FigureItem:
    name: str  # file stem under plots/
    title: str
    caption: str = ""
    figure: object = None
    skipped: str = ""  # why there is no figure


def _attempt(items: list, name: str, title: str, build: Callable) -> None:
    try:
        figure, caption = build()
        items.append(FigureItem(name, title, caption, figure))
    except (Skip, ValueError) as reason:
        items.append(FigureItem(name, title, skipped=str(reason)))


def make_figures(inputs: Inputs, by: str | None = None) -> list[FigureItem]:
    """Every figure of the report, in order; absent data gives a skipped item with a reason."""
    policies = inputs.policies
    best, classic = best_and_classic(inputs)
    items: list[FigureItem] = []
    _attempt(items, "threshold_curves", "1. Policy metrics against the threshold",
             lambda: _curves(inputs, by, best))
    _attempt(items, "speedup_heatmap", "2. Speedup over threshold × gamma_max", lambda: _heatmap(policies))
    _attempt(items, "position_acceptance", "3. Per-position acceptance",
             lambda: _positions(inputs, by))
    _attempt(items, "reliability", "4. Signal reliability: confidence against acceptance",
             lambda: reliability_figure(inputs))
    _attempt(items, "stop_reasons", "5. Stop reasons and draft lengths of the best configuration",
             lambda: _stops(inputs, best))
    _attempt(items, "best_vs_classic", "6. Best against classic and autoregressive",
             lambda: _best_vs_classic(inputs, by or "category"))
    items += _optuna_items(inputs)
    _attempt(items, "round_trace", "8. Round trace of one prompt", lambda: _trace(inputs, best, classic))
    _attempt(items, "batch_sizes", "9. Speedup and tokens/s against batch size", lambda: _batch_sizes(inputs))
    _attempt(items, "signal_headroom", "10. How good a signal the rules would need", lambda: _signal_headroom(inputs))
    _attempt(items, "paired_ratios", "11. Paired on the same prompts: each policy against the best fixed γ",
             lambda: _paired(inputs))
    _attempt(items, "engine_costs", "12. What a round costs in each engine", lambda: _engine_costs(inputs))
    _attempt(items, "temperatures", "13. The best policy against the traffic's temperature",
             lambda: temperature_figure(inputs))
    _attempt(items, "depth", "14. Acceptance, best policy and speedup by context depth", lambda: depth_figure(inputs))
    _attempt(items, "under_load", "15. Throughput and time per output token against the arrival rate",
             lambda: load_figure(inputs))
    _attempt(items, "controllers", "16. The engines' own controllers: lengths picked, and beside fixed γ and ours",
             lambda: controllers_figure(inputs))
    return items


def _engine_costs(inputs):
    found = {label: cost for folder in inputs.folders for label, cost in engine_costs(folder).items()}
    if len(found) < 2:
        raise Skip("one engine's costs only (a llama.cpp run, or a sweep with --prices, prices two)")
    return plots.verify_curves(found, "what a round costs in each engine, relative to its own plain step"), (
        "Each engine's cost model (replay/cost_file.py): a verify pass over k drafted tokens (plus the engine's fixed "
        "cost per round) and one draft step, each over that engine's own plain decoding step, and in milliseconds. "
        "A policy's worth follows these ratios, not the engine's speed: where verifying even one drafted token costs "
        "much more than a plain step, short drafts lose and the best policy differs from engine to engine.")


def _paired(inputs):
    found = [(run_id, s["verdicts"]) for run_id, s in inputs.summaries.items() if s.get("verdicts")]
    if not found:
        raise Skip("no paired verdicts (a run or sweep that timed a fixed γ beside other policies)")
    run_id, verdicts = found[0]
    headline = inputs.summaries[run_id].get("headline")
    return plots.paired_ratios(verdicts, f"paired on the same prompts ({plots.short_run(run_id)})"), (
        "Each policy against the best fixed γ at its batch size, on the same prompts and passes: the reference's "
        "seconds per generated token over the policy's (> 1: the policy is faster). Dots are single prompts, the bar "
        "the ratio over all of them with its 95 % bootstrap interval (prompts, then passes within them); prompt "
        "difficulty cancels in the pair, so it decides what two overlapping speedup intervals cannot."
        + (f" Headline: {headline['sentence']}." if headline else ""))


def _signal_headroom(inputs):
    found = [(run_id, analyses.signal_headroom) for run_id, s in inputs.summaries.items()
             if (analyses := Analyses.from_json(s)) is not None and analyses.signal_headroom]
    if not found:
        raise Skip("no replay sweep with a learned signal (sweep --task T with the draft model)")
    run_id, rows = found[0]
    return plots.signal_headroom(pd.DataFrame(rows),
                                 f"how good a signal the rules would need ({plots.short_run(run_id)})"), (
        "The share of the oracle's gain over the best fixed γ that the best threshold or cumulative rule captures, "
        "against the AUC of the signal it stops on: the learned signal (dotted line) and the same with more evidence "
        "of each drafted token's verdict in its log-odds, up to the verdict itself. Predicted by replay; the signal's "
        "cost left out. Batch size 1 and the packed layout; padded, where the longest row sets every pass and the "
        "oracle is within about 1 % of fixed γ, is in the Headroom section's table.")


def _batch_sizes(inputs):
    if inputs.batched is None:
        raise Skip("no sweep over batch sizes (sweep --batch-size 1 --batch-size 8 ...)")
    rows = batch_rows(inputs.batched)
    return plots.batch_sizes(rows), (
        "Speedup against the batched autoregressive baseline (left) and whole-batch tokens/s (right) per batch size: "
        "the best confidence-scheduled policy and the best fixed gamma at each B. Dashed: predicted by replay and "
        "the cost surface, padded and packed layouts. Solid with 95 % intervals: measured, padded layout (the "
        "batched decoder), where the sweep confirmed them. Packed is predicted only. Predicted tokens/s come from "
        "the cost surface's absolute step times, timed once when the sweep started: where the machine's speed "
        "drifts they sit off the measured ones, while the speedup, a ratio, holds.")


def _curves(inputs, by, best):
    policies = inputs.policies
    if best is None:
        raise Skip("no confidence-scheduled configuration")
    schedule = best["schedule"] if schedules.named(best["schedule"]).one_threshold else plots.THRESHOLD_SCHEDULES[0]
    rows = plots.complete(policies)
    rows = rows[(rows["metric"] == best["metric"]) & (rows["schedule"] == schedule)]
    if rows["threshold"].nunique() < 2:
        raise Skip(f"fewer than two thresholds of the {best['metric']} {schedule} schedule")
    caption = (f"Best configuration (star): {best['config_label']} by {inputs.column}. "
               "speedup with its 95 % bootstrap interval where measured; predicted_speedup (dashed) from the "
               "cost model where replayed.")
    return plots.threshold_curves(policies, inputs.column, by, objective=inputs.objective), caption


def _heatmap(policies):
    rows = plots.complete(policies)
    rows = rows[~schedules.where(rows, baseline=True)]
    cells = 0
    for _, part in rows.groupby("run_id"):
        value = plots.heatmap_value(part)
        if value in part:
            cells = max(cells, part[part[value].notna()]
                               .groupby(["metric", "schedule", "threshold", "gamma_max"]).ngroups)
    if cells < 2:
        raise Skip("fewer than two threshold × gamma_max cells with a speedup or predicted_speedup")
    return plots.speedup_heatmap(policies), (
        "Measured speedup where every configuration of a run was timed, else predicted_speedup (a replay's cost "
        "model; measured speedup exists only for its confirmed policies), as each panel's title says; best over "
        "other knobs; the framed cell is each panel's best; green above 1.0 (faster than autoregressive), red below.")


def _positions(inputs, by):
    if inputs.samples.empty or "position_drafted" not in inputs.samples:
        raise Skip("no samples.parquet with per-position counts")
    s, parts = inputs.samples, []
    several = inputs.policies["run_id"].nunique() > 1
    for run_id, policies in inputs.policies.groupby("run_id", sort=False):
        best, classic = best_and_classic(inputs, policies)
        labels = [row["config_label"] for row in (best, classic) if row is not None]
        if best is not None and not several:
            # The best policy's neighbours: the same metric, schedule and gamma_max at other thresholds.
            same = s[(s["metric"] == best["metric"]) & (s["schedule"] == best["schedule"])
                     & (s["gamma_max"] == best["gamma_max"]) & (s["min_draft_len"] == best["min_draft_len"])]
            labels += [label for label in dict.fromkeys(same.sort_values("threshold")["config_label"])
                       if label not in labels][:4]
        parts.append(s[(s["run_id"] == run_id) & s["config_label"].isin(labels)])
    chosen = pd.concat(parts, ignore_index=True)
    if chosen.empty:
        raise Skip("no samples of the best or classic configuration")
    return plots.position_acceptance(chosen), (
        "Share of rounds that drafted position k in which the target accepted it (accepted / drafted, summed over "
        "prompts): the best configuration and the classic fixed-gamma one (dashed) of each run"
        + ("" if several else ", and the best's neighbours at other thresholds") + ".")


def _stops(inputs, best):
    rows = samples_of(inputs, best)
    if rows.empty:
        raise Skip("no samples of the best configuration")
    lengths, source = None, "samples' position_drafted"
    r = inputs.rounds
    if not r.empty:
        traced = r[(r["run_id"] == best["run_id"]) & (r["config_label"] == best["config_label"])]
        if not traced.empty:
            lengths = traced["drafted"].value_counts().reindex(range(int(best["gamma_max"]) + 1), fill_value=0)
            source = "the per-round trace"
    return plots.stop_reasons(rows, lengths, title=str(best["config_label"])), (
        f"{best['config_label']}: why each round stopped drafting (stop_* counts of the samples) and how many "
        f"tokens it drafted (from {source}).")


def _best_vs_classic(inputs, by):
    if inputs.samples.empty or "spec_time_s" not in inputs.samples:
        raise Skip("no timed samples")
    parts, names = [], []
    for run_id, policies in inputs.policies.groupby("run_id", sort=False):
        best, classic = best_and_classic(inputs, policies)
        for role, row in (("best confidence-scheduled", best), ("best fixed γ (classic)", classic)):
            rows = samples_of(inputs, row)
            rows = rows[rows["spec_time_s"].notna()]
            if not rows.empty:
                parts.append(rows.assign(role=role))
                names.append(f"{role}: {row['config_label']}" + (f" ({plots.short_run(run_id)})"
                                                                if inputs.policies["run_id"].nunique() > 1 else ""))
    if not parts:
        raise Skip("no timed samples of the best configuration")
    table = pd.concat(parts, ignore_index=True)
    group = {"run": "run", "task": "task"}.get(by, "category")
    if group == "run":
        table["run"] = table["run_id"].map(plots.short_run)
    missing = "" if any("classic" in n for n in names) else \
        (" No fixed-gamma configuration was measured (add `--schedule fixed` to compare with classic speculative "
         "decoding).")
    return plots.speedup_by_group(table, group=group), (
        "; ".join(names) + f". Speedup per {group} with 95 % bootstrap intervals over prompts; the dashed line is "
        f"autoregressive decoding (1.0).{missing}")


def open_study(info: dict, folder: Path):
    """The Optuna study of a real sweep, or a reason why not (never creates a database)."""
    import optuna

    storage, name = info.get("storage"), info.get("study")
    if not storage or not name:
        raise Skip("the sweep keeps no study")
    if storage.startswith("sqlite:///"):
        path = Path(storage.removeprefix("sqlite:///"))
        if not path.is_file():
            path = folder / "study.db"  # the run folder moved since the sweep
            if not path.is_file():
                raise Skip(f"study database {storage} is gone")
            storage = f"sqlite:///{path.resolve()}"
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except Exception as err:  # an unreachable server, a missing study
        raise Skip(f"cannot open study {name!r}: {first_line(err, 160)}") from None


def _optuna_items(inputs: Inputs) -> list[FigureItem]:
    items: list[FigureItem] = []
    real = [(run_id, info) for run_id, info in inputs.infos.items()
            if info.get("kind") == "sweep" and evaluation_of(info) == "real"]
    if not real:
        return [FigureItem("optuna", "7. Optuna study", skipped="no real (grid or Optuna) sweep among the runs")]
    for run_id, info in real:
        suffix = f"_{plots.short_run(run_id)}" if len(real) > 1 else ""
        where = f" ({plots.short_run(run_id)})" if len(real) > 1 else ""
        names = list((info.get("spec") or {}).get("objective") or ["speedup"])
        method = (info.get("spec") or {}).get("method", "grid")
        trials = inputs.policies[inputs.policies["run_id"] == run_id]

        def history(trials=trials, names=names, method=method):
            if "objective_0" not in trials:
                raise Skip("no complete trial")
            return plots.optimization_history(trials, "objective_0", OBJECTIVES[names[0]].direction,
                                              names[0]), (
                f"{method} sweep: {names[0]} of every complete trial and the best so far; grey lines mark failed "
                "or pruned trials.")

        _attempt(items, f"optuna_history{suffix}", f"7. Optimisation history{where}", history)
        try:
            study = open_study(info, inputs.folder_of[run_id])
        except Skip as reason:
            items.append(FigureItem(f"optuna_importances{suffix}", f"7. Parameter importances{where}",
                                    skipped=str(reason)))
            continue
        _attempt(items, f"optuna_importances{suffix}", f"7. Parameter importances{where}",
                 lambda study=study, names=names: (plots.param_importances(study, names[0]),
                                                   f"Optuna's fANOVA importance of each searched knob for {names[0]}."))
        if len(study.directions) > 1:
            _attempt(items, f"optuna_pareto{suffix}", f"7. Pareto front{where}",
                     lambda study=study, names=names: (plots.pareto_front(study, names),
                                                       f"Trials on the Pareto front of {' and '.join(names)}."))
    return items


def _trace(inputs, best, classic):
    r = inputs.rounds
    if r.empty:
        raise Skip("no per-round trace (run with --trace)")
    run_id = best["run_id"] if best is not None and (r["run_id"] == best["run_id"]).any() else r["run_id"].iloc[0]
    r = r[r["run_id"] == run_id]
    labels = [row["config_label"] for row in (best, classic) if row is not None and row["run_id"] == run_id]
    labels = [label for label in labels if (r["config_label"] == label).any()]
    prompt = r[r["config_label"] == labels[0]]["prompt_id"].iloc[0] if labels else r["prompt_id"].iloc[0]
    ordered = r.sort_values(["gamma_max", "threshold"])["config_label"]
    labels += [label for label in dict.fromkeys(ordered) if label not in labels]
    labels = labels[:8]
    return plots.round_trace(r, prompt, labels), (
        f"Prompt {prompt} of {plots.short_run(run_id)}, up to eight configurations (best first): every round's "
        "accepted draft tokens (green) and the target's token (blue) along the output; rejected draft tokens (red) "
        "in the thin lane above, where they would have gone.")


def render_figure(fig, fmt: str) -> bytes:
    buffer = io.BytesIO()
    metadata = {"Date": None} if fmt == "svg" else None  # byte-stable SVGs
    fig.savefig(buffer, format=fmt, dpi=110, metadata=metadata)
    return buffer.getvalue()


def build_report(paths, out: Path | None = None, fmt: str = "png", by: str | None = None) -> Path:
    """Figures, report.md and report.html for one or more run folders; returns report.md's path.

    Written into the first run folder (figures under its plots/) or `out`. Each file goes to a
    temporary name first and is renamed into place; results themselves are never touched.
    """
    if fmt not in FORMATS:
        raise DsparkError(f"--format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    if by is not None and by not in GROUPINGS:
        raise DsparkError(f"--by must be one of {', '.join(GROUPINGS)} (got {by!r})")
    inputs = load_inputs(paths)
    dest = check_writable(Path(out) if out is not None else inputs.folders[0])
    figure_dir = check_writable(dest / "plots")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # tight layouts of tiny data; nothing to act on
        items = make_figures(inputs, by)
    runs = ", ".join(plots.short_run(r) for r in inputs.infos)
    blocks: list[tuple] = [("h1", f"dspark-bench report: {runs}")]
    blocks += summary_blocks(inputs)
    if inputs.batched is not None:
        blocks += batch_blocks(inputs.batched)
    blocks += section_blocks(inputs, END)
    blocks.append(("h2", "Figures"))
    html_blocks = list(blocks)
    mime = {"png": "image/png", "svg": "image/svg+xml"}[fmt]
    for item in items:
        if item.figure is None:
            continue
        data = render_figure(item.figure, fmt)
        write_bytes(figure_dir / f"{item.name}.{fmt}", data)
        relative = os.path.relpath(figure_dir / f"{item.name}.{fmt}", dest)
        uri = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
        blocks += [("h3", item.title), ("figure", item.title, relative, None, item.caption)]
        html_blocks += [("h3", item.title), ("figure", item.title, relative, uri, item.caption)]
    skipped = [f"{item.title}: skipped, {item.skipped}" for item in items if item.figure is None]
    if skipped:
        for target in (blocks, html_blocks):
            target += [("h2", "Skipped figures"), ("ul", skipped)]
    made = provenance()
    footer = (f"Made {made['created']} by dspark-bench {made['environment'].get('git_commit') or '(no git commit)'} "
              f"on {describe_machine(made['environment'])}, from {', '.join(str(f) for f in inputs.folders)}.")
    for target in (blocks, html_blocks):
        target.append(("p", footer))
    write_text(dest / "report.html", to_html(html_blocks, f"dspark-bench report: {runs}"))
    write_text(dest / "report.md", to_markdown(blocks))
    return dest / "report.md"


def figures_written(report_md: Path) -> list[str]:
    """The figure files a report.md refers to, in order (for tests and tools)."""
    text = Path(report_md).read_text()
    return [line.split("](", 1)[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]


__all__ = ["build_report", "load_inputs", "make_figures", "reliability_data", "Inputs", "FigureItem", "Skip",
           "best_and_classic", "figures_written", "run_objective", "samples_of"]

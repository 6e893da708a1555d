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
import dataclasses
import html
import io
import os
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from dspark_bench import plots
from dspark_bench.config import DecodeConfig
from dspark_bench.errors import DsparkError
from dspark_bench.results import check_writable, describe_machine, load, load_table, read_json

FORMATS = ("png", "svg")
GROUPINGS = ("category", "task", "run")
SUMMARY_METRICS = ("tokens_per_round", "acceptance_rate", "avg_draft_len", "block_acceptance_rate",
                   "accepted_per_round")
KNOBS = tuple(f.name for f in dataclasses.fields(DecodeConfig))


class Skip(Exception):
    """A figure whose data is absent; its message goes into report.md."""


# --- inputs ------------------------------------------------------------------------------------


@dataclass
class Inputs:
    folders: list[Path]
    infos: dict[str, dict]  # run_id -> run.json
    summaries: dict[str, dict]  # run_id -> summary.json
    policies: pd.DataFrame  # one row per configuration / trial / simulated policy
    samples: pd.DataFrame
    rounds: pd.DataFrame
    objective: str = "speedup"
    folder_of: dict[str, Path] = field(default_factory=dict)


def load_inputs(paths) -> Inputs:
    """Everything the report draws on, from one or more run folders."""
    folders = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    policies = load(folders)  # refuses a folder without run.json
    infos, summaries, folder_of = {}, {}, {}
    for folder in folders:
        info = read_json(folder / "run.json", "run file")
        run_id = info.get("run_id") or folder.name
        infos[run_id], folder_of[run_id] = info, folder
        summary_path = folder / "summary.json"
        summaries[run_id] = read_json(summary_path, "summary file") if summary_path.is_file() else {}
    policies = _with_knobs(policies, infos)
    renamed = {folder.name: run_id for run_id, folder in folder_of.items()}
    samples, rounds = (load_table(folders, name) for name in ("samples", "rounds"))
    for table in (samples, rounds):
        if not table.empty:
            table["run_id"] = table["run_id"].map(lambda name: renamed.get(name, name))
            table["task"] = table["run_id"].map(lambda r: (infos[r].get("prompts") or {}).get("task")
                                                or (infos[r].get("prompts") or {}).get("dataset"))
    if policies.empty or not any(c in policies for c in ("speedup", "predicted_speedup", "tokens_per_round")):
        raise DsparkError("the run folder(s) hold no measured or simulated configuration to report on")
    return Inputs(folders, infos, summaries, policies, samples, rounds, plots.objective_column(policies), folder_of)


def _with_knobs(policies: pd.DataFrame, infos: dict) -> pd.DataFrame:
    """A run's summary rows carry only config_id and label; add the config fields from run.json."""
    policies = policies.copy()
    for knob in KNOBS:
        if knob not in policies:
            policies[knob] = None
    for index, row in policies.iterrows():
        configs = infos.get(row["run_id"], {}).get("configs") or []
        if pd.isna(row.get("metric")) and pd.notna(row.get("config_id")) and int(row["config_id"]) < len(configs):
            for knob, value in configs[int(row["config_id"])].items():
                if knob in policies:
                    policies.at[index, knob] = value
    for knob in ("threshold", "threshold_start", "threshold_end", "temperature", "top_p"):
        policies[knob] = pd.to_numeric(policies[knob], errors="coerce")
    for knob in ("gamma_max", "min_draft_len"):
        policies[knob] = pd.to_numeric(policies[knob], errors="coerce").astype("Int64")
    return policies


def best_and_classic(policies: pd.DataFrame, objective: str) -> tuple[pd.Series | None, pd.Series | None]:
    return plots.best_row(policies, objective), plots.best_row(policies, objective, fixed=True)


def samples_of(inputs: Inputs, row: pd.Series | None) -> pd.DataFrame:
    """The per-prompt samples of one policy row (same run, same configuration label)."""
    if row is None or inputs.samples.empty:
        return inputs.samples.iloc[:0]
    s = inputs.samples
    return s[(s["run_id"] == row["run_id"]) & (s["config_label"] == row["config_label"])]


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
    policies, objective = inputs.policies, inputs.objective
    best, classic = best_and_classic(policies, objective)
    items: list[FigureItem] = []
    _attempt(items, "threshold_curves", "1. Policy metrics against the threshold",
             lambda: _curves(policies, objective, by, best))
    _attempt(items, "speedup_heatmap", "2. Speedup over threshold × gamma_max", lambda: _heatmap(policies))
    _attempt(items, "position_acceptance", "3. Per-position acceptance",
             lambda: _positions(inputs, by))
    _attempt(items, "calibration", "4. Confidence calibration", lambda: _calibration(inputs))
    _attempt(items, "stop_reasons", "5. Stop reasons and draft lengths of the best configuration",
             lambda: _stops(inputs, best))
    _attempt(items, "best_vs_classic", "6. Best against classic and autoregressive",
             lambda: _best_vs_classic(inputs, by or "category"))
    items += _optuna_items(inputs)
    _attempt(items, "round_trace", "8. Round trace of one prompt", lambda: _trace(inputs, best, classic))
    return items


def _curves(policies, objective, by, best):
    if best is None:
        raise Skip("no confidence-scheduled configuration")
    schedule = best["schedule"] if best["schedule"] in plots.THRESHOLD_SCHEDULES else "threshold"
    rows = plots.complete(policies)
    rows = rows[(rows["metric"] == best["metric"]) & (rows["schedule"] == schedule)]
    if rows["threshold"].nunique() < 2:
        raise Skip(f"fewer than two thresholds of the {best['metric']} {schedule} schedule")
    caption = (f"Best configuration (star): {best['config_label']} by {objective}. "
               "speedup with its 95 % bootstrap interval where measured; predicted_speedup (dashed) from the "
               "cost model where replayed.")
    return plots.threshold_curves(policies, objective, by), caption


def _heatmap(policies):
    rows = plots.complete(policies)
    rows = rows[rows["schedule"] != "fixed"]
    cells = 0
    for _, part in rows.groupby("run_id"):
        value = plots.heatmap_value(part)
        if value in part:
            cells = max(cells, part[part[value].notna()].groupby(["metric", "schedule", "threshold", "gamma_max"]).ngroups)
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
        best, classic = best_and_classic(policies, inputs.objective)
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


def resolve_record(folder: Path, recorded: str) -> Path | None:
    """A replay record's folder: as written (absolute or from the sweep's working directory),
    else in the records/ folder beside the sweep (the default layout)."""
    path = Path(recorded)
    for candidate in (path, folder.parent / "records" / path.name, folder.parent.parent / path):
        if (candidate / "record.npz").is_file():
            return candidate
    return None


def calibration_data(inputs: Inputs) -> tuple[pd.DataFrame, str]:
    """(drafted tokens with metric, confidence, accepted; where they come from)."""
    for run_id, summary in inputs.summaries.items():
        if summary.get("record"):
            folder = resolve_record(inputs.folder_of[run_id], summary["record"])
            if folder is not None:
                from dspark_bench.replay import Record, match_lengths  # imports torch: only when needed

                rec = Record.load(folder)
                table = plots.confidences_from_record(rec.confidences, match_lengths(rec), rec.lengths)
                return table, (f"replay record of {plots.short_run(run_id)}: all metrics at every rollout step "
                               f"of {len(rec.lengths)} prompts")
    if not inputs.rounds.empty and "confidences" in inputs.rounds:
        table = plots.confidences_from_rounds(inputs.rounds)
        return table, ("per-round trace: each configuration's own metric; tokens the schedule kept, so low "
                       "confidences are rare")
    raise Skip("no replay record (a replay sweep's) and no per-round trace (run --trace)")


def _calibration(inputs):
    table, source = calibration_data(inputs)
    if table.empty:
        raise Skip("no drafted tokens in the record or trace")
    return plots.calibration(table, source=source), (
        f"Source: {source}. A drafted token counts when every token before it in its round was accepted; "
        "y = share of those accepted, x = mean confidence of the bin. AUC: how well the metric alone "
        "separates accepted from rejected tokens (0.5 = chance).")


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
        best, classic = best_and_classic(policies, inputs.objective)
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
        " No fixed-gamma configuration was measured (add `--schedule fixed` to compare with classic speculative decoding)."
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
        raise Skip(f"cannot open study {name!r}: {str(err).splitlines()[0][:160]}") from None


def _optuna_items(inputs: Inputs) -> list[FigureItem]:
    from dspark_bench.sweep import OBJECTIVES

    items: list[FigureItem] = []
    real = [(run_id, info) for run_id, info in inputs.infos.items()
            if info.get("kind") == "sweep" and info.get("engine") == "real"]
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
            return plots.optimization_history(trials, "objective_0", OBJECTIVES.get(names[0], "maximize"),
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
        f"Prompt {prompt} of {plots.short_run(run_id)}, up to eight configurations (best first): every round's accepted "
        "draft tokens (green) and the target's token (blue) along the output; rejected draft tokens (red) "
        "in the thin lane above, where they would have gone.")


# --- the summary -------------------------------------------------------------------------------


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)) or value is pd.NA:
        return "—"
    if isinstance(value, (float, np.floating)):
        return f"{value:.{digits}f}"
    return str(value)


def _speedup_cell(row: pd.Series) -> str:
    if pd.notna(row.get("speedup")):
        low, high = row.get("speedup_low"), row.get("speedup_high")
        interval = f" [{low:.2f}, {high:.2f}]" if pd.notna(low) and pd.notna(high) else ""
        return f"{row['speedup']:.2f}×{interval}"
    return "—"


def _policy_line(role: str, row: pd.Series | None, several: bool) -> list[str]:
    if row is None:
        return [role, "none measured"] + ["—"] * (3 + len(SUMMARY_METRICS))
    label = str(row["config_label"]) + (f" ({plots.short_run(row['run_id'])})" if several else "")
    predicted = row.get("predicted_speedup")
    return [role, label, _speedup_cell(row), _fmt(predicted, 2) if predicted is not None else "—",
            _fmt(row.get("spec_tokens_per_s"), 1)] + [_fmt(row.get(m)) for m in SUMMARY_METRICS]


def summary_blocks(inputs: Inputs) -> list[tuple]:
    """The one-screen summary: best vs classic vs autoregressive, cost model, environment."""
    policies, objective = inputs.policies, inputs.objective
    best, classic = best_and_classic(policies, objective)
    several = policies["run_id"].nunique() > 1
    header = ["", "configuration", "speedup [95% CI]", "predicted_speedup", "tokens/s"] + list(SUMMARY_METRICS)
    rows = [_policy_line("best", best, several), _policy_line("classic (best fixed γ)", classic, several),
            ["autoregressive", "target alone", "1.00×", "1.00", _fmt(_baseline_rate(best), 1), "1.000", "—", "0.000",
             "—", "0.000"]]
    blocks: list[tuple] = [("h2", "Summary"), ("table", header, rows)]
    ranked = {"speedup": "measured speedup", "predicted_speedup": "predicted_speedup (cost model)",
              "tokens_per_round": "tokens_per_round (no timing)"}[objective]
    text = f"Configurations ranked by {ranked} over {len(plots.complete(policies))} configurations or trials."
    if best is not None and classic is not None and pd.notna(best.get(objective)) and pd.notna(classic.get(objective)):
        text += (f" The best confidence-scheduled policy reaches {best[objective]:.2f}× against "
                 f"{classic[objective]:.2f}× for the best fixed gamma ({best[objective] / classic[objective]:.2f}× "
                 "relative).")
    elif classic is None:
        text += " No fixed-gamma (classic) configuration is among the runs: add `--schedule fixed` to compare."
    identical = policies.get("identical_to_baseline")
    if identical is not None and identical.notna().any():
        text += f" Outputs identical to the target's own: {identical.mean():.0%} of measured samples."
    elif best is not None and pd.notna(best.get("spec_mean_new_tokens")):
        text += (f" Sampled outputs differ by design; for the best configuration the mean sample length is "
                 f"{best['baseline_mean_new_tokens']:.1f} tokens (baseline) against {best['spec_mean_new_tokens']:.1f} "
                 f"(speculative), at {_fmt(best.get('baseline_tokens_per_s'), 1)} against "
                 f"{_fmt(best.get('spec_tokens_per_s'), 1)} tokens/s.")
    text += (" Speedup is the baseline's seconds per generated token over the speculative decoder's, on the same "
             "prompts in the same process, with a 95 % bootstrap interval over prompts.")
    if any(_settings_of(info).get("ignore_eos") for info in inputs.infos.values()):
        text += " Timed with EOS ignored: every sequence is exactly max_new_tokens long on both sides."
    blocks.append(("p", text))
    if several:
        per_run = []
        for run_id, part in policies.groupby("run_id", sort=False):
            b, c = best_and_classic(part, objective)
            per_run.append([plots.short_run(run_id), _fmt(part["task"].iloc[0]),
                            b["config_label"] if b is not None else "—", _fmt(b.get(objective), 2) if b is not None else "—",
                            c["config_label"] if c is not None else "—", _fmt(c.get(objective), 2) if c is not None else "—"])
        blocks += [("h3", "Per run"), ("table", ["run", "task", "best", objective, "classic", objective], per_run)]
    blocks += cost_model_blocks(inputs)
    blocks += environment_blocks(inputs)
    return blocks


def _settings_of(info: dict) -> dict:
    """The runner settings of a run (a sweep keeps them in its spec)."""
    return info.get("settings") or info.get("spec") or {}


def _baseline_rate(best: pd.Series | None):
    return best.get("baseline_tokens_per_s") if best is not None else None


def cost_model_blocks(inputs: Inputs) -> list[tuple]:
    blocks = []
    for run_id, summary in inputs.summaries.items():
        if summary.get("engine") != "replay":
            continue
        policies = inputs.policies
        if "source" not in policies:
            continue
        rows = policies[(policies["run_id"] == run_id) & (policies["source"] == "confirmed")]
        lines = [[r["config_label"], _fmt(r["predicted_speedup"], 2), _speedup_cell(r),
                  _fmt(r["speedup"] / r["predicted_speedup"], 2)] for _, r in rows.iterrows()]
        accuracy = summary.get("cost_model_accuracy") or {}
        cost = summary.get("cost_model") or {}
        text = (f"{summary.get('policies_simulated', len(rows))} policies simulated from one record; the best "
                f"{len(rows)} confirmed by timed runs. Measured / predicted speedup, median "
                f"{_fmt(accuracy.get('measured_over_predicted_median'), 2)}; mean absolute error "
                f"{_fmt(accuracy.get('mean_abs_error'), 3)}.")
        if cost:
            verify = ", ".join(f"{t * 1e3:.2f}" for t in cost.get("t_verify", []))
            text += f" Cost model: t_draft {cost['t_draft'] * 1e3:.2f} ms, t_verify(k = 0..) {verify} ms."
        where = f" ({plots.short_run(run_id)})" if len(inputs.summaries) > 1 else ""
        blocks += [("h3", f"Cost model accuracy{where}"), ("p", text),
                   ("table", ["configuration", "predicted_speedup", "speedup [95% CI]", "measured / predicted"], lines)]
    return blocks


def environment_blocks(inputs: Inputs) -> list[tuple]:
    rows = []
    for run_id, info in inputs.infos.items():
        env, models, prompts = info.get("environment") or {}, info.get("models") or {}, info.get("prompts") or {}
        kind = info.get("kind", "run") + (f" ({info['engine']})" if info.get("engine") else "")
        device = models.get("device", "—") + (f" · {env['cuda_device']}" if env.get("cuda_device") else "")
        versions = " ".join(f"{k} {env[k]}" for k in ("dspark_bench", "torch", "transformers", "optuna", "python")
                            if env.get(k))
        rows.append([plots.short_run(run_id), kind, f"{device} · {models.get('dtype', '—')}",
                     str(models.get("target", "—")), str(models.get("draft", "—")),
                     f"{prompts.get('task') or prompts.get('dataset') or '—'} ({prompts.get('count', '?')} prompts)",
                     describe_machine(env), versions, str(env.get("git_commit") or "—")])
    return [("h3", "Environment"),
            ("table", ["run", "kind", "device", "target", "draft", "task", "machine", "versions", "git"], rows)]


# --- rendering -----------------------------------------------------------------------------------


def render_figure(fig, fmt: str) -> bytes:
    buffer = io.BytesIO()
    metadata = {"Date": None} if fmt == "svg" else None  # byte-stable SVGs
    fig.savefig(buffer, format=fmt, dpi=110, metadata=metadata)
    return buffer.getvalue()


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: list[tuple]) -> str:
    out = []
    for block in blocks:
        kind = block[0]
        if kind in ("h1", "h2", "h3"):
            out.append("#" * int(kind[1]) + " " + block[1])
        elif kind == "p":
            out.append(block[1])
        elif kind == "table":
            header, rows = block[1], block[2]
            lines = ["| " + " | ".join(map(_md_cell, header)) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in rows]
            out.append("\n".join(lines))
        elif kind == "figure":
            _, title, path, _, caption = block
            out.append(f"![{title}]({path})\n\n{caption}")
        elif kind == "ul":
            out.append("\n".join(f"- {item}" for item in block[1]))
    return "\n\n".join(out) + "\n"


def _html_inline(text: str) -> str:
    # `code` spans are the only inline markup the report's paragraphs use.
    parts = html.escape(str(text)).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def to_html(blocks: list[tuple], title: str) -> str:
    body = []
    for block in blocks:
        kind = block[0]
        if kind in ("h1", "h2", "h3"):
            body.append(f"<{kind}>{_html_inline(block[1])}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{_html_inline(block[1])}</p>")
        elif kind == "table":
            head = "".join(f"<th>{_html_inline(h)}</th>" for h in block[1])
            rows = "".join("<tr>" + "".join(f"<td>{_html_inline(c)}</td>" for c in row) + "</tr>" for row in block[2])
            # Each table in its own box: long cells wrap, and what still does not fit scrolls inside it.
            body.append(f'<div class="table-box"><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>')
        elif kind == "figure":
            _, fig_title, _, uri, caption = block
            body.append(f'<figure><img alt="{html.escape(fig_title)}" src="{uri}">'
                        f"<figcaption>{_html_inline(caption)}</figcaption></figure>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{_html_inline(i)}</li>" for i in block[1]) + "</ul>")
    style = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
             ".table-box{max-width:100%;overflow-x:auto;margin:0.5em 0}"
             "table{border-collapse:collapse;font-size:0.85em;max-width:100%}td,th{border:1px solid #ccc;"
             "padding:3px 6px;text-align:left;overflow-wrap:anywhere}th{background:#f3f3f3}img{max-width:100%;height:auto}"
             "figure{margin:1em 0}figcaption{font-size:0.9em;color:#555}code{background:#f3f3f3;padding:0 3px}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _atomic_write(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.partial")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


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
    blocks.append(("h2", "Figures"))
    html_blocks = list(blocks)
    mime = {"png": "image/png", "svg": "image/svg+xml"}[fmt]
    for item in items:
        if item.figure is None:
            continue
        data = render_figure(item.figure, fmt)
        _atomic_write(figure_dir / f"{item.name}.{fmt}", data)
        relative = os.path.relpath(figure_dir / f"{item.name}.{fmt}", dest)
        uri = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
        blocks += [("h3", item.title), ("figure", item.title, relative, None, item.caption)]
        html_blocks += [("h3", item.title), ("figure", item.title, relative, uri, item.caption)]
    skipped = [f"{item.title}: skipped, {item.skipped}" for item in items if item.figure is None]
    if skipped:
        for target in (blocks, html_blocks):
            target += [("h2", "Skipped figures"), ("ul", skipped)]
    _atomic_write(dest / "report.html", to_html(html_blocks, f"dspark-bench report: {runs}").encode())
    _atomic_write(dest / "report.md", to_markdown(blocks).encode())
    return dest / "report.md"


def figures_written(report_md: Path) -> list[str]:
    """The figure files a report.md refers to, in order (for tests and tools)."""
    text = Path(report_md).read_text()
    return [line.split("](", 1)[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]


__all__ = ["build_report", "load_inputs", "make_figures", "calibration_data", "Inputs", "FigureItem", "Skip"]

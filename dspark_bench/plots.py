"""DataFrame -> matplotlib Figure. Nothing here reads or writes files; saving is the caller's.

Figures are built on the Agg canvas without pyplot, so they never pile up in pyplot's registry
and work the same in a script, a test or a notebook (where `display(fig)` shows them). Axis
labels are the metric names of DESIGN.md (`avg_draft_len`, `tokens_per_round`, `speedup`...).

Inputs are the tables of `dspark_bench.results`: `policies` = one row per configuration, trial
or simulated policy (`results.load`), `samples` = one row per prompt × configuration, `rounds` =
the per-round trace.
"""

from __future__ import annotations

import warnings

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize, TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from dspark_bench.metrics import STOP_REASONS, sample_speedup

CURVE_METRICS = ("avg_draft_len", "block_acceptance_rate", "accepted_per_round", "speedup")
THRESHOLD_SCHEDULES = ("threshold", "cumulative")
COLORS = {"accepted": "#2e9e44", "rejected": "#d6423b", "target": "#3a63c4", "best": "#e6a100"}


def _figure(width: float, height: float, rows: int = 1, cols: int = 1, **kwargs):
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


def objective_column(policies: pd.DataFrame) -> str:
    """What "best" means: measured speedup where any was measured, else the replay's
    predicted_speedup, else tokens_per_round."""
    for name in ("speedup", "predicted_speedup", "tokens_per_round"):
        if name in policies and policies[name].notna().any():
            return name
    raise ValueError("the table has no speedup, predicted_speedup or tokens_per_round to rank by")


def best_row(policies: pd.DataFrame, objective: str | None = None, fixed: bool = False) -> pd.Series | None:
    """The row with the highest objective among confidence-scheduled policies (fixed=False)
    or among the classic fixed-gamma ones (fixed=True); None if there is none."""
    table = complete(policies)
    if "schedule" in table:
        is_fixed = table["schedule"] == "fixed"
        table = table[is_fixed] if fixed else table[~is_fixed]
    objective = objective or objective_column(policies)
    if objective not in table or table[objective].notna().sum() == 0:
        return None
    return table.loc[table[objective].idxmax()]


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


def threshold_curves(policies: pd.DataFrame, objective: str | None = None, by: str | None = None) -> Figure:
    """avg_draft_len, block_acceptance_rate, accepted_per_round (+ tokens_per_round) and speedup
    against the threshold: one line per gamma_max (and min_draft_len where it varies), for the
    threshold schedule of the best policy's metric; the best policy starred.

    speedup is drawn with its bootstrap interval where measured and predicted_speedup dashed
    where replayed. Several runs (or by="run") get one set of lines each.
    """
    objective = objective or objective_column(policies)
    best = best_row(policies, objective)
    if best is None:
        raise ValueError("no confidence-scheduled policy to plot")
    schedule = best["schedule"] if best["schedule"] in THRESHOLD_SCHEDULES else "threshold"
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
    fig, axes = _figure(11, 7.5, 2, 2, sharex=True)
    fig.suptitle(f"{best['metric']} · {schedule} schedule · one line per "
                 + " × ".join("run" if k == "run_id" else k for k in keys) + fixed_min, fontsize=11)
    columns = [c for c in ("avg_draft_len", "block_acceptance_rate", "accepted_per_round", "tokens_per_round",
                           "speedup", "speedup_low", "speedup_high", "predicted_speedup") if c in table]
    for i, (group, rows) in enumerate(table.groupby(keys, sort=True)):
        color = f"C{i % 10}"
        # Repeated Optuna trials of one policy: their mean.
        curve = rows.groupby("threshold")[columns].mean(numeric_only=True).sort_index()
        label = _group_label(keys, group)
        for ax, name in zip(axes.flat[:3], CURVE_METRICS[:3]):
            ax.plot(curve.index, curve[name], "o-", color=color, label=label)
        if "tokens_per_round" in curve:
            axes[1, 0].plot(curve.index, curve["tokens_per_round"], "s--", color=color, alpha=0.6)
        ax = axes[1, 1]
        if "predicted_speedup" in curve and curve["predicted_speedup"].notna().any():
            ax.plot(curve.index, curve["predicted_speedup"], "--", color=color, alpha=0.8,
                    label=f"{label} predicted")
        if "speedup" in curve and curve["speedup"].notna().any():
            measured = curve[curve["speedup"].notna()]
            low = measured.get("speedup_low", measured["speedup"])
            high = measured.get("speedup_high", measured["speedup"])
            ax.errorbar(measured.index, measured["speedup"], yerr=[measured["speedup"] - low, high - measured["speedup"]],
                        fmt="o-", color=color, capsize=3, label=f"{label} measured")
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
        value = best.get(name) if name != "speedup" else best.get(objective)
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
    table = table[table["schedule"] != "fixed"] if "schedule" in table else table
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
    table = table[table["schedule"] != "fixed"].copy()
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
    fig, axes = _figure(4.2 * cols + 0.8, 3.4 * rows, rows, cols)
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


def names_of(table: pd.DataFrame) -> str:
    return " / ".join(dict.fromkeys(table["_value"]))


def position_acceptance(samples: pd.DataFrame, labels: list[str] | None = None) -> Figure:
    """How often draft position k is accepted given it was drafted (sum over prompts of
    position_accepted / position_drafted), one line per configuration label (and run)."""
    labels = list(dict.fromkeys(samples["config_label"])) if labels is None else labels
    fig, axes = _figure(7.5, 4.2)
    ax = axes[0, 0]
    overlay = "run_id" in samples and samples["run_id"].nunique() > 1
    keys = ["run_id", "config_label"] if overlay else ["config_label"]
    drawn = 0
    for key, rows in samples[samples["config_label"].isin(labels)].groupby(keys, sort=False):
        drafted, accepted = _position_sums(rows)
        k = np.arange(1, len(drafted) + 1)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(drafted > 0, accepted / drafted, np.nan)
        key = key if isinstance(key, tuple) else (key,)
        label = " · ".join(short_run(v) if n == "run_id" else str(v) for n, v in zip(keys, key))
        style = "s--" if "fixed" in str(key[-1]) else "o-"
        ax.plot(k, share, style, label=label)
        drawn += 1
    if not drawn:
        raise ValueError("none of the configurations has samples")
    ax.set_xlabel("draft position k")
    ax.set_ylabel("per-position acceptance (accepted / drafted)")
    ax.set_ylim(-0.03, 1.03)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _position_sums(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(v) for v in rows["position_drafted"])
    drafted, accepted = np.zeros(width), np.zeros(width)
    for d, a in zip(rows["position_drafted"], rows["position_accepted"]):
        drafted[: len(d)] += np.asarray(d, float)
        accepted[: len(a)] += np.asarray(a, float)
    return drafted, accepted


# --- confidence calibration --------------------------------------------------------------------


def roc_auc(scores, labels) -> float:
    """Area under the ROC curve via the rank-sum (Mann-Whitney U) statistic; ties get mean ranks."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    positives, negatives = labels.sum(), (~labels).sum()
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    _, tie, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.bincount(tie, weights=ranks) / counts)[tie]  # mean rank within each tie
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def calibration_table(confidences: pd.DataFrame, bins: int = 10) -> pd.DataFrame:
    """Per metric and confidence bin: tokens, mean confidence, observed acceptance."""
    edges = np.linspace(0, 1, bins + 1)
    table = confidences.assign(bin=np.clip(np.digitize(confidences["confidence"], edges) - 1, 0, bins - 1))
    return (table.groupby(["metric", "bin"], sort=True)
            .agg(tokens=("accepted", "size"), confidence=("confidence", "mean"), acceptance=("accepted", "mean"))
            .reset_index())


def calibration(confidences: pd.DataFrame, bins: int = 10, source: str = "") -> Figure:
    """Reliability diagram: observed acceptance of a drafted token against its confidence, per
    metric, with each metric's ROC AUC for predicting acceptance; token counts per bin below.

    `confidences`: one row per drafted token with columns metric, confidence, accepted.
    """
    table = calibration_table(confidences, bins)
    fig, axes = _figure(7.5, 6.5, 2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.2]})
    top, bottom = axes[0, 0], axes[1, 0]
    top.plot([0, 1], [0, 1], ":", color="grey", lw=1, label="perfectly calibrated")
    width = 1 / bins / (table["metric"].nunique() + 1)
    for i, (metric, rows) in enumerate(table.groupby("metric", sort=False)):
        tokens = confidences[confidences["metric"] == metric]
        auc = roc_auc(tokens["confidence"], tokens["accepted"])
        top.plot(rows["confidence"], rows["acceptance"], "o-", color=f"C{i}",
                 label=f"{metric}  AUC {auc:.3f}  ({len(tokens)} tokens)")
        bottom.bar(rows["bin"] / bins + (i + 0.5) * width, rows["tokens"], width=width, color=f"C{i}")
    top.set_ylabel("acceptance (share of drafted tokens accepted)")
    top.set_ylim(-0.03, 1.03)
    top.set_xlim(0, 1)
    top.grid(alpha=0.3)
    top.legend(fontsize=8, loc="upper left")
    if source:
        top.set_title(source, fontsize=9)
    bottom.set_ylabel("tokens")
    bottom.set_xlabel("confidence (bin)")
    bottom.grid(alpha=0.3)
    return fig


def confidences_from_rounds(rounds: pd.DataFrame) -> pd.DataFrame:
    """Drafted tokens of a trace, each with its config's metric: token i of a round counts
    while every token before it was accepted (i <= accepted), and is accepted iff i < accepted.
    A dropped proposal (confidences beyond `drafted`) was never drafted and is left out."""
    metric, value, accepted = [], [], []
    for row in rounds[["metric", "drafted", "accepted", "confidences"]].itertuples(index=False):
        seen = min(row.drafted, row.accepted + 1)
        values = list(row.confidences)[:seen]
        metric += [row.metric] * len(values)
        value += values
        accepted += [i < row.accepted for i in range(len(values))]
    return pd.DataFrame({"metric": metric, "confidence": np.asarray(value, float), "accepted": accepted})


def confidences_from_record(confidences: dict, matches: np.ndarray, lengths: np.ndarray) -> pd.DataFrame:
    """Every rollout step k from every position j of a replay record, for every metric: step k
    counts while the steps before it matched the target (k <= M[p, j]) and the token exists
    (j + k < length); it is accepted iff k < M[p, j] (`replay.match_lengths`)."""
    P, N, G = matches.shape + (next(iter(confidences.values())).shape[2],)
    j = np.arange(N)[None, :, None]
    k = np.arange(G)[None, None, :]
    used = (k <= matches[:, :, None]) & (j + k < np.asarray(lengths)[:, None, None])
    accepted = (k < matches[:, :, None])[used]
    frames = [pd.DataFrame({"metric": name, "confidence": values[used].astype(float), "accepted": accepted})
              for name, values in confidences.items()]
    return pd.concat(frames, ignore_index=True)


# --- the best policy: stop reasons, draft lengths, against the classic baseline ------------------


def draft_lengths_from_positions(samples: pd.DataFrame) -> pd.Series:
    """Rounds per draft length L, exactly, from samples' position_drafted (rounds drafting
    at least k tokens): count(L == k) = drafted[k] - drafted[k + 1]; L == 0 = rounds - drafted[1]."""
    drafted, _ = _position_sums(samples)
    at_least = np.concatenate([[samples["rounds"].sum()], drafted, [0]])
    counts = at_least[:-1] - at_least[1:]
    return pd.Series(counts.astype(int), index=np.arange(len(counts)), name="rounds")


def stop_reasons(samples: pd.DataFrame, draft_lengths: pd.Series | None = None, title: str = "") -> Figure:
    """Stop-reason counts (from samples' stop_* totals) and the draft-length distribution of one
    configuration. `draft_lengths`: rounds per draft length (from the trace), else derived."""
    draft_lengths = draft_lengths if draft_lengths is not None else draft_lengths_from_positions(samples)
    fig, axes = _figure(10, 3.8, 1, 2)
    counts = [int(samples[f"stop_{r}"].sum()) if f"stop_{r}" in samples else 0 for r in STOP_REASONS]
    left, right = axes[0, 0], axes[0, 1]
    bars = left.bar(STOP_REASONS, counts, color=["C0", "C1", "C2", "C7"])
    left.bar_label(bars, fontsize=8)
    left.set_xlabel("stop reason")
    left.set_ylabel("rounds")
    total = sum(counts)
    left.set_title(f"stop reasons ({total} rounds)", fontsize=10)
    bars = right.bar(draft_lengths.index, draft_lengths.to_numpy(), color="C4")
    right.bar_label(bars, fontsize=8)
    right.set_xlabel("drafted tokens per round (L)")
    right.set_ylabel("rounds")
    right.set_xticks(draft_lengths.index)
    mean = float((draft_lengths.index * draft_lengths).sum() / max(draft_lengths.sum(), 1))
    right.set_title(f"draft length distribution (avg_draft_len {mean:.2f})", fontsize=10)
    for ax in (left, right):
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.15)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def speedup_by_group(samples: pd.DataFrame, group: str = "category", role: str = "role",
                     seed: int = 0) -> Figure:
    """Bars of speedup per group (plus "all") for each role (e.g. best, classic), each with its
    95 % bootstrap interval over prompts (seconds per token, baseline over speculative); autoregressive
    decoding is the line at 1.0."""
    roles = list(dict.fromkeys(samples[role]))
    groups = list(dict.fromkeys(samples[group].astype(str)))
    if len(groups) > 1:
        groups.append("all")
    fig, axes = _figure(max(6.0, 1.3 * len(groups) * len(roles) + 2), 4.5)
    ax = axes[0, 0]
    width = 0.8 / len(roles)
    top = 1.0
    for i, name in enumerate(roles):
        rows = samples[samples[role] == name]
        points, lows, highs = [], [], []
        for g in groups:
            part = rows if g == "all" else rows[rows[group].astype(str) == g]
            if part.empty:
                points.append(np.nan), lows.append(np.nan), highs.append(np.nan)
                continue
            point, low, high = sample_speedup(part, seed=seed)
            points.append(point), lows.append(low), highs.append(high)
        x = np.arange(len(groups)) + (i - (len(roles) - 1) / 2) * width
        points, lows, highs = map(np.asarray, (points, lows, highs))
        bars = ax.bar(x, points, width, yerr=[points - lows, highs - points], capsize=3, color=f"C{i}",
                      label=str(name))
        ax.bar_label(bars, labels=[f"{p:.2f}" if np.isfinite(p) else "" for p in points], fontsize=7,
                     padding=2, label_type="edge")
        top = max(top, np.nanmax(highs) if np.isfinite(highs).any() else 1.0)
    ax.axhline(1.0, color="black", lw=1, ls="--", label="autoregressive (1.0)")
    ax.set_xticks(np.arange(len(groups)), groups, rotation=20 if len(groups) > 5 else 0)
    ax.set_xlabel(group)
    ax.set_ylabel("speedup (95% bootstrap CI)")
    ax.set_ylim(0, top * 1.2)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", ncol=len(roles) + 1)
    return fig


# --- Optuna -------------------------------------------------------------------------------------


def optimization_history(trials: pd.DataFrame, objective: str = "objective_0", direction: str = "maximize",
                         name: str = "speedup") -> Figure:
    """Objective value per trial number, with the best value so far."""
    done = complete(trials).sort_values("trial")
    done = done[done[objective].notna()]
    if done.empty:
        raise ValueError("no complete trial")
    fig, axes = _figure(7.5, 4)
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


# --- one prompt, round by round -----------------------------------------------------------------


def round_trace(rounds: pd.DataFrame, prompt_id=None, labels: list[str] | None = None) -> Figure:
    """Each configuration's rounds on one prompt, along the generated tokens: accepted draft
    tokens (green), the target's own token (blue) and, in the thin lane above, the rejected
    draft tokens at the positions they claimed (red). Thick ticks separate rounds."""
    if prompt_id is None:
        prompt_id = rounds["prompt_id"].iloc[0]
    chosen = rounds[rounds["prompt_id"] == prompt_id]
    labels = labels or list(dict.fromkeys(chosen["config_label"]))
    labels = [label for label in labels if (chosen["config_label"] == label).any()]
    if not labels:
        raise ValueError(f"no traced rounds for prompt {prompt_id!r}")
    fig, axes = _figure(12, 0.75 * len(labels) + 1.3)
    ax = axes[0, 0]
    longest = 0
    for row, label in enumerate(labels):
        y = len(labels) - 1 - row
        position = 0
        trace = chosen[chosen["config_label"] == label].sort_values("round")
        for r in trace.itertuples(index=False):
            for i in range(r.accepted):
                ax.add_patch(Rectangle((position + i, y), 1, 0.55, fc=COLORS["accepted"], ec="white", lw=0.5))
            for i in range(r.accepted, r.drafted):
                ax.add_patch(Rectangle((position + i, y + 0.6), 1, 0.25, fc=COLORS["rejected"], ec="white", lw=0.5))
            if r.emitted > r.accepted:
                ax.add_patch(Rectangle((position + r.accepted, y), 1, 0.55, fc=COLORS["target"], ec="white", lw=0.5))
            ax.plot([position, position], [y - 0.05, y + 0.9], color="black", lw=1.2)
            position += r.emitted
        longest = max(longest, position)
        ax.text(position + 0.5, y + 0.27, f"{len(trace)} rounds", va="center", fontsize=8)
    ax.set_xlim(0, longest * 1.12 + 1)
    ax.set_ylim(-0.2, len(labels))
    ax.set_yticks([len(labels) - 1 - i + 0.4 for i in range(len(labels))], labels, fontsize=8)
    ax.set_xlabel("generated token position")
    ax.set_title(f"prompt {prompt_id}: rounds of each configuration", fontsize=10)
    fig.legend(handles=[Patch(color=COLORS["accepted"], label="accepted draft token"),
                        Patch(color=COLORS["rejected"], label="rejected draft token"),
                        Patch(color=COLORS["target"], label="target token")],
               loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    return fig

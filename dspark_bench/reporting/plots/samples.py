"""Figures over samples and rounds: per-position acceptance, signal reliability, stop
reasons and draft lengths, speedup per group, and one prompt's rounds."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from dspark_bench import schedules
from dspark_bench.metrics import STOP_REASONS, sample_speedup
from dspark_bench.replay.acceptance import roc_auc
from dspark_bench.reporting.plots.base import COLORS, figure, short_run


def position_acceptance(samples: pd.DataFrame, labels: list[str] | None = None) -> Figure:
    """How often draft position k is accepted given it was drafted (sum over prompts of
    position_accepted / position_drafted), one line per configuration label (and run)."""
    labels = list(dict.fromkeys(samples["config_label"])) if labels is None else labels
    fig, axes = figure(7.5, 4.2)
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
        style = "s--" if "schedule" in rows and schedules.where(rows, baseline=True).all() else "o-"
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


# --- signal reliability (confidence against acceptance) ------------------------------------------


def reliability_table(confidences: pd.DataFrame, bins: int = 10) -> pd.DataFrame:
    """Per metric and confidence bin: tokens, mean confidence, observed acceptance."""
    edges = np.linspace(0, 1, bins + 1)
    table = confidences.assign(bin=np.clip(np.digitize(confidences["confidence"], edges) - 1, 0, bins - 1))
    return (table.groupby(["metric", "bin"], sort=True)
            .agg(tokens=("accepted", "size"), confidence=("confidence", "mean"), acceptance=("accepted", "mean"))
            .reset_index())


def reliability(confidences: pd.DataFrame, bins: int = 10, source: str = "", fit=None) -> Figure:
    """Reliability diagram: observed acceptance of a drafted token against its confidence, per
    metric, with each metric's ROC AUC for predicting acceptance; token counts per bin below.

    `confidences`: one row per drafted token with columns metric, confidence, accepted.
    `fit`: an acceptance.AcceptanceFit: each metric's fitted curve (solid) and its held-out
    Brier score and ECE, beside the raw confidence's read as a probability.
    """
    table = reliability_table(confidences, bins)
    fig, axes = figure(7.5, 6.5, 2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.2]})
    top, bottom = axes[0, 0], axes[1, 0]
    top.plot([0, 1], [0, 1], ":", color="grey", lw=1, label="perfectly calibrated")
    width = 1 / bins / (table["metric"].nunique() + 1)
    for i, (metric, rows) in enumerate(table.groupby("metric", sort=False)):
        tokens = confidences[confidences["metric"] == metric]
        auc = roc_auc(tokens["confidence"], tokens["accepted"])
        label = f"{metric}  AUC {auc:.3f}  ({len(tokens)} tokens)"
        if fit is not None and metric in fit.curves:
            q = fit.quality.get(metric, {})
            if q:
                label += (f"\n  fit: Brier {q['brier']:.3f} (raw {q['raw_brier']:.3f}), "
                          f"ECE {q['ece']:.3f} (raw {q['raw_ece']:.3f})")
            grid = np.linspace(0, 1, 201)
            top.plot(grid, fit.curves[metric](grid), "-", color=f"C{i}", lw=1.5, alpha=0.8)
        top.plot(rows["confidence"], rows["acceptance"], "o:" if fit is not None else "o-", color=f"C{i}",
                 label=label)
        bottom.bar(rows["bin"] / bins + (i + 0.5) * width, rows["tokens"], width=width, color=f"C{i}")
    top.set_ylabel("acceptance (share of drafted tokens accepted)")
    top.set_ylim(-0.03, 1.03)
    top.set_xlim(0, 1)
    top.grid(alpha=0.3)
    top.legend(fontsize=8, loc="lower right")  # high confidence, low acceptance: the empty corner
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
    fig, axes = figure(10, 3.8, 1, 2)
    counts = {r: int(samples[f"stop_{r}"].sum()) if f"stop_{r}" in samples else 0 for r in STOP_REASONS}
    # "quorum" exists only at batch size B > 1 (config.stopping.batch_quorum), "exhausted" only for the heads
    # and lookup drafters: shown where they happened.
    reasons = [r for r in STOP_REASONS if r not in ("quorum", "exhausted") or counts[r]]
    counts = [counts[r] for r in reasons]
    left, right = axes[0, 0], axes[0, 1]
    bars = left.bar(reasons, counts, color=[f"C{i}" for i in (0, 1, 2, 7, 4, 5)][: len(reasons)])
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
    fig, axes = figure(max(6.0, 1.3 * len(groups) * len(roles) + 2), 4.5)
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
    fig, axes = figure(12, 0.75 * len(labels) + 1.3)
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

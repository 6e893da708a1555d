"""Speedup and tokens/s against batch size (rows of reporting.batch_sizes.batch_rows)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dspark_bench.config import LEARNED
from dspark_bench.reporting.plots.base import figure

STYLE = {("best scheduled", "padded"): ("#e6a100", "o"), ("best fixed γ", "padded"): ("#3a63c4", "s"),
         ("best scheduled", "packed"): ("#b5651d", "^"), ("best fixed γ", "packed"): ("#6a8fd8", "v"),
         ("budget schedule", "padded"): ("#2e9e4f", "D"), ("budget schedule", "packed"): ("#7cc48f", "P")}


def batch_sizes(rows: pd.DataFrame, title: str = ""):
    """Left: speedup against B, predicted dashed (both layouts), measured solid with its interval
    (padded); autoregressive is 1. Right: tokens/s of the whole batch, measured and predicted."""
    fig, axes = figure(11, 4.2, 1, 2)
    speed, rate = axes[0]
    for (kind, layout), part in rows.groupby(["kind", "layout"], sort=False):
        color, marker = STYLE[(kind, layout)]
        part = part.sort_values("batch_size")
        speed.plot(part["batch_size"], part["predicted"], "--", color=color, marker=marker, alpha=0.7,
                   label=f"{kind}, {layout} (predicted)")
        rate.plot(part["batch_size"], part["predicted_tokens_per_s"], "--", color=color, marker=marker, alpha=0.5,
                  label=f"{kind}, {layout} (predicted)")
        measured = part[part.get("speedup", pd.Series(index=part.index, dtype=float)).notna()] \
            if "speedup" in part else part.iloc[:0]
        if not measured.empty:
            errors = [measured["speedup"] - measured["speedup_low"], measured["speedup_high"] - measured["speedup"]]
            speed.errorbar(measured["batch_size"], measured["speedup"], yerr=errors, fmt="-", color=color,
                           marker=marker, capsize=3, lw=2, label=f"{kind}, {layout} (measured)")
            rate.plot(measured["batch_size"], measured["spec_tokens_per_s"], "-", color=color, marker=marker, lw=2,
                      label=f"{kind}, {layout} (measured)")
    baseline = rows[rows["layout"] == "padded"].groupby("batch_size").first().reset_index()
    speed.axhline(1.0, color="grey", ls=":", lw=1.5, label="autoregressive")
    if "baseline_tokens_per_s" in baseline and baseline["baseline_tokens_per_s"].notna().any():
        shown = baseline[baseline["baseline_tokens_per_s"].notna()]
        rate.plot(shown["batch_size"], shown["baseline_tokens_per_s"], "-", color="grey", marker="x", lw=2,
                  label="autoregressive (measured)")
    rate.plot(baseline["batch_size"], baseline["predicted_baseline_tokens_per_s"], ":", color="grey", marker="x",
              label="autoregressive (predicted)")
    for ax, label in ((speed, "speedup over batched autoregressive"), (rate, "tokens/s, whole batch")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(rows["batch_size"].unique()), labels=[str(b) for b in sorted(rows["batch_size"].unique())])
        ax.set_xlabel("batch_size B")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    speed.legend(fontsize=7, loc="best")
    rate.legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def signal_headroom(rows: pd.DataFrame, title: str = ""):
    """The share of the oracle's gain the best per-row rule captures against the AUC of the signal
    it stops on (rows of analysis/signal_headroom.py: one per signal, batch size and layout), at
    batch size 1 and packed — padded, where the longest row sets every pass, per-row stopping has
    almost nothing to win (its table says so) — with the learned signal's own AUC marked."""
    fig, axes = figure(7.5, 4.2)
    ax = axes[0, 0]
    shown = rows[rows["layout"] != "padded"]
    for i, (b, part) in enumerate(shown.groupby("batch_size", sort=True)):
        part = part.sort_values("auc")
        ax.plot(part["auc"], 100 * part["captured"].clip(upper=1.0), "-", color=f"C{i}", marker="o", ms=4,
                label=f"B = {b}" if b == 1 else f"B = {b}, packed")
    own = rows[rows["signal"] == LEARNED]["auc"]
    if len(own):
        ax.axvline(float(own.iloc[0]), color="grey", ls=":", lw=1.5)
        ax.annotate("the learned signal", (float(own.iloc[0]), 2), fontsize=8, color="grey", rotation=90,
                    ha="right", va="bottom")
    ax.axhline(50, color="grey", lw=0.8, alpha=0.5)
    ax.set_xlabel("AUC of the signal (drafted tokens with a verdict)")
    ax.set_ylabel("share of the oracle's gain captured, %")
    ax.set_ylim(-5, 105)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", ncols=2)
    ax.set_title(title or "how good a signal the rules would need", fontsize=10)
    return fig


def paired_ratios(verdicts: list[dict], title: str = ""):
    """Each policy against the best fixed γ on the same prompts (harness/verdicts.py): every
    prompt's own ratio as a dot, the ratio over all prompts with its 95 % interval as a bar, 1 (no
    difference) as a line. > 1: the policy is faster."""
    shown = [v for v in verdicts if v.get("per_prompt")]
    fig, axes = figure(7.5, 1.4 + 0.7 * max(len(shown), 1))
    ax = axes[0, 0]
    for y, v in enumerate(shown):
        dots = np.asarray(v["per_prompt"], float)
        jitter = np.random.default_rng(y).uniform(-0.18, 0.18, len(dots))
        ax.scatter(dots, y + jitter, s=10, color="grey", alpha=0.45, lw=0)
        color = {"faster": "C2", "slower": "C3"}.get(v["verdict"], "C0")
        ax.errorbar(v["ratio"], y, xerr=[[v["ratio"] - v["low"]], [v["high"] - v["ratio"]]], fmt="o", color=color,
                    capsize=4, ms=6, lw=2)
        ax.annotate(f"{v['ratio'] - 1:+.1%} [{v['low'] - 1:+.1%}, {v['high'] - 1:+.1%}] {v['verdict']}",
                    (v["ratio"], y), xytext=(0, -14), textcoords="offset points", fontsize=7, color=color, ha="center")
    ax.axvline(1.0, color="black", lw=1)
    values = [x for v in shown for x in (*v["per_prompt"], v["low"], v["high"]) if np.isfinite(x)] + [1.0]
    pad = 0.08 * (max(values) - min(values) or 0.1)
    ax.set_xlim(min(values) - pad, max(values) + pad)
    ax.set_ylim(len(shown) - 0.4, -0.6)
    ax.set_yticks(range(len(shown)), [f"{v['candidate']}\nvs {v['reference']}" for v in shown], fontsize=7)
    ax.set_xlabel("reference s/token ÷ policy s/token: each prompt (dots), all prompts (95 % interval)", fontsize=8)
    ax.grid(alpha=0.3, axis="x")
    ax.set_title(title or "paired on the same prompts", fontsize=10)
    return fig

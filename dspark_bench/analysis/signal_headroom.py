"""How good must a signal be? The best rule's share of the oracle's gain, for better signals.

The headroom (oracle.py) says how much any stopping rule could win over fixed γ; the learned
signal (learned.py) is the best predictor of acceptance the draft's own numbers give. Neither says
whether the gap between them is the rules' fault or the signal's. This answers it by replay: it
gives the rules signals better than the real one and sees what they capture.

A better signal is modelled as the real one with more evidence of the verdict in it:

    logit s_β = logit s + β · (2 v − 1),      v = 1 where the drafted token is accepted

on every drafted token with a verdict (accepted or not, given the draft before it was: the
tokens learned.used_steps counts, up to and including the first rejected one); the rollout's
later steps, which no verify ever judges, keep the real signal, so a rule gains nothing there
that the AUC does not count. β = 0 is the signal itself, β = ∞ the verdict (perfect stopping,
oracle.perfect_record). Each β's AUC over those tokens (in-sample: nothing is fitted here) says
how good that signal is. For each signal, the best
per-row rule (threshold and cumulative schedules over a dense grid of thresholds, γ_max and
min_draft_len) is replayed at every batch size and layout beside the best fixed γ and the oracle,
and the share of the oracle's gain it captures is what a signal of that AUC buys here.

The signal's own cost is left out, as perfect stopping's is: it is read in the top1 slot (the
real learned signal is charged t_learned in the sweep). Even a perfect signal leaves a gap to the
batch-1 oracle: a rule learns a token's verdict only once it has drafted it, so each round pays
one draft forward for its rejected token, which the oracle never drafts.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from dspark_bench import objectives, schedules
from dspark_bench.analysis.oracle import oracle, perfect_record, perfect_stopping, walked_at_one
from dspark_bench.config import DecodeConfig, expand
from dspark_bench.decoding.learned_signal import FLOOR
from dspark_bench.errors import DsparkError
from dspark_bench.replay.acceptance import accepted_steps, roc_auc
from dspark_bench.replay.batched import simulate_with_surface
from dspark_bench.replay.cost import CostModel, CostSurface
from dspark_bench.replay.learned import used_steps
from dspark_bench.replay.record import Record
from dspark_bench.replay.rounds import match_lengths
from dspark_bench.replay.simulate import simulate_grid

BETAS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf"))
THRESHOLDS = tuple(round(t, 2) for t in np.arange(0.02, 0.99, 0.03))  # 33: the rules' grid on each signal
SLOT = "top1"  # where the signal is read, so that no signal file or signal cost enters
NEGLIGIBLE = 0.001  # an oracle within 0.1 % of fixed γ: no share of its gain is shown


def verdicts(rec: Record) -> np.ndarray:
    """[P, N, G] bool: rollout step k from position j is accepted, given the steps before it were."""
    return accepted_steps(match_lengths(rec), rec.gamma_record)


def sharpened(rec: Record, beta: float, signal: str = "learned") -> Record:
    """The record with `signal` made better by β (module docstring) in the top1 slot."""
    if signal not in rec.confidences:
        raise DsparkError(f"the record has no {signal} signal (a replay sweep's record with its learned signal)")
    if np.isinf(beta):
        return perfect_record(rec)
    s = np.clip(rec.confidences[signal].astype(np.float64), FLOOR, 1 - FLOOR)
    evidence = np.where(used_steps(rec), beta * (2.0 * verdicts(rec) - 1.0), 0.0)
    better = 1.0 / (1.0 + np.exp(-(np.log(s / (1 - s)) + evidence)))
    return dataclasses.replace(rec, confidences={**rec.confidences, SLOT: better.astype(np.float32)})


def signal_auc(rec: Record, signal: str = SLOT) -> float:
    """ROC AUC of `signal` over every drafted token with a verdict (in-sample: nothing is fitted here)."""
    used = used_steps(rec)
    return roc_auc(rec.confidences[signal][used].astype(np.float64), verdicts(rec)[used])


def rule_policies(batch_sizes, gamma_max: int, max_new_tokens: int) -> list[DecodeConfig]:
    """The per-row rules on the signal: threshold and cumulative, every threshold, γ_max and
    min_draft_len 0–1, at each batch size; and fixed γ."""
    base = DecodeConfig.of(metric=SLOT, max_new_tokens=max_new_tokens)
    gammas, sizes = list(range(1, gamma_max + 1)), sorted(batch_sizes)
    rules = expand({"schedule": [schedules.THRESHOLD, schedules.CUMULATIVE], "threshold": list(THRESHOLDS),
                    "gamma_max": gammas, "min_draft_len": [0, 1], "batch_size": sizes}, base)
    fixed = expand({"gamma_max": gammas, "batch_size": sizes}, base.replace(schedule=schedules.BASELINE))
    return [c for c in rules if c.stopping.min_draft_len <= c.stopping.gamma_max] + fixed


def replayed(rec: Record, configs: list[DecodeConfig], cost: CostModel, surface: CostSurface | None) -> pd.DataFrame:
    """Every policy's predicted speedups, priced as the sweep's headroom prices them: on the surface
    (padded and packed, each request's prefill) where it spans B > 1, else by the batch-1 cost model."""
    if max(c.batching.batch_size for c in configs) > 1:
        table = simulate_with_surface(rec, configs, surface, batch_one=surface.batch_one(cost))
    else:
        table = simulate_grid(rec, configs, cost)
    return table.assign(batch_size=[c.batching.batch_size for c in configs],
                        schedule=[c.stopping.schedule for c in configs],
                        config_label=[c.label() for c in configs])


def bounds(rec: Record, batch_sizes, gamma_max: int, cost: CostModel, surface: CostSurface | None) -> dict:
    """(B, layout) -> the oracle's predicted speedup: the exact optimum at B = 1, perfect stopping's
    best γ_max at B > 1 (oracle.headroom's)."""
    out = {}
    if 1 in batch_sizes:
        out[(1, "—")] = oracle(rec, cost, gamma_max, surface=walked_at_one(surface, cost, batch_sizes))[
            "predicted_speedup"]
    larger = [b for b in batch_sizes if b > 1]
    if larger:
        perfect = perfect_stopping(rec, list(range(1, gamma_max + 1)), larger, cost, surface)
        for b in larger:
            part = perfect[perfect["batch_size"] == b]
            out[(b, "padded")] = float(part["predicted_speedup"].max())
            out[(b, "packed")] = float(part["predicted_speedup_packed"].max())
    return out


def signal_headroom(rec: Record, cost: CostModel, surface: CostSurface | None = None, batch_sizes=(1,),
                    gamma_max: int = 8, betas=BETAS, progress=None) -> pd.DataFrame:
    """One row per (β, B, layout): the signal's AUC, the best fixed γ, the best rule on that
    signal, the oracle, and the share of the oracle's gain over fixed γ the rule captures."""
    gamma_max = min(gamma_max, rec.gamma_record)
    batch_sizes = sorted(set(batch_sizes))
    if max(batch_sizes) > 1 and surface is None:
        raise DsparkError("batch sizes past 1 need a cost surface (a replay sweep's cost_surface.json)")
    configs = rule_policies(batch_sizes, gamma_max, rec.max_new_tokens)
    oracles = bounds(rec, batch_sizes, gamma_max, cost, surface)
    rows = []
    for i, beta in enumerate(betas):
        better = sharpened(rec, beta)
        table = replayed(better, configs, cost, surface)
        auc = signal_auc(better)
        for (b, layout), bound in oracles.items():
            column = "predicted_speedup_packed" if layout == "packed" else "predicted_speedup"
            group = table[table["batch_size"] == b]
            baseline = schedules.where(group, baseline=True)
            fixed = objectives.rank(group[baseline], "speedup", column).iloc[0]
            rule = objectives.rank(group[~baseline], "speedup", column).iloc[0]
            gain = bound - float(fixed[column])
            # A share of almost nothing (padded at B > 1, where the longest row sets every pass) says nothing.
            meaningful = gain > NEGLIGIBLE * float(fixed[column])
            rows.append({"signal": signal_name(beta), "beta": beta, "auc": auc, "batch_size": b, "layout": layout,
                         "best_fixed": fixed["config_label"], "best_fixed_speedup": float(fixed[column]),
                         "best_rule": rule["config_label"], "best_rule_speedup": float(rule[column]),
                         "oracle_speedup": bound,
                         "captured": ((float(rule[column]) - float(fixed[column])) / gain if meaningful
                                      else float("nan"))})
        if progress:
            progress("replaying better signals", i + 1, len(betas))
    return pd.DataFrame(rows)


def signal_name(beta: float) -> str:
    """How a table names the signal made better by β."""
    return "learned" if beta == 0 else "verdict" if np.isinf(beta) else f"β = {beta:g}"


def summary_rows(table: pd.DataFrame) -> list[dict]:
    """The table for summary.json: β = ∞ is not JSON (the `signal` name says it), a share of
    nothing is null."""
    rows = table.drop(columns="beta").to_dict(orient="records")
    return [{k: None if isinstance(v, float) and v != v else v for k, v in row.items()} for row in rows]


def pivot(rows: list[dict]) -> tuple[list[str], list[list]]:
    """How the CLI and the report show it: (a column per signal, named by its AUC; per (B, layout):
    [B, layout, the oracle's gain over fixed γ, then the share captured per signal])."""
    table = pd.DataFrame(rows)
    signals = list(dict.fromkeys(table["signal"]))
    auc = table.groupby("signal", sort=False)["auc"].first()
    header = [f"{s} (AUC {auc[s]:.4f})" for s in signals]
    body = []
    for (b, layout), group in table.groupby(["batch_size", "layout"], sort=True):
        shares = group.set_index("signal")["captured"].astype(float)
        first = group.iloc[0]
        gain = first["oracle_speedup"] / first["best_fixed_speedup"] - 1
        body.append([int(b), layout, float(gain), *(float(shares.get(s, float("nan"))) for s in signals)])
    return header, body


def auc_needed(table: pd.DataFrame, share: float) -> pd.DataFrame:
    """Per (B, layout): the least AUC among the signals whose best rule captures at least `share`
    of the oracle's gain (NaN where none does)."""
    def least(group):
        enough = group[group["captured"] >= share]
        return float(enough["auc"].min()) if len(enough) else float("nan")
    return (table.groupby(["batch_size", "layout"], sort=True).apply(least, include_groups=False)
            .rename("auc_needed").reset_index())

"""The metrics of docs/policy-and-metrics.md, computed from per-round records.

Totals add up over prompts; ratios are taken from the totals, so a run's acceptance_rate is
sum(accepted) / sum(drafted) over all its rounds, not a mean of per-prompt ratios.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# quorum: B > 1 only (config.stopping.batch_quorum); exhausted: the drafter had no more to propose (every
# head used, or a lookup without a match or at its match's end); never for the model drafter.
STOP_REASONS = ("threshold", "gamma_max", "eos", "budget", "quorum", "exhausted")
TOTAL_COLUMNS = ("rounds", "drafted_total", "accepted_total", "emitted_total", "full_blocks")
METRIC_COLUMNS = (
    "avg_draft_len",
    "acceptance_rate",
    "block_acceptance_rate",
    "accepted_per_round",
    "tokens_per_round",
)


def round_totals(drafted: np.ndarray, accepted: np.ndarray, emitted: np.ndarray, stop_reasons) -> dict:
    """Sums over a set of rounds, including stop-reason counts."""
    totals = {
        "rounds": int(len(drafted)),
        "drafted_total": int(drafted.sum()),
        "accepted_total": int(accepted.sum()),
        "emitted_total": int(emitted.sum()),
        "full_blocks": int((accepted == drafted).sum()),
    }
    reasons = list(stop_reasons)
    for reason in STOP_REASONS:
        totals[f"stop_{reason}"] = reasons.count(reason)
    return totals


# A sample's round totals per context-depth bucket: one list each, entry b for bucket b of the run's depth edges
# (depth.DEPTH_LABELS, the edges in summary.json's depth_edges), so the buckets of many rows add up as arrays.
DEPTH_TOTAL_COLUMNS = tuple(f"{column}_by_depth" for column in TOTAL_COLUMNS)


def bucket_totals(bucket: np.ndarray, buckets: int, drafted: np.ndarray, accepted: np.ndarray,
                  emitted: np.ndarray) -> dict[str, list[int]]:
    """round_totals' sums per bucket (bucket: each round's index, 0..buckets - 1), as DEPTH_TOTAL_COLUMNS."""
    per_round = (np.ones(len(drafted), np.int64), drafted, accepted, emitted, (accepted == drafted).astype(np.int64))
    sums = np.zeros((len(TOTAL_COLUMNS), buckets), np.int64)
    for row, values in enumerate(per_round):
        np.add.at(sums[row], np.asarray(bucket, np.int64), np.asarray(values, np.int64))
    return {name: row.tolist() for name, row in zip(DEPTH_TOTAL_COLUMNS, sums)}


def summarize_by_depth(samples: pd.DataFrame, labels) -> pd.DataFrame:
    """One row per configuration and depth bucket its rounds reached: the bucket's totals and rates
    from the samples' DEPTH_TOTAL_COLUMNS (entry b named labels[b]); empty where samples lack them."""
    if samples.empty or not set(DEPTH_TOTAL_COLUMNS) <= set(samples):
        return pd.DataFrame()
    rows = []
    for config_id, group in samples.groupby("config_id", sort=True):
        per_sample = {column: np.stack(group[f"{column}_by_depth"].to_numpy()) for column in TOTAL_COLUMNS}
        first_pass = (group["pass"].fillna(0) == 0).to_numpy() if "pass" in group else np.ones(len(group), bool)
        first = group.iloc[0]
        for b, label in enumerate(labels):
            totals = {column: int(per_sample[column][:, b].sum()) for column in TOTAL_COLUMNS}
            if totals["rounds"] == 0:
                continue
            row = {"config_id": config_id, "config_label": first["config_label"]}
            if "batch_size" in group and pd.notna(first["batch_size"]):
                row["batch_size"] = int(first["batch_size"])
            # Prompts with a round in the bucket (several timed passes of one prompt are one prompt).
            prompts = int(((per_sample["rounds"][:, b] > 0) & first_pass).sum())
            rows.append({**row, "depth": label, "prompts": prompts, **totals, **rates(totals)})
    return pd.DataFrame(rows)


def rates(totals: dict | pd.Series) -> dict:
    """The headline ratios from totals (numbers, or arrays of them, one per policy); NaN where a
    ratio has nothing to divide by."""
    rounds, drafted = totals["rounds"], totals["drafted_total"]
    return {
        "avg_draft_len": _ratio(drafted, rounds),
        "acceptance_rate": _ratio(totals["accepted_total"], drafted),
        "block_acceptance_rate": _ratio(totals["full_blocks"], rounds),
        "accepted_per_round": _ratio(totals["accepted_total"], rounds),
        "tokens_per_round": _ratio(totals["emitted_total"], rounds),
    }


def _ratio(numerator, denominator):
    numerator, denominator = np.asarray(numerator, float), np.asarray(denominator, float)
    out = np.divide(numerator, denominator, out=np.full(np.broadcast(numerator, denominator).shape, np.nan),
                    where=denominator != 0)
    return out if out.ndim else float(out)


def position_acceptance(drafted: np.ndarray, accepted: np.ndarray, gamma_max: int) -> tuple[list[int], list[int]]:
    """Per draft position k (1..gamma_max): how many rounds drafted it, how many accepted it."""
    positions = np.arange(1, gamma_max + 1)[:, None]
    return (
        (drafted[None, :] >= positions).sum(axis=1).tolist(),
        (accepted[None, :] >= positions).sum(axis=1).tolist(),
    )


def _bootstrap(columns, statistic, samples: int, seed: int):
    """statistic(*columns) with a 95 % bootstrap interval: each resample draws whole items
    (prompts), so every column of an item moves together. `statistic` sums over the last axis."""
    columns = [np.asarray(c, float) for c in columns]
    point = float(statistic(*columns))
    if len(columns[0]) < 2:
        return point, point, point
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(columns[0]), size=(samples, len(columns[0])))
    low, high = np.percentile(statistic(*(c[picks] for c in columns)), [2.5, 97.5])
    return point, float(low), float(high)


def bootstrap_ratio(numerator, denominator, samples: int = 1000, seed: int = 0):
    """sum(numerator) / sum(denominator) with a 95 % bootstrap interval over items (prompts)."""
    return _bootstrap([numerator, denominator], lambda n, d: n.sum(-1) / d.sum(-1), samples, seed)


def speedup_ratio(baseline_time, baseline_tokens, spec_time, spec_tokens):
    """The one definition of speedup: baseline seconds per generated token over speculative
    seconds per generated token, (Σ t_base / Σ n_base) / (Σ t_spec / Σ n_spec).

    Sums run over the last axis (prompts), so arrays of resampled prompts give one ratio each.
    Under greedy verification both sides generate the same tokens and this is Σ t_base / Σ t_spec;
    under sampling they stop at EOS in different places, and a per-token ratio neither rewards
    nor punishes a short sample.
    """
    baseline_time, baseline_tokens, spec_time, spec_tokens = (
        np.asarray(x, float) for x in (baseline_time, baseline_tokens, spec_time, spec_tokens))
    return (baseline_time.sum(-1) / baseline_tokens.sum(-1)) / (spec_time.sum(-1) / spec_tokens.sum(-1))


def bootstrap_speedup(baseline_time, baseline_tokens, spec_time, spec_tokens, samples: int = 1000, seed: int = 0):
    """speedup_ratio with a 95 % bootstrap interval over prompts: each resample draws whole
    prompts, so both sides' times and token counts move together."""
    return _bootstrap([baseline_time, baseline_tokens, spec_time, spec_tokens], speedup_ratio, samples, seed)


def sample_speedup(samples: pd.DataFrame, seed: int = 0):
    """bootstrap_speedup over the rows (prompts) of a samples table."""
    return bootstrap_speedup(samples["baseline_time_s"], samples["baseline_new_tokens"], samples["spec_time_s"],
                             samples["new_tokens"], seed=seed)


def summarize(samples: pd.DataFrame, by: list[str] | None = None) -> pd.DataFrame:
    """One row per configuration (and per `by` group): metrics, tokens/s, speedup with CI."""
    keys = ["config_id"] + (by or [])
    rows = []
    for key, group in samples.groupby(keys, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        totals = {col: group[col].sum() for col in TOTAL_COLUMNS}
        row = dict(zip(keys, key))
        row["config_label"] = group["config_label"].iloc[0]
        for name in ("batch_size", "layout", "batching"):  # constant within a config
            if name in group and group[name].notna().any():
                row[name] = group[name].dropna().iloc[0]
        # Several timed passes of one prompt (a precision target's) are one prompt.
        row["prompts"] = len(group) if "pass" not in group else int((group["pass"].fillna(0) == 0).sum())
        row.update(rates(totals))
        row["new_tokens"] = int(group["new_tokens"].sum())
        if "draft_forwards" in group:
            row["draft_forwards_per_token"] = group["draft_forwards"].sum() / max(row["new_tokens"], 1)
        if "spec_time_s" in group and group["spec_time_s"].notna().all():
            speedup, low, high = sample_speedup(group)
            row.update(speedup=speedup, speedup_low=low, speedup_high=high)
            row["baseline_tokens_per_s"] = group["baseline_new_tokens"].sum() / group["baseline_time_s"].sum()
            row["spec_tokens_per_s"] = group["new_tokens"].sum() / group["spec_time_s"].sum()
            # At batch size B these are the run's throughputs (time shares add up to its wall
            # time); what one request waits per token is its own residence over its tokens.
            for side in ("baseline", "spec"):
                if f"{side}_latency_per_token_s" in group and group[f"{side}_latency_per_token_s"].notna().any():
                    row[f"{side}_latency_per_token_s"] = float(group[f"{side}_latency_per_token_s"].mean())
            # Mean sample lengths: under sampling they differ, and a reader should see by how much.
            row["baseline_mean_new_tokens"] = float(group["baseline_new_tokens"].mean())
            row["spec_mean_new_tokens"] = float(group["new_tokens"].mean())
        if "identical_to_baseline" in group and group["identical_to_baseline"].notna().any():
            row["identical_to_baseline"] = float(group["identical_to_baseline"].astype(float).mean())
            if "first_divergence" in group:  # how many rows differ, and from which token on
                parted = group["first_divergence"].dropna()
                row["rows_differing"] = int(len(parted))
                row["first_divergence_min"] = int(parted.min()) if len(parted) else None
            if "identical_share" in group:  # how much of the output survives a divergence
                row["identical_share"] = float(group["identical_share"].astype(float).mean())
        rows.append(row)
    return pd.DataFrame(rows)

"""Replay under load: requests arriving over time, served by continuous batching, every policy at
every arrival rate from one record and the cost surface (docs/batch-sizes.md#under-load).

A server's batch moves with its traffic: requests arrive (a Poisson process at a rate, or a
trace of arrival times), join the running batch at a step boundary while it has a free row (up to
the max batch), and leave when done. Under greedy verification a request's rounds are its
record's whatever else shares the batch, so the batched walk (replay/batched.py) replays the
server step by step: it admits the requests that have arrived, charges each step what the cost
model over B says for its live rows and its longest draft (the padded layout, what the batched
decoder runs), charges each joining request its own prefill, and stamps every request's first
and last token. From those, per request: time to first token (TTFT, arrival to the first
round's end), time per output token (TPOT, first to last token over the tokens after the
first) and end-to-end latency; per run: output tokens per second from the first arrival to the
last token, and goodput, the tokens of the requests that met the latency limits per second.

Requests take the record's rows in turn (request i is row i mod rows): more requests than
prompts repeat the prompts, which under greedy decoding repeats their rounds exactly. A sampled
record's rows are its paths (sampled.as_one). Deterministic given the arrivals' seed.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.errors import DsparkError
from dspark_bench.objectives import rank_under_load
from dspark_bench.replay.arrivals import Arrivals, poisson, read_trace  # noqa: F401 (this module's words too)
from dspark_bench.replay.batched import walks
from dspark_bench.replay.cost import CostSurface
from dspark_bench.replay.record import Record
from dspark_bench.replay.sampled import rows_of

PLAIN = "plain decoding"  # the label of the baseline's rows (config_id -1)
PERCENTILES = (50, 99)


def requests_of(rec: Record, requests: int) -> Record:
    """`requests` rows of `rec`, row i mod rows for request i (a greedy-shaped record)."""
    return rows_of(rec, np.arange(requests) % len(rec.lengths))


def serving_metrics(arrive: np.ndarray, first: np.ndarray, end: np.ndarray, tokens: np.ndarray,
                    tpot_limit: float | None = None, ttft_limit: float | None = None) -> dict:
    """What an operator reads of one run, from each request's arrival, first and last token (s) and
    output tokens: TTFT, TPOT and end-to-end latency at p50 / p99, output tokens per second over
    the run (first arrival to last token), and goodput (tokens per second of the requests within
    both limits; None: no limit on that side). TPOT is over the tokens after the first; a
    one-token request has none and is left out of it."""
    tokens = np.asarray(tokens, dtype=np.float64)
    ttft, e2e = first - arrive, end - arrive
    many = tokens > 1
    tpot = np.where(many, (end - first) / np.maximum(tokens - 1, 1), np.nan)
    span = max(float(end.max() - arrive.min()), 1e-12)
    met = np.ones(len(tokens), dtype=bool)
    if tpot_limit is not None:
        met &= ~many | (tpot <= tpot_limit)
    if ttft_limit is not None:
        met &= ttft <= ttft_limit
    out = {"throughput": float(tokens.sum() / span), "goodput": float(tokens[met].sum() / span),
           "met_share": float(met.mean()), "makespan_s": span}
    for q in PERCENTILES:
        out[f"ttft_p{q}_s"] = float(np.percentile(ttft, q))
        out[f"tpot_p{q}_s"] = float(np.nanpercentile(tpot, q)) if many.any() else math.nan
        out[f"e2e_p{q}_s"] = float(np.percentile(e2e, q))
    return out


def check_load(surface: CostSurface, max_batch: int) -> None:
    """Refuse a load the cost model over B cannot price: a max batch beyond its largest measured B."""
    largest = max(surface.models)
    if max_batch > largest:
        raise DsparkError(f"--max-batch {max_batch} is beyond the cost surface, measured up to B = {largest}; "
                          f"time it at that batch size (add --batch-size {max_batch})")


def replay_load(rec: Record, configs: list[DecodeConfig], surface: CostSurface, loads: list[Arrivals],
                max_batch: int, tpot_limit: float | None = None, ttft_limit: float | None = None) -> pd.DataFrame:
    """Every policy (at `max_batch` rows) and plain decoding under every load: one row each, with
    serving_metrics' columns, the load's `arrival` label and `arrival_rate`, and the policy's
    `config_id` (-1: plain decoding), `config_label` and `schedule`."""
    check_load(surface, max_batch)
    configs = [c.replace(batch_size=max_batch) for c in configs]
    frames = []
    for load in loads:
        requests = requests_of(rec, load.requests)
        tokens = requests.lengths.astype(np.float64)

        def measured(first, end):
            return serving_metrics(load.times, first, end, tokens, tpot_limit, ttft_limit)

        rows = list(walks(requests, configs, surface, True, load.times, measured))
        frames.append(pd.DataFrame(rows).assign(arrival=load.label, arrival_rate=load.rate,
                                                requests=load.requests))
    table = pd.concat(frames, ignore_index=True)
    table["config_label"] = [PLAIN if c < 0 else configs[c].policy_label() for c in table["config_id"]]
    table["schedule"] = ["" if c < 0 else configs[c].stopping.schedule for c in table["config_id"]]
    return table.drop(columns=[c for c in ("batch_size", "predicted_baseline_time") if c in table])


COLUMNS = ["config_label", "throughput", "goodput", "tpot_p50_s", "tpot_p99_s", "ttft_p50_s", "ttft_p99_s",
           "e2e_p99_s"]


def verdicts(table: pd.DataFrame, objective: str, tpot_limit: float | None = None) -> list[dict]:
    """Per load, lightest first: the best policy by `objective`, the best fixed γ and plain
    decoding (each its COLUMNS, None where nothing qualifies), and the best's gain over each."""
    out = []
    for (rate, label), group in table.groupby(["arrival_rate", "arrival"], sort=True):
        plain = group[group["config_id"] < 0]
        policies = group[group["config_id"] >= 0]
        fixed = policies[schedules.where(policies, baseline=True)]
        best, best_fixed = rank_under_load(policies, objective, tpot_limit), rank_under_load(fixed, objective,
                                                                                            tpot_limit)
        row = {"arrival": label, "arrival_rate": float(rate), "objective": objective, "tpot_limit_s": tpot_limit,
               "policies": int(len(policies))}
        for name, ranked in (("best", best), ("best_fixed", best_fixed), ("plain", plain)):
            row[name] = None if ranked.empty else {k: _plain(v) for k, v in ranked.iloc[0][COLUMNS].items()}
        out.append(row)
    return out


def _plain(value):
    return value.item() if hasattr(value, "item") else value

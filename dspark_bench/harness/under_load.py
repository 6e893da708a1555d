"""A real run under load: the batched decoder (continuous batching, `--batching refill`) serving requests
that arrive over time, the measurement replay under load (replay/under_load.py) predicts.

Each policy, and plain decoding, is a server of its own (`decoding.batched.serving` with the
requests' arrivals): it admits a request at a step boundary once it has arrived and has a free row,
and jumps its clock over the time it stands empty. The servers take turns a step each, so they
share the machine's drift at a fine grain, and each counts its own time only (docs/batch-sizes.md#under-load).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import torch

from dspark_bench.config import LEARNED, DecodeConfig
from dspark_bench.decoding.batched import autoregressive_serving, interleave, speculative_serving
from dspark_bench.errors import DsparkError
from dspark_bench.measure.between_steps import CostBetweenSteps
from dspark_bench.replay.cost import CostSurface
from dspark_bench.replay.slots import spliced
from dspark_bench.replay.step_prices import draft_row, prefill_seconds, step_prices, verify_row
from dspark_bench.replay.under_load import PLAIN, Arrivals, serving_metrics


@torch.inference_mode()
def run_under_load(pair, prompt_ids: list[list[int]], configs: list[DecodeConfig], arrivals: Arrivals, max_batch: int,
             eos_ids: frozenset[int], tpot_limit: float | None = None, ttft_limit: float | None = None,
             sampler: CostBetweenSteps | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Plain decoding and every policy serving `arrivals` (request i: prompt i mod prompts) at up
    to `max_batch` rows: (one row per server with serving_metrics' columns and `identical`, every
    request's output equal to plain decoding's, where greedy; every request's times; every
    admission and step each server timed: `serving`'s trace, by config_id). `sampler` times one pass
    of the cost surface per turn of the servers, beside them."""
    if not prompt_ids:
        raise DsparkError("a run under load needs at least one prompt")
    ids = [prompt_ids[i % len(prompt_ids)] for i in range(arrivals.requests)]
    if any(c.verification.compiled for c in configs):  # each static cache serves one decode at a time
        raise DsparkError("the servers of a run under load decode side by side, which captured passes cannot (one "
                          "static cache per model): give it policies that are not compiled")
    configs = [c.replace(batch_size=max_batch) for c in configs]
    times = [float(t) for t in arrivals.times]
    plain_config = configs[0] if configs else DecodeConfig().replace(batch_size=max_batch)
    traces = [[] for _ in range(len(configs) + 1)]
    servers = [autoregressive_serving(pair.target, ids, plain_config, max_batch, eos_ids, True, None, times,
                                      traces[0])]
    if any(c.drafting.drafter != "model" for c in configs):
        raise DsparkError("a run under load drafts with the draft model (the batched decoder's only drafter)")
    servers += [speculative_serving(pair.target, pair.draft, ids, c, max_batch, eos_ids, True, None, times, trace)
                for c, trace in zip(configs, traces[1:])]
    served = interleave(*servers, beside=sampler.step if sampler is not None else None)
    if sampler is not None:
        sampler.complete()  # a run too short to time every cell beside it
    plain = [r.result.tokens for r in served[0]]
    rows, requests = [], []
    for index, (label, finished) in enumerate(zip([PLAIN] + [c.policy_label() for c in configs], served)):
        arrive, first, end = (np.array([getattr(r, name) for r in finished], dtype=np.float64)
                              for name in ("arrival", "first_token", "finished"))
        tokens = np.array([len(r.result.tokens) for r in finished], dtype=np.float64)
        greedy = plain_config.greedy
        rows.append({"config_id": index - 1, "config_label": label, "arrival": arrivals.label,
                     "arrival_rate": arrivals.rate, "requests": arrivals.requests,
                     **serving_metrics(arrive, first, end, tokens, tpot_limit, ttft_limit),
                     "identical": all(r.result.tokens == p for r, p in zip(finished, plain)) if greedy else None})
        requests.append(pd.DataFrame({"config_id": index - 1, "request": np.arange(len(finished)), "arrival_s": arrive,
                                      "admitted_s": [r.admitted for r in finished], "first_token_s": first,
                                      "finished_s": end, "tokens": tokens.astype(int)}))
    learned = [False] + [c.stopping.metric == LEARNED for c in configs]  # its draft steps cost t_learned too
    steps = pd.DataFrame([{"config_id": index - 1, "learned": learned[index], "kind": entry[0], "rows": entry[1],
                           **({"tokens": entry[2], "depth": entry[3]} if entry[0] == "join" else
                              {"forwards": entry[2], "longest": entry[3], "depth": entry[4]}), "seconds": entry[-1]}
                          for index, trace in enumerate(traces) for entry in trace])
    return pd.DataFrame(rows), pd.concat(requests, ignore_index=True), steps


def step_costs(steps: pd.DataFrame, surface: CostSurface) -> np.ndarray:
    """What the cost surface charges for each traced admission and step (run_under_load's `steps`), as
    the load replay charges it: a join its prompt's prefill (the draft's too on a speculative
    server) and the splice into the batch's caches (join_positions), a step forwards · t_draft(rows)
    + t_verify(rows, longest) at its widest row's depth (replay/step_prices.py), with the surface's
    step terms where it has them (plain decoding's on its server)."""
    largest = int(steps["rows"].max())
    prices = {(learned, plain): step_prices(surface, largest, learned, plain) for learned in (False, True)
              for plain in (False, True)}
    joins = (steps["kind"] == "join").to_numpy()
    tokens = steps["tokens"].fillna(0).to_numpy(dtype=np.float64) if "tokens" in steps else np.zeros(len(steps))
    plain_prefill, spec_prefill = prefill_seconds(surface, tokens)
    out = np.where(steps["config_id"].to_numpy() >= 0, spec_prefill, plain_prefill)
    out = out + np.where(joins, surface.join_slots() * join_positions(steps), 0.0)
    for i in np.flatnonzero(~joins):
        step = steps.iloc[i]
        priced, rows = prices[(bool(step.learned), step.config_id < 0)], int(step.rows)
        depth = float(step.depth) if "depth" in steps else 0.0
        out[i] = (step.forwards * draft_row(priced.at, priced.draft, depth)[rows]
                  + verify_row(priced.at, priced.verify, depth, rows)[int(step.longest)])
    return out


def join_positions(steps: pd.DataFrame) -> np.ndarray:
    """Each traced admission's positions of the batch's caches it was spliced into (replay/slots.spliced;
    0 for a step, and for a trace that did not record a join's widest row)."""
    joins = (steps["kind"] == "join").to_numpy()
    depth = steps["depth"].fillna(0).to_numpy(np.float64) if "depth" in steps else np.zeros(len(steps))
    tokens = steps["tokens"].fillna(0).to_numpy(np.float64) if "tokens" in steps else np.zeros(len(steps))
    rows = steps["rows"].to_numpy(np.float64)
    return np.array([spliced(r, d, t) if j else 0.0 for j, r, d, t in zip(joins, rows, depth, tokens)])


def in_decode_ratios(steps: pd.DataFrame, surface: CostSurface) -> pd.DataFrame:
    """How far a traced run's own admissions and steps took from what `surface` charges for them:
    seconds / priced, per kind and row count (1: the surface is exact for this run)."""
    table = steps.assign(priced=step_costs(steps, surface))
    return (table.groupby(["kind", "rows"]).agg(count=("seconds", "size"), seconds=("seconds", "sum"),
                                                priced=("priced", "sum"))
            .assign(ratio=lambda t: t["seconds"] / t["priced"]).reset_index())


def in_decode_surface(surface: CostSurface, ratios: pd.DataFrame) -> CostSurface:
    """`surface` with every measured batch size's passes scaled by how much longer traced runs' own
    steps took than what they were priced (`ratios`: in_decode_ratios of one or more runs, pooled;
    for a batch size the runs never had, the nearest row count they had), and the prefill by the
    same for their admissions: prices as the decoder paid them inside a run, where an isolated
    pass on a static batch (`CostBetweenSteps`) misses what a live batch adds (wider caches with
    holes, rows joining and leaving)."""
    pooled = ratios.groupby(["kind", "rows"])[["seconds", "priced"]].sum()
    steps = pooled.loc["step"]
    observed = steps.index.to_numpy()
    models = {}
    for b, model in surface.models.items():
        nearest = steps.loc[observed[np.abs(observed - b).argmin()]]
        ratio = float(nearest["seconds"] / nearest["priced"])
        models[b] = dataclasses.replace(model, t_draft=model.t_draft * ratio, t_learned=model.t_learned * ratio,
                                        t_first_draft=model.t_first_draft * ratio,
                                        t_verify=[t * ratio for t in model.t_verify])
    joins = pooled.loc["join"].sum() if "join" in pooled.index.get_level_values("kind") else None
    if joins is not None and joins["priced"] > 0:  # a surface without prefill prices has none to scale
        ratio, first = float(joins["seconds"] / joins["priced"]), min(models)
        models[first] = dataclasses.replace(models[first], t_prefill_target=models[first].t_prefill_target * ratio,
                                            t_prefill_draft=models[first].t_prefill_draft * ratio)
    return CostSurface(models)

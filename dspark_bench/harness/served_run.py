"""`dspark-bench run --arrival-rate R` (and `--arrival-trace`): our batched decoder serving the
arrivals for real, beside what replay predicts for them (docs/batch-sizes.md#under-load).

The run records its prompts (greedy), prices its passes as a sweep does (inside running decodes
by default: harness/in_decode.py; `--isolated-prices`: alone), replays plain decoding and every
policy under each load (replay/under_load.py), then serves each load for real: plain decoding and
the policies each a server of its own, taking turns a step each (harness/under_load.py). Its run
folder holds both side by side (load.parquet), every request's times (requests.parquet), every
admission and step the servers timed (steps.parquet) and the prices (cost_surface.json, and the
live batch's steps its terms were fitted on: calibration_steps.parquet); summary.json's `load_run`
is the section sections/served.py reads.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from dspark_bench.config import LEARNED
from dspark_bench.decoding import learned_signal
from dspark_bench.errors import DsparkError
from dspark_bench.harness.in_decode import price_in_decode
from dspark_bench.harness.run import Planned, RunConfig, plan_run
from dspark_bench.harness.under_load import run_under_load
from dspark_bench.harness.workload import served
from dspark_bench.measure.cost_model import halfway, measure_surface, time_depths
from dspark_bench.measure.recording import record
from dspark_bench.replay import learned
from dspark_bench.replay.arrivals import Arrivals
from dspark_bench.replay.simulate import simulate_grid
from dspark_bench.replay.under_load import replay_load
from dspark_bench.results import check_writable, write_json, write_run
from dspark_bench.tasks.prompts import encode, prompts_fingerprint

METRICS = ("throughput", "goodput", "tpot_p50_s", "tpot_p99_s", "ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s")


def max_batch_of(config: RunConfig) -> int:
    """The rows a server decodes at once: --max-batch, else the run's largest --batch-size."""
    return config.max_batch or max(config.batch_sizes)


def with_signals(rec, configs: list) -> object:
    """The record with the learned signal its learned policies read (one signal file among them:
    a record holds one `learned` confidence), as a sweep's record holds the signal it fitted."""
    files = {c.stopping.signal_model for c in configs if c.stopping.metric == LEARNED}
    if len(files) > 1:
        raise DsparkError("a run under load replays one learned signal: give its policies one --signal-model")
    return learned.with_learned(rec, learned_signal.load(files.pop())) if files else rec


def surface_sizes(max_batch: int) -> list[int]:
    """The batch sizes the passes are timed at: 1, the powers of two below the max batch, and it."""
    return sorted({1, max_batch} | {1 << i for i in range(max_batch.bit_length()) if 1 << i < max_batch})


def priced(planned: Planned, ids: list[list[int]], rec, max_batch: int, say=None):
    """The cost surface replay charges the servers' steps with, where it was timed, and the live
    batch's traced steps its terms were fitted on (None: isolated prices, or no batch above 1)."""
    pair, configs = planned.pair, planned.configs
    gamma, sizes = max(c.stopping.gamma_max for c in configs), surface_sizes(max_batch)
    context, rows = ids[0] + rec.continuation[0, : int(rec.lengths[0]) // 2].tolist(), halfway(rec, ids)
    surface = measure_surface(pair, context, gamma, sizes, contexts=rows)
    time_depths(pair, rec, ids, surface, gamma, False, 0)  # long prompts: each step at its rows' depths
    if planned.config.isolated_prices:
        return surface, {"passes": "isolated"}, None
    if max_batch == 1:  # replay walks a server's steps on its passes: a batch-1 decoder's round work has no place
        why = "a server of one row has no live batch to fit step terms on"
        return surface, {"passes": "isolated", "why": why}, None
    timed = price_in_decode(pair, ids, configs[0], surface, gamma, planned.config.settings().eos_ids(pair), say=say)
    return timed.surface, timed.described(), timed.steps


def side_by_side(predicted: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """One row per (load, policy): the measured metrics, and the predicted ones as `<metric>_replay`."""
    replayed = predicted[["arrival", "config_id", *METRICS]].rename(columns={m: f"{m}_replay" for m in METRICS})
    return measured.merge(replayed, on=["arrival", "config_id"], how="left")


def serve(planned: Planned, ids: list[list[int]], loads: list[Arrivals], max_batch: int, eos_ids, progress=None):
    """Each load served for real: (one row per load and server, every request's times, every
    admission and step each server timed)."""
    rows, requests, steps = [], [], []
    for index, load in enumerate(loads):
        if progress:
            progress("serving", index, len(loads))
        table, times, traced = run_under_load(planned.pair, ids, planned.configs, load, max_batch, eos_ids)
        rows.append(table)
        requests.append(times.assign(arrival=load.label))
        steps.append(traced.assign(arrival=load.label))
    if progress:
        progress("serving", len(loads), len(loads))
    return tuple(pd.concat(parts, ignore_index=True) for parts in (rows, requests, steps))


def execute_served(config: RunConfig, out: Path, progress=None, say=None,
                   planned: Planned | None = None) -> tuple[Path, pd.DataFrame]:
    """Run `config` under its loads into a new run folder under `out`: (folder, side_by_side's table)."""
    check_writable(out)  # before models load
    if not served(config):
        raise DsparkError("a run under load needs --arrival-rate or --arrival-trace")
    planned, loads = planned or plan_run(config), config.loads()
    pair, configs, max_batch = planned.pair, planned.configs, max_batch_of(config)
    eos_ids = config.settings().eos_ids(pair)
    ids = [encode(pair.tokenizer, p.text, config.chat_template) for p in planned.prompts]
    if say:
        count = f"{len(configs)} polic{'y' if len(configs) == 1 else 'ies'}"
        say(f"under load: {len(loads)} load(s) of {', '.join(str(load.requests) for load in loads)} requests, up to "
            f"{max_batch} at once, served by plain decoding and {count} in turns; replay's prediction first")
    rec = with_signals(record(pair, ids, configs[0].verification.max_new_tokens,
                              max(c.stopping.gamma_max for c in configs), eos_ids=eos_ids), configs)
    surface, prices, calibration = priced(planned, ids, rec, max_batch, say)
    predicted = replay_load(rec, configs, surface, loads, max_batch)
    started = time.perf_counter()
    measured, requests, steps = serve(planned, ids, loads, max_batch, eos_ids, progress)
    table = side_by_side(predicted, measured)
    section = {"max_batch": max_batch, "requests": f"{config.requests} requests per rate" if config.arrival_rates
               else f"{loads[-1].requests} requests in the trace", "prices": prices,
               "seconds": time.perf_counter() - started,
               "rows": table[["arrival", "config_id", "config_label", "identical", *METRICS,
                              *(f"{m}_replay" for m in METRICS)]].to_dict(orient="records")}
    # Each policy's rounds on the record, as a sweep's table holds them (the report's policy metrics).
    policies = simulate_grid(rec, configs, surface.at(1)).assign(config_label=[c.label() for c in configs],
                                                                 source="replay")
    folder = write_run(out, "run", run_info(planned, max_batch, loads),
                       {"configs": policies.to_dict(orient="records"), "load_run": section},
                       {"load": table, "requests": requests, "steps": steps, "calibration_steps": calibration})
    write_json(folder / "cost_surface.json", surface.to_dict())
    return folder, table


def run_info(planned: Planned, max_batch: int, loads: list[Arrivals]) -> dict:
    """run.json's account of the run: its whole config (`run --config` serves it again), the models, the prompts."""
    return {"config": planned.config.to_dict(), "configs": [c.to_dict() for c in planned.configs],
            "models": planned.pair.describe(), "settings": {"max_batch": max_batch,
                                                            "loads": [load.label for load in loads]},
            "prompts": {"count": len(planned.prompts), "fingerprint": prompts_fingerprint(planned.prompts),
                        **planned.source}}

"""Replay sweeps: record the target's continuation and the drafter's rollouts once, simulate every
policy of the space (fixed gamma, goodput, budget and the learned signal joining it:
added_policies.py) under the cost surface, and confirm the best with real timed runs. What a
sweep works on is prepared in preparation.py, shared with the real (grid / Optuna) sweeps."""


from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import pandas as pd

from dspark_bench import schedules
from dspark_bench.analysis.analyze import Studied
from dspark_bench.config import DEFAULTS, DecodeConfig, expand
from dspark_bench.decoding import capture, controllers
from dspark_bench.decoding.static_batch_lm import capacity_for
from dspark_bench.engines.registry import EngineRegistry
from dspark_bench.errors import DsparkError
from dspark_bench.harness.health import (
    LoadProbe,
    health,
    measured_over_predicted,
    timed_surface,
    wall_over_estimate,
    worst,
)
from dspark_bench.harness.in_decode import price_in_decode
from dspark_bench.harness.workload import served
from dspark_bench.measure.cost_model import halfway, measure_surface, time_depths, torch_version
from dspark_bench.replay import cost_file, sampled
from dspark_bench.replay.batched import simulate_with_surface
from dspark_bench.replay.simulate import simulate_grid
from dspark_bench.results import write_json, write_parquet
from dspark_bench.sections import registry
from dspark_bench.sections.analyses import Analyses
from dspark_bench.sections.base import SweepFacts
from dspark_bench.sections.depth import depth_search_of, depth_verdict, join_depth_policy
from dspark_bench.sections.engine_verdict import EngineVerdict
from dspark_bench.tasks.prompts import encode
from dspark_bench.tuning.added_policies import (
    budget_points,
    goodput_points,
    learned_points,
    priced_points,
    write_goodput_model,
    write_learned_signal,
)
from dspark_bench.tuning.confirm import confirm
from dspark_bench.tuning.preparation import LoadedSweep, SweepResult
from dspark_bench.tuning.records import drafter_groups, record_all, record_key
from dspark_bench.tuning.replay_summary import write_replay_summary
from dspark_bench.tuning.spec import SweepSpec, max_batch_of
from dspark_bench.tuning.sweep_plan import say_replay_plan

if TYPE_CHECKING:
    from dspark_bench.harness.runner import StageProgress

PRICES_FILE = "prices.json"  # the cost-model file every prediction of the sweep was priced with
OURS_FILE = "prices_ours.json"  # beside it, where that is an engine's: our decoder's, which confirms
MODEL = DEFAULTS.drafting  # the draft model: the drafter whose record the fits and analyses read


def engine_verdict(spec: SweepSpec, prepared: LoadedSweep, records: dict, prices, gamma: int, folder: Path,
                   engines: EngineRegistry, say, progress) -> EngineVerdict | None:
    """The deployment engine's own verdict where the sweep is priced on an engine that can run
    its policies (llama.cpp): measured there, not on ours. None for our own prices."""
    name = prices.engine.measured_by.get("name") if prices.engine is not None else None
    if name not in engines.confirm or MODEL not in records or not prepared.base.greedy:  # its confirmation is greedy
        return None
    verdict = engines.confirm[name](spec, prepared, records[MODEL], prices.engine, gamma, folder, say, progress)
    return EngineVerdict.from_json({"engine_verdict": verdict})


def needs_draft_model(pair) -> None:
    """Replay's cost model times the draft model's steps (and goodput fits its record): a
    target alone cannot be replayed."""
    if pair.draft is None:
        raise DsparkError("replay times the draft model's steps for its cost model: pass --draft too, "
                          "or --evaluation real with a target alone")


def replay_space(configs: list[DecodeConfig], base: DecodeConfig) -> list[DecodeConfig]:
    """The space's points (spec.points) plus every fixed gamma among them: classic decoding, the
    baseline to beat; and each engine controller of the space at its engine's defaults, at each of
    its batch sizes (what it would run untuned: sections/controllers.py)."""
    drafters = dict.fromkeys(c.drafting for c in configs)
    classic = [c for d in drafters  # at the batch sizes the drafter runs at in the space (heads and lookup: 1)
               for c in expand({"batch_size": sorted({c.batching.batch_size for c in configs if c.drafting == d}),
                                "gamma_max": sorted({c.stopping.gamma_max for c in configs})},
                               base.replace(schedule=schedules.BASELINE, min_draft_len=0, **dataclasses.asdict(d)))]
    shipped = [controllers.shipped(c) for c in configs if schedules.of(c).controlled]
    return configs + [c for c in dict.fromkeys(classic + shipped) if c not in configs]


def replay_sweep(folder: Path, spec: SweepSpec, prepared: LoadedSweep, records_root: Path,
                 progress: StageProgress | None = None, say: Callable[[str], None] | None = None,
                 engines: EngineRegistry | None = None) -> SweepResult:
    """Record once, price, simulate the whole space, confirm the best few with real timed runs and
    summarise; the analyses (analysis/) too where the spec asks for them. Priced on an engine that
    `engines` can run, that engine confirms too, and its verdict leads the summary."""

    probe, started = LoadProbe(), time.perf_counter()
    probe.sample("start")
    configs, gamma, record_dirs, ids = record_plan(spec, prepared, records_root)
    estimate = None if say is None else say_replay_plan(
        spec, prepared, ids, configs, all((d / "record.json").is_file() for d in record_dirs.values()), say)
    records = record_all(spec, prepared, gamma, ids, configs, record_dirs, progress)
    probe.sample("recorded")
    in_decode = None if spec.isolated_prices else (prepared.base, spec.runner_settings().eos_ids(prepared.pair))
    prices = time_prices(folder, prepared.pair, ids, records, configs, gamma, progress, prepared.prices, spec.eager,
                         in_decode)
    probe.sample("cost model timed")
    configs, records = join_fitted(folder, configs, records, record_dirs, prices.surface)
    table = simulate_all(folder, configs, records, prices, progress)
    configs, table, depth = join_depth_policy(folder, configs, table, records.get(MODEL), prices.cost,
                                              prices.ours.at(1) if prices.engine else None)
    # An unreliable cost table still ranks (rounds are exact), but its picks are confirmed harder.
    cost_unreliable = worst(c.verdict for c in prices.checks) == "unreliable"
    table, samples, paired, verdict = confirm_stage(spec, prepared, table, configs, records, prices, gamma, folder,
                                                    cost_unreliable, engines or EngineRegistry(), say, progress)
    probe.sample("confirmed")
    found = [verdict]
    if depth is not None:  # each bucket's choice, and the depth policy against the best single one, paired
        found.append(dataclasses.replace(depth_search_of(depth, table, configs, records[MODEL], prices.cost),
                                         verdict=depth_verdict(table, samples, (paired or {}).get("same_work"))))
    write_parquet(folder / "trials.parquet", table)
    if not samples.empty:
        write_parquet(folder / "samples.parquet", samples)
    found += registry.computed(SweepFacts(folder, spec, configs, table, records[record_key_of(records)],
                                          records.get(MODEL), prices.surface,
                                          max_batch_of(spec) if served(spec) else None, say, progress))
    checks = sweep_checks(table, prices, probe, time.perf_counter() - started, estimate)
    record_dir = record_dirs.get(MODEL, next(iter(record_dirs.values())))
    found = [result for result in found if result is not None]
    # where the target's continuations came from: an engine's file, else decoded here
    continuations = prepared.continuations.describe() if prepared.continuations else None
    result = write_replay_summary(folder, table, spec, prices.cost, record_dir, health(checks), not cost_unreliable,
                                  paired, found, prices=prices.described(folder), continuations=continuations)
    if spec.analyze and MODEL in records and prepared.base.greedy:
        studied = Studied(table, records[MODEL], prices.cost, prices.surface if prices.batched else None)
        result.sections.append(Analyses.of(studied, progress))
        write_json(folder / Analyses.FILE, result.sections[-1].to_json())
    return result


def sweep_checks(table: pd.DataFrame, prices: Prices, probe: LoadProbe, wall_s: float, estimate) -> list:
    """The sweep's own timing checks: the cost table's, the load probe's, the confirmed policies'
    measured over predicted, and the wall time over the plan's estimate (which counts the prices' timing)."""
    confirmed = table[table["source"] == "confirmed"]
    # Our decoder confirms: its measurements are judged against the prediction priced on its costs.
    measured_column = "predicted_speedup_ours" if prices.engine else "predicted_speedup"
    return prices.checks + [*probe.checks(), measured_over_predicted(confirmed, measured_column),
                            wall_over_estimate(wall_s, estimate)]


def confirm_stage(spec: SweepSpec, prepared: LoadedSweep, table: pd.DataFrame, configs: list[DecodeConfig],
                  records: dict, prices: Prices, gamma: int, folder: Path, harder: bool, engines: EngineRegistry, say,
                  progress) -> tuple[pd.DataFrame, pd.DataFrame, dict | None, dict | None]:
    """The timed stage: the best `confirm_top` policies and the best fixed γ timed on our decoder
    (twice the repeats where the cost table is unreliable: `harder`) and, priced on an engine that
    `engines` can run, in that engine too. `--confirm-top 0`: replay's answer alone, nothing timed.
    Returns the table with the measured columns, the samples, the paired verdicts, the engine's verdict."""
    if spec.confirm_top == 0:
        return table, pd.DataFrame(), None, None
    table, samples, paired = confirm(table, configs, {key: sampled.as_one(r) for key, r in records.items()}, spec,
                                     prepared, progress, repeats=spec.repeats * (2 if harder else 1), say=say)
    return table, samples, paired, engine_verdict(spec, prepared, records, prices, gamma, folder, engines, say,
                                                  progress)


def record_key_of(records: dict):
    """The record the summary names: the draft model's, else the first."""
    return MODEL if MODEL in records else next(iter(records))


def record_plan(spec: SweepSpec, prepared: LoadedSweep, records_root: Path):
    """What a replay sweep records: its policies, the rollout length (their longest γ), one
    record folder per drafter, and the prompts' token ids."""
    configs = replay_space(prepared.points, prepared.base)
    gamma = max(c.stopping.gamma_max for c in configs)
    record_dirs = {key: records_root / record_key(spec, prepared, gamma, key) for key in drafter_groups(configs)}
    ids = [encode(prepared.pair.tokenizer, p.text, spec.chat_template) for p in prepared.prompts]
    return configs, gamma, record_dirs, ids


@dataclass
class Prices:
    """What a round costs, as replay prices it: the cost surface (per batch size) and its batch-1
    cost model, those of the engine `--prices` names (`engine`, a cost_file.CostFile) or else
    ours timed on this machine; ours always (`ours`), with the checks of its timings and how long
    they took: our decoder confirms the best policies."""

    surface: object
    cost: object
    checks: list
    timing_s: float
    batched: bool  # any batch size > 1: policies are priced on the surface, both layouts
    ours: object = None  # our decoder's timed surface (when `engine` prices the ranking)
    engine: object = None  # the cost-model file that prices the ranking; None: ours
    passes: dict = dataclasses.field(default_factory=lambda: {"passes": "isolated"})  # where ours were timed

    def described(self, folder: Path) -> dict:
        """summary.json's "prices": whose costs every prediction used, and the file."""
        label = self.engine.label if self.engine else "our decoder"
        return {"label": label, "measured_by": self.engine.measured_by["name"] if self.engine else cost_file.OURS,
                "file": str(folder / PRICES_FILE), "source": self.engine.source if self.engine else "timed here",
                **self.passes}


def time_prices(folder: Path, pair, ids: list[list[int]], records: dict, configs: list[DecodeConfig], gamma: int,
                progress: StageProgress | None, engine=None, eager: bool = False, in_decode=None) -> Prices:
    """Time our cost surface (re-timed while its checks fail: replay ranks thousands of policies
    with it), take the engine's prices (`engine`, a cost_file.CostFile) instead where given, and write
    the prices used into the sweep folder (prices.json, the cost-model file; cost_model.json,
    and cost_surface.json at B > 1). Prompts (`ids`) longer than the first depth bucket's edge get
    our passes timed at depth too (depth.PRICED_DEPTHS; CostModel.by_depth). `in_decode`: (the
    sweep's base config, the ids that end a sequence) to price ours inside running decodes of the
    prompts (harness/in_decode.py); None: on the passes timed alone."""
    rec, first_ids = next(iter(records.values())), ids[0]
    # The cost model is timed with the cache at a realistic length: a prompt plus half its output;
    # a batch of B, with the prompts' own (a batch is as wide as its longest row makes it).
    context = first_ids + rec.continuation[0, : int(rec.lengths[0]) // 2].tolist()
    rows = halfway(rec, ids)
    if progress:
        progress("timing the cost model", 0, 1)
    batch_sizes = sorted({c.batching.batch_size for c in configs})
    # Priced on the passes the decodes run: captured on CUDA unless --eager (decoding/capture.py).
    compiled = capture.priced_captured(configs, pair.device, eager, (pair.target, pair.draft))
    timing = time.perf_counter()
    # B > 1 priced on static caches as wide as the decodes' (a captured pass attends over all of them).
    width = max(capacity_for(ids, c.verification.max_new_tokens, c.stopping.gamma_max) for c in configs)
    surface, checks = timed_surface(pair, context, gamma, batch_sizes, drafters={key.drafter for key in records},
                                    measure=functools.partial(measure_surface, contexts=rows, compiled=compiled,
                                                              width=width))
    # Each B > 1 at depth too (replay/step_prices.py prices a step at its rows'), before the live batch's
    # step terms are fitted against it.
    time_depths(pair, rec, ids, surface, gamma, compiled, width, progress)
    cost, passes = surface.at(1), {"passes": "isolated"}
    if in_decode is not None and any(c.drafting.drafter == MODEL.drafter for c in configs):
        if progress:
            progress("timing prices inside decodes", 0, 1)
        timed = price_in_decode(pair, ids, in_decode[0], surface, gamma, in_decode[1], compiled)
        cost, surface, passes = timed.cost, timed.surface or surface, timed.described()
        surface.models[1] = dataclasses.replace(surface.models[1], by_depth=cost.by_depth)
        if timed.steps is not None:  # the live batch's steps its terms were fitted on, to hold a run's steps against
            write_parquet(folder / "calibration_steps.parquet", timed.steps)
    timing = time.perf_counter() - timing
    ours = cost_file.ours(surface, pair, capture=capture.pass_mode(compiled, pair.device), version=torch_version())
    if engine is None:
        prices = Prices(surface, cost, checks, timing, batch_sizes != [1], passes=passes)
        ours.save(folder / PRICES_FILE)
    else:
        check_covers(engine, batch_sizes, gamma)
        prices = Prices(engine.surface, engine.surface.at(min(engine.surface.models)), checks, timing,
                        batch_sizes != [1], surface, engine, passes)
        engine.save(folder / PRICES_FILE)
        ours.save(folder / OURS_FILE)  # what predicted_speedup_ours priced with
    write_json(folder / "cost_model.json", prices.cost.to_dict())
    if prices.batched:
        write_json(folder / "cost_surface.json", prices.surface.to_dict())
    return prices


def check_covers(engine, batch_sizes: list[int], gamma: int) -> None:
    """An engine's cost model prices every batch size and draft length the space holds."""
    missing = sorted(set(batch_sizes) - set(engine.surface.models))
    if missing:
        raise DsparkError(f"{engine.where}prices batch sizes {', '.join(map(str, sorted(engine.surface.models)))}, "
                          f"not {', '.join(map(str, missing))}: measure those, or sweep the ones it has")
    short = min(len(m.t_verify) for m in engine.surface.models.values()) - 1
    if short < gamma:
        raise DsparkError(f"{engine.where}prices drafts of up to {short} tokens, not gamma_max {gamma}: measure "
                          "deeper, or sweep shorter drafts")


def join_fitted(folder: Path, configs: list[DecodeConfig], records: dict, record_dirs: dict,
                surface) -> tuple[list[DecodeConfig], dict]:
    """The policies fitted on the draft model's record join the space: goodput and budget (its
    acceptance fit and the cost surface; vLLM's controller in the space gets those costs), and the
    learned signal as a metric of every scheduled policy of the first one (then its record holds the
    signal at every rollout step)."""
    if MODEL not in records:
        return configs, records
    # Under sampling the acceptance fit reads every replicate's accepted tokens (the coins'
    # outcomes); the learned signal reads drafted tokens, which a sampled record does not hold.
    model_file = write_goodput_model(folder, sampled.as_one(records[MODEL]), record_dirs[MODEL], surface)
    configs = priced_points(configs, model_file)
    configs = configs + [c for c in goodput_points(configs, model_file) + budget_points(configs, model_file)
                         if c not in configs]
    is_sampled = records[MODEL].info.get("sampling") is not None
    learned_fit = None if is_sampled else write_learned_signal(folder, records[MODEL], record_dirs[MODEL])
    if learned_fit is None:
        return configs, records
    signal_file, learned_record = learned_fit
    return (configs + [c for c in learned_points(configs, signal_file) if c not in configs],
            {**records, MODEL: learned_record})


def simulate_all(folder: Path, configs: list[DecodeConfig], records: dict, prices: Prices,
                 progress: StageProgress | None) -> pd.DataFrame:
    """Every policy replayed on its drafter's record: at batch size 1 on the cost model, else at its
    own batch size in both layouts on the surface (replay/batched.py); one row per policy, in order."""
    if progress:
        progress(f"simulating {len(configs):,} policies", 0, 1)
    parts = []
    for key, group in drafter_groups(configs).items():
        chosen = [configs[i] for i in group]
        part = replayed(records[key], chosen, prices.surface, prices.cost, prices.batched)
        if prices.engine:  # what our decoder, which confirms, is predicted to measure
            part["predicted_speedup_ours"] = replayed(records[key], chosen, prices.ours, prices.ours.at(1),
                                                    prices.batched)["predicted_speedup"].to_numpy()
        parts.append(part.assign(config_id=np.array(group)))
    return pd.concat(parts, ignore_index=True).sort_values("config_id", ignore_index=True).assign(source="replay")


def replayed(rec, configs: list[DecodeConfig], surface, cost, batched: bool) -> pd.DataFrame:
    """The policies replayed on `rec`, priced on `surface` (at B > 1, both layouts) or `cost`; a
    sampled record's expectations over its replicates (replay/sampled.py). Prices timed inside
    decodes (the surface has a live batch's terms) price a batch-1 policy on `cost`, the batch-1
    decoder's own; passes timed alone, on the surface as before."""
    one = surface.batch_one(cost) if batched else None
    return sampled.expected([simulate_with_surface(r, configs, surface, batch_one=one) if batched
                             else simulate_grid(r, configs, cost) for r in sampled.replicates(rec)])

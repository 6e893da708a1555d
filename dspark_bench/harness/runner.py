"""Run decode configurations over prompts: warm-up, interleaved timing, one row per sample.

The place that times decoding (the cost model in measure/cost_model.py and the plan's estimate in plan.py
time single steps of their own). For each (prompt, config) the baseline and the speculative
decoder run alternately (A B A B ...), the device synchronised before each clock read, and
the median of each is kept, so slow drift of a noisy machine hits both sides alike. At batch
size B > 1 (`iter_batched`) both sides decode all prompts B at a time through batched.py,
taking turns step by step (so drift hits both at a fine grain), the side stepping first
alternating by repeat; a prompt's time is its share of its side's own steps.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd
import torch

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding import capture
from dspark_bench.decoding.autoregressive import autoregressive_decode, hf_assisted_decode
from dspark_bench.decoding.batched import autoregressive_serving, interleave, speculative_serving
from dspark_bench.decoding.cached_lm import decode_shapes, warm_compiled
from dspark_bench.decoding.host import synchronize
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.decoding.static_batch_lm import capacity_for, warm_batched
from dspark_bench.decoding.types import DecodeResult
from dspark_bench.harness.depth_breakdown import depth_breakdowns
from dspark_bench.harness.health import LoadProbe, baseline_drift, health, identical_rounds, wall_over_estimate
from dspark_bench.harness.models import ModelPair
from dspark_bench.harness.plan import measured_pace, precision_plan, run_plan
from dspark_bench.harness.samples import config_columns, round_rows, sample_fields
from dspark_bench.harness.verdicts import judge, with_schedules
from dspark_bench.harness.workload import RunnerSettings  # declared beside the workload; still importable here
from dspark_bench.metrics import summarize
from dspark_bench.results import check_writable, write_run
from dspark_bench.tasks.prompts import Prompt, encode, prompts_fingerprint


def speculative_decoder(settings: RunnerSettings):
    """The speculative decoder a run times against the baseline: ours, or HF assisted generation."""
    if settings.decoder == "hf":
        return hf_assisted_decode
    return speculative_decode


@dataclass
class RunOutput:
    samples: pd.DataFrame
    rounds: pd.DataFrame | None


def timed(fn: Callable[[], DecodeResult], device: torch.device) -> tuple[DecodeResult, float]:
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, time.perf_counter() - start


def measure(pair: ModelPair, prompt_ids: list[int], config: DecodeConfig, repeats: int, eos: frozenset[int],
            offset: int = 0, decode=speculative_decode, controller=None):
    """Baseline and speculative decode (`decode`) of one prompt, interleaved; medians of the times.
    `controller`: an engine controller's state as the prompt finds it (the last prompt's left it), which
    every repeat starts from (the speculative result's `controller`: where it left it)."""
    base_times, spec_times = [], []
    run_on = {} if controller is None else {"controller": controller}
    for repeat in range(repeats):
        # A B, then B A (and each sample starting where the last did not, by `offset`): neither
        # side always runs first (caches, clocks and boosts drift), even with one pair per sample.
        for side in ((0, 1) if (repeat + offset) % 2 == 0 else (1, 0)):
            if side == 0:
                baseline, t = timed(lambda: autoregressive_decode(pair.target, prompt_ids, config, eos), pair.device)
                base_times.append(t)
            else:
                spec, t = timed(lambda: decode(pair.target, pair.drafter_for(config), prompt_ids, config, eos,
                                               **{k: copy.deepcopy(v) for k, v in run_on.items()}), pair.device)
                spec_times.append(t)
    return baseline, spec, statistics.median(base_times), statistics.median(spec_times)


def conversation(prompt: Prompt, settings: RunnerSettings) -> list[str]:
    if settings.turns == "all":
        return [prompt.text, *prompt.turns]
    return [prompt.text]


def warm_up(pair: ModelPair, prompts: list[Prompt], configs: list[DecodeConfig], settings: RunnerSettings) -> None:
    if not prompts:
        return
    ids = encode(pair.tokenizer, prompts[0].text, settings.chat_template)
    short = configs[0].replace(max_new_tokens=min(16, configs[0].verification.max_new_tokens))
    for _ in range(settings.warmup):
        measure(pair, ids, short, repeats=1, eos=settings.eos_ids(pair), decode=speculative_decoder(settings))
    if any(c.verification.compiled for c in configs):
        warm_compiled_steps(pair, prompts, [c for c in configs if c.verification.compiled], settings)


def warm_compiled_steps(pair: ModelPair, prompts: list[Prompt], configs: list[DecodeConfig],
                        settings: RunnerSettings) -> None:
    """A compiled step compiles (and on CUDA captures a graph) at each input length it first
    sees, and again on a new static cache: every length a compiled policy feeds, on caches as
    long as the run's longest decode, then one whole decode — before any clock runs."""

    answer = max(c.verification.max_new_tokens + c.stopping.gamma_max + 1 for c in configs)
    # The longest cache a decode fills: a prompt and its answer; under --turns all, each turn holds
    # the earlier turns and their answers too (64 tokens a turn for the chat template's markers).
    capacity = max(sum(len(encode(pair.tokenizer, text, settings.chat_template)) + answer + 64
                       for text in conversation(p, settings)) for p in prompts)
    shapes = decode_shapes(max(c.stopping.gamma_max for c in configs))
    warm_compiled(pair.target, shapes["target"], capacity)
    warm_compiled(pair.draft, shapes["draft"], capacity, role="draft")
    ids = encode(pair.tokenizer, prompts[0].text, settings.chat_template)
    for config in dict.fromkeys(configs):
        measure(pair, ids, config, repeats=1, eos=settings.eos_ids(pair), decode=speculative_decoder(settings))


def iter_samples(
    pair: ModelPair, prompts: list[Prompt], configs: list[DecodeConfig], settings: RunnerSettings,
    assignment: list[list[int]] | None = None,
) -> Iterator[tuple[dict, list[dict]]]:
    """Yield (sample row, round rows) per (prompt, turn, config).

    Every prompt runs every config, unless `assignment` gives each prompt its configs' indexes
    (per-domain calibrated policies).
    """
    single = [c for c in configs if c.batching.batch_size == 1]
    if single:
        warm_up(pair, prompts, single, settings)
    measured, controllers = 0, {}  # an engine controller's state per policy, run on from prompt to prompt
    for index, prompt in enumerate(prompts):
        for config_id, config in enumerate(configs):
            if config.batching.batch_size > 1 or (assignment is not None and config_id not in assignment[index]):
                continue
            history: list[tuple[str, str]] = []
            for turn, text in enumerate(conversation(prompt, settings)):
                ids = encode(pair.tokenizer, text, settings.chat_template, history)
                baseline, spec, base_time, spec_time = measure(pair, ids, config, settings.repeats,
                                                               settings.eos_ids(pair), offset=measured,
                                                               decode=speculative_decoder(settings),
                                                               controller=controllers.get(config_id))
                controllers[config_id] = spec.controller
                measured += 1
                base = {"prompt_id": prompt.id, "category": prompt.category, "turn": turn,
                        **config_columns(config, config_id)}
                row = sample_fields(base, spec, baseline, config, len(ids), base_time, spec_time)
                yield row, round_rows(spec, base, len(ids)) if settings.trace else []
                # The next turn builds on the model's own previous answer.
                history.append((text, pair.tokenizer.decode(baseline.tokens, skip_special_tokens=True)))
    yield from iter_batched(pair, prompts, configs, settings, assignment)


@torch.inference_mode()
def measure_batched(pair: ModelPair, prompt_ids: list[list[int]], config: DecodeConfig, settings: RunnerSettings,
                    offset: int = 0):
    """Both sides over all prompts at batch size B, taking turns step by step (the side that
    steps first alternates by repeat; captured, run by run: static_batch_lm.py): (baseline
    requests, speculative requests, per-prompt median time shares of each side)."""

    eos, refill, B = settings.eos_ids(pair), settings.batching == "refill", config.batching.batch_size
    base_times, spec_times = [], []
    for repeat in range(settings.repeats):
        decoders = [autoregressive_serving(pair.target, prompt_ids, config, B, eos, refill),
                    speculative_serving(pair.target, pair.draft, prompt_ids, config, B, eos, refill)]
        first = (repeat + offset) % 2
        ordered = decoders[first:] + decoders[:first]
        if config.verification.compiled:  # one static cache per model and role: the sides take turns by run
            sides = [interleave(decoder)[0] for decoder in ordered]
        else:
            sides = interleave(*ordered)
        baseline, spec = sides[::1 if first == 0 else -1]
        base_times.append([r.time_s for r in baseline])
        spec_times.append([r.time_s for r in spec])
    return baseline, spec, np.median(base_times, axis=0), np.median(spec_times, axis=0)


@torch.inference_mode()
def warm_static_batch(pair: ModelPair, prompt_ids: list[list[int]], config: DecodeConfig) -> None:
    """A captured batched decode's passes compiled (on CUDA, captured) before any clock runs: every
    length it feeds, on static caches as wide as its run's (a wider one later would compile again)."""
    slots = max(1, min(config.batching.batch_size, len(prompt_ids)))
    capacity = capacity_for(prompt_ids, config.verification.max_new_tokens, config.stopping.gamma_max)
    shapes = decode_shapes(config.stopping.gamma_max)
    warm_batched(pair.target, slots, capacity, shapes["target"])
    warm_batched(pair.draft, slots, capacity, shapes["draft"], role="draft")


def iter_batched(pair: ModelPair, prompts: list[Prompt], configs: list[DecodeConfig], settings: RunnerSettings,
                 assignment: list[list[int]] | None = None) -> Iterator[tuple[dict, list[dict]]]:
    """Rows of the policies run at batch size B > 1: each policy decodes its prompts B at a time,
    both sides on the same batches; a row's times are its shares of the batched runs' wall time."""
    warmed = set()
    for config_id, config in enumerate(configs):
        if config.batching.batch_size == 1:
            continue
        chosen = [p for i, p in enumerate(prompts) if assignment is None or config_id in assignment[i]]
        ids = [encode(pair.tokenizer, p.text, settings.chat_template) for p in chosen]
        if config.verification.compiled and ids:
            warm_static_batch(pair, ids, config)
        if config.batching.batch_size not in warmed and ids and settings.warmup > 0:
            short = config.replace(max_new_tokens=min(16, config.verification.max_new_tokens))
            measure_batched(pair, ids[: config.batching.batch_size], short, dataclasses.replace(settings, repeats=1))
            warmed.add(config.batching.batch_size)
        if not ids:
            continue
        baselines, specs, base_times, spec_times = measure_batched(pair, ids, config, settings, offset=config_id)
        for prompt, prompt_ids, baseline, spec, base_time, spec_time in zip(chosen, ids, baselines, specs,
                                                                           base_times, spec_times):
            base = {"prompt_id": prompt.id, "category": prompt.category, "turn": 0, **config_columns(config, config_id)}
            row = sample_fields(base, spec.result, baseline.result, config, len(prompt_ids), base_time, spec_time)
            row.update(layout="padded", batching=settings.batching,
                       baseline_latency_per_token_s=baseline.latency_per_token,
                       spec_latency_per_token_s=spec.latency_per_token)
            yield row, round_rows(spec.result, base, len(prompt_ids)) if settings.trace else []


# Progress of a long job in stages: progress(stage description, done, total).
StageProgress = Callable[[str, int, int], None]


def stage_steps(progress: StageProgress | None, stage: str, total: int) -> Callable[[], None]:
    """A per-item callback (for `run`, `record`) that reports `stage` done of `total`."""
    done = 0

    def step():
        nonlocal done
        done += 1
        if progress:
            progress(stage, done, total)

    if progress:
        progress(stage, 0, total)
    return step


def run(
    pair: ModelPair,
    prompts: list[Prompt],
    configs: list[DecodeConfig],
    settings: RunnerSettings = RunnerSettings(),
    progress: Callable[[], None] | None = None,
    assignment: list[list[int]] | None = None,
) -> RunOutput:
    """Every (prompt, config), measured (`as_run`: captured on CUDA; the `compiled` column says how
    each ran); `progress` is called after each sample."""
    sample_rows, trace_rows = [], []
    for row, rounds in iter_samples(pair, prompts, as_run(pair, configs, settings), settings, assignment):
        sample_rows.append(row)
        trace_rows += rounds
        if progress:
            progress()
    samples = capture.labelled_as_asked(pd.DataFrame(sample_rows), configs)
    if "identical_to_baseline" in samples:
        samples["identical_to_baseline"] = samples["identical_to_baseline"].astype("boolean")
    return RunOutput(samples, capture.labelled_as_asked(pd.DataFrame(trace_rows), configs) if settings.trace else None)


def as_run(pair: ModelPair, configs: list[DecodeConfig], settings: RunnerSettings) -> list[DecodeConfig]:
    """The configs as `run` decodes them: captured on CUDA where they can be, unless --eager."""
    if settings.decoder != "ours":
        return list(configs)
    return capture.captured(configs, pair.device, settings.eager, (pair.target, pair.draft))


def another_pass(pair: ModelPair, prompts: list[Prompt], configs: list[DecodeConfig], settings: RunnerSettings,
                 pair_ids: tuple[int, int], number: int) -> pd.DataFrame:
    """One more interleaved pass of two policies (config_ids into `configs`) over the prompts,
    numbered `number` (column `pass`); no warm-up: the models are warm."""
    ids = np.array(pair_ids)
    output = run(pair, prompts, [configs[i] for i in pair_ids], dataclasses.replace(settings, warmup=0))
    return output.samples.assign(config_id=ids[output.samples["config_id"].to_numpy()], **{"pass": number})


def planned_samples(prompts: list[Prompt], configs: list[DecodeConfig], settings: RunnerSettings,
                    assignment: list[list[int]] | None = None) -> int:
    """How many (prompt, turn, config) measurements a run makes."""
    turns = [1 + len(p.turns) if settings.turns == "all" else 1 for p in prompts]
    if assignment is None:
        return sum(turns) * len(configs)
    return sum(t * len(assigned) for t, assigned in zip(turns, assignment))


def say_plan(pair: ModelPair, prompts: list[Prompt], configs: list[DecodeConfig], settings: RunnerSettings,
             assignment: list[list[int]] | None, say: Callable[[str], None]) -> float | None:
    """Say the plan; returns its estimate in seconds."""
    if not prompts:
        return None
    ids = [encode(pair.tokenizer, p.text, settings.chat_template) for p in prompts]
    pace = measured_pace(pair, sorted(ids, key=len)[len(ids) // 2])  # the median prompt's, its prefill apart
    tokens = max(c.verification.max_new_tokens for c in configs)
    plan, seconds = run_plan(pace, len(prompts), planned_samples(prompts, configs, settings, assignment),
                             len(configs), tokens, settings.repeats, float(np.mean([len(i) for i in ids])))
    if any(c.verification.compiled for c in configs):
        say(plan + ", after compiling every step it feeds (not in the estimate)")
        return None  # compiling is not in the estimate: nothing to hold the wall time to
    say(plan)
    return seconds


def run_to_folder(
    pair: ModelPair,
    prompts: list[Prompt],
    configs: list[DecodeConfig],
    out: Path,
    settings: RunnerSettings = RunnerSettings(),
    source: dict | None = None,
    progress: Callable[[], None] | None = None,
    assignment: list[list[int]] | None = None,
    say: Callable[[str], None] | None = None,
    run_config: dict | None = None,
    precision: tuple[float, float] = (0.0, 600.0),
) -> tuple[Path, pd.DataFrame]:
    """`run`, then write the run folder; returns it and the per-config summary table.

    With `say`, the plan and its estimated duration are said before decoding starts. Each policy
    is compared with the best fixed γ on the same prompts (harness/verdicts.py); `precision`
    (target, seconds) sharpens the headline pair's interval, pass after pass. run.json's `capture`
    says how each policy's passes ran (`run` captures them on CUDA unless --eager)."""
    check_writable(out)
    estimate = say_plan(pair, prompts, as_run(pair, configs, settings), settings, assignment, say) if say else None
    if say and precision[0] > 0:
        say(precision_plan(*precision))
    probe, started = LoadProbe(), time.perf_counter()
    probe.sample("start")
    output = run(pair, prompts, configs, settings, progress, assignment)
    wall = time.perf_counter() - started
    probe.sample("decoded")
    table = summarize(output.samples)
    samples, paired = judge(output.samples, with_schedules(table, configs),
                            functools.partial(another_pass, pair, prompts, configs, settings), *precision, say)
    if "precision" in paired:  # the headline pair's further passes join its measurements
        table = summarize(samples)
    by_category = summarize(samples, by=["category"])
    run_info = {
        "config": run_config,  # the whole RunConfig: `run --config run.json` runs it again
        "configs": [c.to_dict() for c in configs],
        "assignment": assignment,
        "settings": dataclasses.asdict(settings),
        "models": pair.describe(),
        "capture": capture.describe(as_run(pair, configs, settings), pair.device, settings.eager,
                                    (pair.target, pair.draft)),
        "prompts": {"count": len(prompts), "fingerprint": prompts_fingerprint(prompts), **(source or {})},
    }
    timing_health = health([*probe.checks(), baseline_drift(samples), identical_rounds(samples),
                            wall_over_estimate(wall, estimate)])
    summary = {"configs": table.to_dict(orient="records"), "by_category": by_category.to_dict(orient="records"),
               **depth_breakdowns(samples), "timing_health": timing_health, **paired}
    folder = write_run(out, "run", run_info, summary, {"samples": samples, "rounds": output.rounds})
    return folder, table


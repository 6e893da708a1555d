"""Sweep specifications: what to decode, which knobs to search, what to optimise, how long.

A specification (sweeps/*.yaml) names the task, models, decoding settings, the search space,
the objective and the budget; every field can be overridden by a flag or `--set key=value`.
Unknown keys and values of the wrong kind are refused in one line; points with
min_draft_len > gamma_max are never run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from dspark_bench import schedules
from dspark_bench.config import SEARCHABLE_FIELDS, DecodeConfig, expand, same_as
from dspark_bench.errors import DsparkError, first_line
from dspark_bench.harness.workload import LOAD, LOADED, Served, Workload, served
from dspark_bench.knobs import Needs, knob
from dspark_bench.objectives import LOAD_OBJECTIVES, OBJECTIVES
from dspark_bench.replay.arrivals import read_trace

STUDY = "Study"  # the --help group of a sweep's own settings
# What a sweep's own knobs need to have any effect (knobs.Needs; check_typed_needs refuses them without).
REPLAY = Needs("replay (--evaluation replay or auto)", lambda w, c: evaluation_for(w) == "replay")
REAL = Needs("--evaluation real (replay simulates every policy: no study runs)",
             lambda w, c: evaluation_for(w) == "real")
PARAMS = SEARCHABLE_FIELDS  # what a search space may name (config.py declares them)
# The base of a space given by flags alone, and the default of real (timed) sweeps: every point
# costs a decoding pass per prompt, so it stays small.
DEFAULT_SPACE = {
    "metric": ["top1"], "schedule": [schedules.THRESHOLD], "threshold": [0.3, 0.5, 0.7], "gamma_max": [4],
    "min_draft_len": [1],
}
# The default under replay, where a policy costs microseconds: every metric and threshold-based
# schedule over a fine threshold grid, gamma_max 1-8, min_draft_len 0-2 (3,496 valid points; the
# replay sweep adds every fixed gamma).
DENSE_SPACE = {
    "metric": ["top1", "entropy", "topk_mass", "margin"], "schedule": [schedules.THRESHOLD, schedules.CUMULATIVE],
    "threshold": {"low": 0.05, "high": 0.95, "step": 0.05}, "gamma_max": {"low": 1, "high": 8},
    "min_draft_len": {"low": 0, "high": 2},
}
# A controller's knobs searched where the space names its schedule and none of its knobs (docs/engine-controllers.md):
# SGLang's lengths, smoothing and pace around its shipped slot; TensorRT-LLM's schedule by batch size and its gate;
# vLLM's K by batch size under its adaptive verification (K itself: the space's gamma_max).
CONTROLLER_SPACES = {
    schedules.SGLANG_ADAPTIVE: {"candidate_steps": ["1,3,5,7", "1,2,3,4", "1,2,4,6", "0,1,3", "2,4,6,8"],
                                "ema_alpha": [0.1, 0.2, 0.5], "update_interval": [1, 5], "warmup_batches": [0, 10],
                                "down_hysteresis": [-0.25, 0.0]},
    schedules.TRTLLM_SCHEDULE: {"draft_len_schedule": ["", "1:4,8:2,32:1", "1:6,8:3,32:1", "1:3,16:2,64:1"],
                                "acceptance_rate_window_size": [0, 16, 64],
                                "acceptance_rate_threshold": [0.2, 0.4, 0.6]},
    schedules.VLLM_ADAPTIVE: {"num_speculative_tokens_per_batch_size": ["", "1-1:6,2-8:4,9-64:2",
                                                                        "1-8:4,9-32:2,33-64:1", "1-1:3,2-8:2,9-64:1"]},
}


@dataclass(frozen=True)
class SweepSpec(Workload, Served):
    """A study: a workload (what to decode and how it is timed: harness.workload), which knobs
    to search, what to optimise, and how long; and the load it replays its servers under, if any
    (harness.workload.Served)."""

    # A sweep decodes its prompts once per trial (or records them once for replay): the first 10
    # unless the spec or --limit says otherwise. The workload's `limit` all the same: its help
    # and bound are its declaration's (checked once, with every other field's, by check_workload).
    limit: int | None = same_as("limit", of=Workload, default=10)
    space: dict = field(default_factory=lambda: dict(DEFAULT_SPACE))  # param -> list or {low, high, step}
    objective: tuple[str, ...] = ("speedup",)
    method: str = knob("grid", "grid (Optuna's GridSampler) | optuna (TPE).", choices=("grid", "optuna"),
                       noun="method", panel=STUDY, needs=REAL)
    # replay: greedy or sampled, record once and simulate every policy, confirm the best with
    # timed runs; real: a timed run per policy; auto: replay.
    evaluation: str = knob("auto", "How policies are evaluated: replay (record once, simulate all, confirm the best) "
                           "| real (a timed run each) | auto.", choices=("auto", "replay", "real"), noun="evaluation",
                           panel=STUDY)
    trials: int = knob(20, "Optuna budget (grid: the whole grid).", at_least=1, panel=STUDY,
                       needs=Needs("--method optuna and --evaluation real (a grid runs the whole grid; replay "
                                   "simulates every policy)",
                                   lambda w, c: w.method == "optuna" and evaluation_for(w) == "real"))
    confirm_top: int = knob(5, "Replay: how many policies to confirm with timed runs, in all (the best, then the "
                                 "best of each kind not yet among them), the best fixed γ timed beside them as the "
                                 "reference; 0: replay's answer alone, nothing timed.", at_least=0, panel=STUDY,
                            needs=REPLAY)
    # Replay at a temperature > 0: K sampled paths per prompt (replay/sampled.py), the replicates of
    # the 95 % interval on every predicted metric. Each costs a plain decode and a draft rollout
    # pass to record; the half-width narrows as t(K - 1) / √K. The default is the measured
    # trade-off (docs/policy-and-metrics.md#which-temperatures-are-validated).
    paths: int = knob(8, "Replay at a temperature > 0: sampled paths per prompt, each a plain decode and a draft "
                      "rollout pass to record; the predicted metrics' 95 % interval narrows as t(K-1)/√K (8 "
                      "paths: about half of 4's).", at_least=2, panel=STUDY,
                      needs=Needs("replay at a temperature above 0 (greedy replay follows the one greedy path)",
                                  lambda w, c: not c.greedy and evaluation_for(w) == "replay"))
    sampler_seed: int = 0  # seeds Optuna's sampler (the decodes' own seed is `seed`)
    heartbeat_s: int = 30  # a trial silent this long (x2) was killed and is retried
    # Replay: the analyses of the record are a research question, not "which policy":
    # `dspark-bench analyze SWEEP` runs them later as well.
    analyze: bool = knob(False, "Replay: also study the record (the oracle's headroom, each signal's held-out "
                         "quality, how good a signal would have to be) into analysis.json; `dspark-bench analyze` "
                         "does it later.", flag="--analyze", panel=STUDY, needs=REPLAY)
    # Whose costs replay prices rounds with (replay/cost_file.py).
    prices: str = knob("ours", "Replay: whose costs price each round: ours (timed here) | llamacpp (llama.cpp's, "
                       "measured by the sweep or `run --decoder llamacpp`, cached) | a cost-model file "
                       "(docs/engines-and-export.md#cost-model-files).", panel=STUDY, needs=REPLAY)
    # Temperature as an axis: one sweep per temperature listed (each its own record and folder),
    # in place of `temperature`; `report` of their folders draws the best policy against it.
    temperatures: tuple[float, ...] = ()
    # tpot_p50 by default: below saturation throughput follows the offered load whatever the policy,
    # while a request's time per token is what the policy changes at every rate.
    load_objective: str = knob("tpot_p50", "Replay under load: the best policy per rate by tpot_p50 (lowest median "
                               "time per output token) | throughput (output tokens/s, within --tpot-limit at p99 if "
                               "given) | goodput (tokens/s of the requests within --tpot-limit).",
                               choices=tuple(LOAD_OBJECTIVES), noun="load objective", panel=LOAD,
                               needs=LOADED)
    tpot_limit: float | None = knob(None, "Replay under load: the time per output token a request may take, "
                                    "seconds (throughput: at p99; goodput: each request's).", above=0, panel=LOAD,
                                    needs=LOADED)
    # Replay: the target's greedy continuations from the engine that serves it, a continuations
    # file (replay/continuations.py) or several (one per task, say), instead of decoding the
    # target here; None: decoded here.
    continuations: str | list[str] | None = None

    def prices_replayed(self) -> bool:
        """A replay sweep prices every policy (Served.isolated_prices says on which passes)."""
        return evaluation_for(self) == "replay"


# Spec keys an earlier version wrote: the old name -> the new one. Only a stored spec (a sweep
# folder's run.json, read by --resume) is migrated; a spec file or --set with an old key is refused.
RENAMED = {"engine": "evaluation"}


def old_keys(data: dict) -> dict:
    """`data` with every old key under its new name. `seed` alone (no `sampler_seed` beside it)
    is a spec from before the two seeds had two names, where it seeded Optuna's sampler: it
    keeps that meaning (every spec written since holds both)."""
    data = {RENAMED.get(key, key): value for key, value in data.items()}
    if "seed" in data and "sampler_seed" not in data:
        data["sampler_seed"] = data.pop("seed")
    return data


def _parse_space(space: object) -> dict:
    if not isinstance(space, dict) or not space:
        raise DsparkError("the search space is empty; give at least one of " + ", ".join(PARAMS))
    unknown = sorted(set(space) - set(PARAMS))
    if unknown:
        raise DsparkError(f"unknown search-space key(s) {', '.join(unknown)}; known: {', '.join(PARAMS)}")
    parsed = {}
    for name, values in space.items():
        if isinstance(values, dict):
            if set(values) - {"low", "high", "step"} or not {"low", "high"} <= set(values):
                raise DsparkError(f"space.{name}: a range needs low, high and optionally step")
            if values["low"] > values["high"]:
                raise DsparkError(f"space.{name}: low {values['low']} is above high {values['high']}")
            step = values.get("step", 1 if name in ("gamma_max", "min_draft_len") else 0.1)
            if not step > 0:
                raise DsparkError(f"space.{name}: step must be positive (got {step})")
            values = [round(float(v), 6) for v in np.arange(values["low"], values["high"] + step / 2, step)]
            if name in ("gamma_max", "min_draft_len"):
                values = [int(v) for v in values]
        if not isinstance(values, list):
            values = [values]
        if not values:
            raise DsparkError(f"space.{name} is empty")
        parsed[name] = values
    return parsed


def _parse_temperatures(values: object, where: str) -> tuple[float, ...]:
    """A spec's `temperatures`: a list of distinct numbers >= 0 (one sweep each)."""
    values = list(values) if isinstance(values, (list, tuple)) else [values]  # a stored spec's: a tuple
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in values) or \
            len(set(values)) != len(values):
        raise DsparkError(f"{where}: temperatures must be a list of distinct numbers >= 0 (got {values!r})")
    return tuple(float(v) for v in values)


def _parse_rates(values: object, where: str) -> tuple[float, ...]:
    """A spec's `arrival_rates`: distinct numbers above 0, requests per second (one load each)."""
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v > 0 for v in values) \
            or len(set(values)) != len(values):
        raise DsparkError(f"{where}: an arrival rate must be a number above 0 requests per second, each given once "
                          f"(got {', '.join(map(str, values))})")
    return tuple(sorted(float(v) for v in values))


def max_batch_of(spec: SweepSpec) -> int:
    """The rows a server under load decodes at once: the spec's, else its largest batch size."""
    return spec.max_batch or max(point.batching.batch_size for point in points(spec))


def _check_load(spec: SweepSpec, where: str) -> None:
    """Refuse, before any work, a load the sweep cannot replay, and a load's setting without a load."""
    if not served(spec):
        return  # a load's own settings without a load: SweepSpec.check_needs
    if evaluation_for(spec) != "replay":
        raise DsparkError(f"{where}: replay under load (--arrival-rate, --arrival-trace) needs --evaluation replay")
    if not any(point.drafting.drafter == "model" for point in points(spec)):
        raise DsparkError(f"{where}: replay under load serves the draft model's policies (the batched decoder's "
                          "drafter); the search space has none")
    sizes = sorted({point.batching.batch_size for point in points(spec)})
    if max_batch_of(spec) > sizes[-1]:  # the surface is timed at the sweep's batch sizes, interpolated between
        raise DsparkError(f"{where}: --max-batch {spec.max_batch} is beyond the cost surface, timed at the sweep's "
                          f"batch sizes ({', '.join(map(str, sizes))}); add --batch-size {spec.max_batch}")
    if spec.load_objective == "goodput" and spec.tpot_limit is None:
        raise DsparkError(f"{where}: --load-objective goodput counts the requests within --tpot-limit: give one")
    if spec.arrival_trace is not None:
        read_trace(spec.arrival_trace)  # an unreadable trace is refused now, not after the sweep's recording


def per_temperature(spec: SweepSpec) -> list[SweepSpec]:
    """The sweeps a spec stands for: one per temperature it lists, else itself."""
    return [dataclasses.replace(spec, temperature=t, temperatures=()) for t in spec.temperatures] or [spec]


def parse_spec(data: dict, where: str = "sweep spec") -> SweepSpec:
    try:
        return _parse_spec(data, where)
    except (TypeError, ValueError, ZeroDivisionError) as err:  # a value of the wrong kind
        raise DsparkError(f"{where}: invalid value ({first_line(err)})") from None


def _check_types(spec: SweepSpec, where: str) -> None:
    """What the declarations (knobs.check_declared, in check_workload) cannot say: the forms a
    cost model and continuations may take."""
    if not isinstance(spec.prices, str) or not spec.prices:
        raise DsparkError(f"{where}: prices must be ours, llamacpp or a cost-model file's path (got {spec.prices!r})")
    given = [spec.continuations] if isinstance(spec.continuations, str) else spec.continuations
    if given is not None and (not isinstance(given, list) or not given
                              or not all(isinstance(p, str) and p for p in given)):
        raise DsparkError(f"{where}: continuations must be a continuations file's path, or a list of them "
                          f"(got {spec.continuations!r})")


def _parse_spec(data: dict, where: str) -> SweepSpec:
    known = {f.name for f in dataclasses.fields(SweepSpec)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise DsparkError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    data = dict(data)
    if "space" in data:
        data["space"] = _parse_space(data["space"])
    if "temperatures" in data:
        data["temperatures"] = _parse_temperatures(data["temperatures"], where)
    if "arrival_rates" in data:
        data["arrival_rates"] = _parse_rates(data["arrival_rates"], where)
    if isinstance(data.get("objective"), str):
        data["objective"] = tuple(x.strip() for x in data["objective"].split(","))
    elif "objective" in data:
        data["objective"] = tuple(data["objective"])
    spec = SweepSpec(**data)
    _check_types(spec, where)
    try:
        spec.check_workload()  # every declared field: its type, its choices, its bound
    except DsparkError as err:
        raise DsparkError(f"{where}: {err}") from None
    for name in spec.objective:
        if name not in OBJECTIVES:
            raise DsparkError(f"{where}: unknown objective {name!r}; choose from {', '.join(OBJECTIVES)}")
    if not 1 <= len(spec.objective) <= 2:
        raise DsparkError(f"{where}: give one objective, or two for a Pareto front")
    if spec.turns != "first" or spec.trace:
        raise DsparkError(f"{where}: a sweep decodes first turns and keeps no per-round trace; use "
                          "`run --turns all` / `run --trace` on the policy it finds")
    if (spec.task is None) == (spec.dataset is None):
        raise DsparkError(f"{where}: give exactly one of task or dataset")
    if spec.confirm_top == 0 and spec.precision > 0 and evaluation_for(spec) == "replay":
        raise DsparkError(f"{where}: --precision repeats the timed headline pair, and --confirm-top 0 times "
                          "nothing: drop one of them")
    if not points(spec):
        raise DsparkError(f"{where}: no valid point in the search space (min_draft_len exceeds every gamma_max?)")
    _check_load(spec, where)
    return spec


def base_config(spec: SweepSpec, task_tokens: int | None) -> DecodeConfig:
    """The policy every point of the space starts from: the workload's verification and lengths."""
    return DecodeConfig.of(max_new_tokens=spec.tokens(task_tokens), temperature=spec.temperature, top_p=spec.top_p,
                        topk=spec.topk, seed=spec.seed)


def points(spec: SweepSpec, base: DecodeConfig | None = None) -> list[DecodeConfig]:
    """Every valid configuration of the space (config.expand; invalid combinations are never run).
    A depth policy is not searched: a replay sweep composes one (sections/depth.py)."""
    composed = [name for name in spec.space.get("schedule", ()) if schedules.named(name).by_depth]
    if composed:
        raise DsparkError(f"the {composed[0]} schedule is not searched: a replay sweep composes a depth policy from "
                          "each depth bucket's best where its rounds span buckets (docs/depth.md); time one with "
                          "`dspark-bench run --schedule depth --depth-policy ...`")
    base = base or DecodeConfig.of(max_new_tokens=spec.tokens(None), topk=spec.topk)
    return list(dict.fromkeys(expand(spec.space, base, strict=False) + [
        c for space in controller_spaces(spec.space) for c in expand(space, base, strict=False)]))


def controller_spaces(space: dict) -> list[dict]:
    """The space of each controller the space names without any of its knobs (CONTROLLER_SPACES), at the
    space's batch sizes and gamma_max (a schedule's lengths fix their own)."""
    kept = {k: v for k, v in space.items() if k in ("batch_size", "gamma_max", "drafter", "max_new_tokens")}
    kept |= {"threshold": space["threshold"][:1]} if space.get("threshold") else {}  # read by none: the space's one
    return [{**kept, "schedule": [name], **CONTROLLER_SPACES[name]} for name in space.get("schedule", ())
            if schedules.named(name).controlled and not set(schedules.named(name).reads) & set(space)]


def evaluation_for(spec: SweepSpec) -> str:
    """How this sweep evaluates policies: "replay" (greedy, or sampled at the spec's temperature:
    replay/sampled.py) or "real"."""
    return "replay" if spec.evaluation == "auto" else spec.evaluation

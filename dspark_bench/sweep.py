"""Sweeps: search the policy's knobs over a task, by grid or Optuna, or exactly by replay.

A sweep specification (sweeps/*.yaml) names the task, models, decoding settings, the search
space, the objective and the budget; every field can be overridden. Grid and Optuna share one
objective function (grid is Optuna's GridSampler) and live in an Optuna storage — SQLite in
the run folder by default, PostgreSQL or a journal file for several workers — so a sweep
resumes where it stopped and several workers can share one study.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import socket
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import optuna
import pandas as pd
import yaml

from dspark_bench.config import DecodeConfig
from dspark_bench.errors import DsparkError
from dspark_bench.metrics import summarize

if TYPE_CHECKING:
    from dspark_bench.runner import StageProgress

# Heartbeats and trial retries are Optuna's own (marked experimental); their warnings are noise here.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

PARAMS = ("metric", "schedule", "threshold", "threshold_start", "threshold_end", "gamma_max", "min_draft_len")
# Objectives and their directions: what a user may optimise for.
OBJECTIVES = {
    "speedup": "maximize", "tokens_per_round": "maximize", "acceptance_rate": "maximize",
    "block_acceptance_rate": "maximize", "accepted_per_round": "maximize", "avg_draft_len": "maximize",
    "draft_forwards_per_token": "minimize",
}
# The base of a space given by flags alone, and the default of real (timed) sweeps: every point
# costs a decoding pass per prompt, so it stays small.
DEFAULT_SPACE = {
    "metric": ["top1"], "schedule": ["threshold"], "threshold": [0.3, 0.5, 0.7], "gamma_max": [4],
    "min_draft_len": [1],
}
# The default under replay, where a policy costs microseconds: every metric and threshold-based
# schedule over a fine threshold grid, gamma_max 1-8, min_draft_len 0-2 (3,496 valid points; the
# replay sweep adds every fixed gamma).
DENSE_SPACE = {
    "metric": ["top1", "entropy", "topk_mass", "margin"], "schedule": ["threshold", "cumulative"],
    "threshold": {"low": 0.05, "high": 0.95, "step": 0.05}, "gamma_max": {"low": 1, "high": 8},
    "min_draft_len": {"low": 0, "high": 2},
}
# Where `sweep --task T` looks for the task's own spec, sweeps/T.yaml: the working folder,
# then the project's checkout (an installed package has none).
SPEC_FOLDERS = (Path("sweeps"), Path(__file__).resolve().parents[1] / "sweeps")


@dataclass(frozen=True)
class SweepSpec:
    """A study: what to decode, which knobs to search, what to optimise, and how long."""

    task: str | None = None  # built-in task, or use `dataset`
    dataset: str | None = None  # user prompts (file or hub id)
    split: str = "train"
    prompt_field: str | None = None
    category_field: str | None = None
    limit: int | None = 10  # prompts per trial
    target: str | None = None  # None: the reference pair
    draft: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_new_tokens: int | None = None  # None: the task's default
    temperature: float = 0.0
    top_p: float = 1.0
    topk: int = 5
    ignore_eos: bool = False  # timing only: every sequence is exactly max_new_tokens long
    space: dict = field(default_factory=lambda: dict(DEFAULT_SPACE))  # param -> list or {low, high, step}
    objective: tuple[str, ...] = ("speedup",)
    method: str = "grid"  # grid | optuna (TPE)
    engine: str = "auto"  # replay (greedy only) | real | auto = replay when greedy
    trials: int = 20  # Optuna budget (grid: the grid's size)
    repeats: int = 1  # timed pairs per prompt and trial
    confirm_top: int = 5  # replay: real timed runs of the best configurations
    seed: int = 0
    heartbeat_s: int = 30  # a trial silent this long (x2) was killed and is retried

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


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


def parse_spec(data: dict, where: str = "sweep spec") -> SweepSpec:
    try:
        return _parse_spec(data, where)
    except (TypeError, ValueError, ZeroDivisionError) as err:  # a value of the wrong kind
        raise DsparkError(f"{where}: invalid value ({str(err).splitlines()[0]})") from None


def _check_types(spec: SweepSpec, where: str) -> None:
    for name in ("trials", "repeats", "confirm_top", "seed", "heartbeat_s", "topk"):
        if not isinstance(getattr(spec, name), int) or isinstance(getattr(spec, name), bool):
            raise DsparkError(f"{where}: {name} must be an integer (got {getattr(spec, name)!r})")
    for name in ("limit", "max_new_tokens"):
        value = getattr(spec, name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise DsparkError(f"{where}: {name} must be a positive integer (got {value!r})")
    if not isinstance(spec.ignore_eos, bool):
        raise DsparkError(f"{where}: ignore_eos must be true or false (got {spec.ignore_eos!r})")


def _parse_spec(data: dict, where: str) -> SweepSpec:
    known = {f.name for f in dataclasses.fields(SweepSpec)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise DsparkError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    data = dict(data)
    if "space" in data:
        data["space"] = _parse_space(data["space"])
    if isinstance(data.get("objective"), str):
        data["objective"] = tuple(x.strip() for x in data["objective"].split(","))
    elif "objective" in data:
        data["objective"] = tuple(data["objective"])
    spec = SweepSpec(**data)
    _check_types(spec, where)
    for name in spec.objective:
        if name not in OBJECTIVES:
            raise DsparkError(f"{where}: unknown objective {name!r}; choose from {', '.join(OBJECTIVES)}")
    if not 1 <= len(spec.objective) <= 2:
        raise DsparkError(f"{where}: give one objective, or two for a Pareto front")
    if spec.method not in ("grid", "optuna"):
        raise DsparkError(f"{where}: method must be grid or optuna (got {spec.method!r})")
    if spec.engine not in ("auto", "replay", "real"):
        raise DsparkError(f"{where}: engine must be auto, replay or real (got {spec.engine!r})")
    if spec.trials < 1 or spec.repeats < 1 or spec.confirm_top < 0:
        raise DsparkError(f"{where}: trials and repeats must be at least 1, confirm_top at least 0")
    if (spec.task is None) == (spec.dataset is None):
        raise DsparkError(f"{where}: give exactly one of task or dataset")
    if not points(spec):
        raise DsparkError(f"{where}: no valid point in the search space (min_draft_len exceeds every gamma_max?)")
    return spec


def flag_overrides(fields: dict, space: dict) -> dict:
    """Spec overrides from command-line flags: each field given (not None), and each search-space
    list given (not empty) as `space.<name>`."""
    overrides = {key: value for key, value in fields.items() if value is not None}
    overrides.update({f"space.{name}": list(values) for name, values in space.items() if values})
    return overrides


def task_spec(task: str | None) -> Path | None:
    """The task's own spec (sweeps/<task>.yaml), if there is one."""
    if not task:
        return None
    return next((folder / f"{task}.yaml" for folder in SPEC_FOLDERS if (folder / f"{task}.yaml").is_file()), None)


def resolve_spec(path: Path | None, overrides: dict) -> tuple[SweepSpec, str]:
    """The spec a `sweep` command means, and one line saying where its search space came from.

    Without --spec: the task's own sweeps/<task>.yaml where it exists; else, when no search-space
    flag is given, the dense default under replay (thousands of policies for about the price of
    one decoding pass) or a small grid under real timed runs (sampling), said as such.
    """
    chosen_by_flags = any(key.startswith("space.") for key in overrides)
    if path is None and not chosen_by_flags:
        path = task_spec(overrides.get("task"))
        if path is not None:
            spec = load_spec(path, overrides)
            return spec, f"search space: {path}, the task's own spec ({len(points(spec)):,} points)"
    if path is not None or chosen_by_flags:
        spec = load_spec(path, overrides)
        n = len(points(spec))
        return spec, f"search space: {path or 'the command-line flags'} ({n:,} point{'s' * (n != 1)})"
    spec = load_spec(None, {**overrides, "space": DENSE_SPACE})
    if engine_for(spec) == "replay":
        return spec, f"search space: the dense default ({len(points(spec)):,} points plus every fixed gamma)"
    spec = load_spec(None, overrides)
    return spec, (f"search space: a small default grid ({len(points(spec))} points) — sampling verification "
                  "needs a real timed run per policy, so replay's dense default is not used; give --spec or "
                  "--threshold/--gamma-max/... for more")


def load_spec(path: Path | None, overrides: dict) -> SweepSpec:
    """A spec file (or the defaults) with command-line overrides applied on top."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise DsparkError(f"sweep spec {str(path)!r} does not exist")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise DsparkError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise DsparkError(f"{path}: a sweep spec must be a mapping")
    for key, value in overrides.items():
        if key.startswith("space."):
            data.setdefault("space", dict(DEFAULT_SPACE))[key.removeprefix("space.")] = value
        else:
            data[key] = value
    return parse_spec(data, str(path) if path else "sweep")


def base_config(spec: SweepSpec, task_tokens: int | None) -> DecodeConfig:
    tokens = spec.max_new_tokens if spec.max_new_tokens is not None else (task_tokens or 128)
    return DecodeConfig(max_new_tokens=tokens, temperature=spec.temperature,
                        top_p=spec.top_p, topk=spec.topk)


def points(spec: SweepSpec, base: DecodeConfig | None = None) -> list[DecodeConfig]:
    """Every valid configuration of the grid (invalid combinations are never run)."""
    base = base or DecodeConfig(max_new_tokens=spec.max_new_tokens or 128, topk=spec.topk)
    space = spec.space
    names = list(space)
    out = []
    for combo in itertools.product(*(space[n] for n in names)):
        params = dict(zip(names, combo))
        if params.get("min_draft_len", base.min_draft_len) > params.get("gamma_max", base.gamma_max):
            continue  # the constraint min_draft_len <= gamma_max: such points are never run
        try:
            out.append(base.replace(**params))
        except DsparkError as err:
            raise DsparkError(f"search space: {err}") from None
    return out


# --- storage --------------------------------------------------------------------------------


# Optuna 4.9 renamed the retry of trials whose worker died; support both sides of the rename.
if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback"):
    RETRY, RETRY_KWARG = optuna.storages.RetryHeartbeatStaleTrialCallback, "heartbeat_stale_trial_callback"
else:
    RETRY, RETRY_KWARG = optuna.storages.RetryFailedTrialCallback, "failed_trial_callback"


def retry_callback():
    """Queue a dead or interrupted trial again, at most twice."""
    return RETRY(max_retry=2)


def retried_numbers(trials: list[optuna.trial.FrozenTrial]) -> set[int]:
    """Trials that another trial retries (their outcome is the retry's)."""
    return {n for t in trials for n in t.system_attrs.get("retry_history", [])}


def open_storage(url: str, heartbeat_s: int):
    """Optuna's own storages: an RDB URL (sqlite:///, postgresql://) with heartbeats so a killed
    worker's trial is retried, or a journal file (journal:///path) for shared filesystems."""
    if url.startswith("journal://"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url.removeprefix("journal://")))
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    retry = {RETRY_KWARG: retry_callback()}
    for attempt in range(5):
        try:
            return optuna.storages.RDBStorage(
                url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_s, grace_period=2 * heartbeat_s, **retry
            )
        except Exception as err:  # sqlalchemy raises its own types for a bad URL or an unreachable server
            # Workers starting together on an empty database race to create its tables (the
            # loser fails once, then finds them); a busy server may refuse a connection briefly.
            if attempt == 4 or type(err).__name__ in ("ArgumentError", "NoSuchModuleError"):
                raise DsparkError(f"cannot open the study storage {masked(url)!r}: {str(err).splitlines()[0][:200]}") from None
            time.sleep(1 + attempt)


def make_sampler(spec: SweepSpec):
    if spec.method == "grid":
        return optuna.samplers.GridSampler(spec.space, seed=spec.seed)
    return optuna.samplers.TPESampler(seed=spec.seed, multivariate=True)


def suggest(trial: optuna.Trial, spec: SweepSpec) -> dict:
    """One point of the space; grid and TPE both go through the same suggestions."""
    params = {}
    for name, values in spec.space.items():
        params[name] = trial.suggest_categorical(name, values) if len(values) > 1 or spec.method == "grid" \
            else values[0]
    return params


# --- the objective ------------------------------------------------------------------------------


@dataclass
class TrialContext:
    """What every trial needs: models, prompts, the base config, where to put samples."""

    spec: SweepSpec
    pair: object
    prompts: list
    base: DecodeConfig
    folder: Path
    settings: object


def objective_values(row: dict, spec: SweepSpec) -> list[float]:
    return [float(row[name]) for name in spec.objective]


def make_objective(ctx: TrialContext) -> Callable[[optuna.Trial], object]:
    """The one objective of grid and Optuna: decode the prompts with this trial's policy."""
    from dspark_bench.runner import run

    def objective(trial: optuna.Trial):
        name_worker(trial)  # first: a resume tells a dead worker's trial by it (recover_dead_trials)
        params = suggest(trial, ctx.spec)
        if is_duplicate(trial):
            trial.set_user_attr("skipped", "grid point taken")
            trial.study.stop()
            raise optuna.TrialPruned("grid point already taken by another trial")
        try:
            config = ctx.base.replace(**params)
        except DsparkError as err:
            trial.set_user_attr("invalid", str(err))
            raise optuna.TrialPruned(str(err)) from None  # never run; counts as visited
        trial.set_user_attr("config_label", config.label())
        try:
            output = run(ctx.pair, ctx.prompts, [config], ctx.settings)
        except Exception as err:  # recorded with the trial; the sweep goes on (optimize catches)
            trial.set_user_attr("error", f"{type(err).__name__}: {err}"[:500])
            raise
        samples = output.samples.assign(trial=trial.number)
        samples_dir = ctx.folder / "trials"
        samples_dir.mkdir(exist_ok=True)
        atomic_parquet(samples, samples_dir / f"{trial.number:05d}.parquet")
        row = summarize(samples).iloc[0].to_dict()
        for name, value in row.items():
            if isinstance(value, (int, float, np.integer, np.floating)) and name not in PARAMS:
                trial.set_user_attr(name, float(value))
        values = objective_values(row, ctx.spec)
        return values[0] if len(values) == 1 else values

    return objective


def atomic_parquet(table: pd.DataFrame, path: Path) -> None:
    partial = path.with_name(f".{path.name}.partial")
    table.to_parquet(partial, index=False)
    os.replace(partial, path)


def atomic_json(data: dict, path: Path) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(partial, path)


def trials_table(trials: list[optuna.trial.FrozenTrial]) -> pd.DataFrame:
    """One row per trial: its parameters, state, every metric, and error if it failed."""
    rows = []
    for t in trials:
        row = {"trial": t.number, "state": t.state.name, **t.params, **t.user_attrs,
               "duration_s": t.duration.total_seconds() if t.duration else None}
        row["error"] = t.user_attrs.get("error") or t.system_attrs.get("fail_reason")
        if t.values is not None:
            row.update({f"objective_{i}": v for i, v in enumerate(t.values)})
        rows.append(row)
    return pd.DataFrame(rows)


def best_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    complete = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))]
    if not complete:
        return []
    return study.best_trials if len(study.directions) > 1 else [study.best_trial]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def name_worker(trial: optuna.Trial) -> None:
    """Say which process runs this trial. A retried trial inherits its predecessor's user
    attributes, so the name counts only together with the trial number it was written for."""
    trial.set_user_attr("worker", worker_name())
    trial.set_user_attr("worker_trial", trial.number)


def _worker_of(trial: optuna.trial.FrozenTrial) -> str | None:
    return trial.user_attrs.get("worker") if trial.user_attrs.get("worker_trial") == trial.number else None


def _died_here(worker: str) -> bool:
    host, _, pid = worker.partition(":")
    return host == socket.gethostname() and pid.isdigit() and not _pid_alive(int(pid))


# A live worker names itself on its trial within milliseconds of starting it; a trial still
# unnamed this long after we first saw it lost its worker in between.
UNNAMED_GRACE_S = 5.0


def recover_dead_trials(study: optuna.Study) -> int:
    """Fail and retry RUNNING trials whose worker process is gone (a SIGKILL): on this host by
    its process id, on any host when it died before it could name itself on the trial.

    Heartbeats catch this too, but only after their grace period; a resume knows at once (or
    after UNNAMED_GRACE_S, timed on this machine's clock: another machine's may differ).
    Returns how many trials were recovered.
    """
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    dead = [t for t in running if _worker_of(t) and _died_here(_worker_of(t))]
    unnamed = [t for t in running if _worker_of(t) is None]
    if unnamed:
        time.sleep(UNNAMED_GRACE_S)
        again = [study._storage.get_trial(t._trial_id) for t in unnamed]
        dead += [t for t in again if t.state == optuna.trial.TrialState.RUNNING and _worker_of(t) is None]
    recovered, retry = 0, retry_callback()
    for trial in dead:
        try:
            study._storage.set_trial_system_attr(trial._trial_id, "fail_reason", "worker process died")
            study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another resume recovered it first
        retry(study, study._storage.get_trial(trial._trial_id))
        recovered += 1
    return recovered


def requeue_interrupted(study: optuna.Study) -> None:
    """Queue again the trials Ctrl-C failed (they have no error of their own), once each."""
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    for trial in trials:
        if trial.state == optuna.trial.TrialState.FAIL and "error" not in trial.user_attrs \
                and trial.number not in retried and "worker" in trial.user_attrs:
            retry_callback()(study, trial)


def grid_size(spec: SweepSpec) -> int:
    return int(np.prod([len(v) for v in spec.space.values()]))


def remaining(study: optuna.Study, spec: SweepSpec) -> int:
    """Trials still to run: unvisited grid points, or the rest of the Optuna budget."""
    trials = study.get_trials(deepcopy=False)
    waiting = sum(t.state == optuna.trial.TrialState.WAITING for t in trials)
    if spec.method == "optuna":
        return max(spec.trials - sum(t.state.is_finished() for t in trials), waiting)
    # A grid point is done once a trial of it finished, unless that trial died and was retried.
    retried = retried_numbers(trials)
    taken = {t.system_attrs.get("grid_id") for t in trials
             if (t.state.is_finished() and t.number not in retried) or t.state == optuna.trial.TrialState.RUNNING}
    return max(grid_size(spec) - len(taken), waiting)


def is_duplicate(trial: optuna.Trial) -> bool:
    """Whether another live or finished trial already covers this trial's grid point.

    GridSampler re-evaluates a random point when a worker asks for one after the grid is all
    taken (a late worker in a distributed study); such a trial is pruned, never run.
    """
    storage = trial.study._storage
    attrs = storage.get_trial(trial._trial_id).system_attrs
    grid_id = attrs.get("grid_id")
    if grid_id is None:
        return False
    retried = set(attrs.get("retry_history", []))
    for other in storage.get_all_trials(trial.study._study_id, deepcopy=False):
        if other.number == trial.number or other.number in retried or other.system_attrs.get("grid_id") != grid_id:
            continue
        if other.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING):
            return True
    return False


def run_study(ctx: TrialContext, storage_url: str, study_name: str,
              progress: StageProgress | None = None) -> optuna.Study:
    """Create or load the study and work on it until its budget is met (or Ctrl-C)."""
    storage = open_storage(storage_url, ctx.spec.heartbeat_s)
    directions = [OBJECTIVES[name] for name in ctx.spec.objective]
    study = optuna.create_study(study_name=study_name, storage=storage, sampler=make_sampler(ctx.spec),
                                directions=directions, load_if_exists=True)
    recover_dead_trials(study)
    budget = grid_size(ctx.spec) if ctx.spec.method == "grid" else ctx.spec.trials

    def after_trial(study_: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        trials = study_.get_trials(deepcopy=False)
        atomic_parquet(trials_table(trials), ctx.folder / "trials.parquet")
        if progress:
            done = sum(t.state.is_finished() for t in trials)
            best = f" · best {study_.best_value:.3f}" if len(study_.directions) == 1 and \
                any(t.state == optuna.trial.TrialState.COMPLETE for t in trials) else ""
            progress(f"trials{best}", min(done, budget), budget)

    callbacks = [after_trial]
    if ctx.spec.method == "optuna":  # the grid sampler stops the study itself when the grid is done
        done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
        callbacks.insert(0, optuna.study.MaxTrialsCallback(budget, states=done))
    if remaining(study, ctx.spec) > 0:
        study.optimize(make_objective(ctx), callbacks=callbacks, catch=(Exception,))
    return study  # trials.parquet: after each trial, and finally by finish_real


# --- the whole sweep: prepare, run (real or replay), summarise ----------------------------------


@dataclass
class Prepared:
    pair: object
    prompts: list
    base: DecodeConfig
    source: dict


def prepare(spec: SweepSpec) -> Prepared:
    from dspark_bench.models import load_pair
    from dspark_bench.tasks import get_task, load_dataset_prompts, load_task

    if spec.task:
        task = get_task(spec.task)
        prompts = load_task(spec.task, spec.limit)
        source, task_tokens = {"task": task.name, "task_version": task.version, "domain": task.domain}, task.max_new_tokens
    else:
        prompts = load_dataset_prompts(spec.dataset, spec.split, spec.prompt_field, spec.category_field, spec.limit)
        source, task_tokens = {"dataset": spec.dataset, "split": spec.split}, None
    base = base_config(spec, task_tokens)
    points(spec, base)  # a threshold outside its range fails here, before models load
    return Prepared(load_pair(spec.target, spec.draft, spec.device, spec.dtype), prompts, base, source)


def engine_for(spec: SweepSpec) -> str:
    if spec.engine == "replay" and spec.temperature > 0:
        raise DsparkError("replay needs greedy verification (temperature 0); use --engine real for sampling")
    if spec.engine == "auto":
        return "replay" if spec.temperature == 0 else "real"
    return spec.engine


def run_info(spec: SweepSpec, prepared: Prepared, extra: dict) -> dict:
    from dspark_bench.prompts import prompts_fingerprint

    return {"spec": spec.to_dict(), "base_config": prepared.base.to_dict(), "models": prepared.pair.describe(),
            "prompts": {"count": len(prepared.prompts), "fingerprint": prompts_fingerprint(prepared.prompts),
                        **prepared.source}, **extra}


def start_folder(out: Path, kind: str) -> Path:
    """A sweep's run folder exists while it runs (the study and per-trial files live in it);
    every file in it is written atomically, and a finished sweep only gains, never loses."""
    from dspark_bench.results import check_writable, new_run_id

    folder = check_writable(out) / new_run_id(kind)
    folder.mkdir()
    return folder


def write_run_info(folder: Path, kind: str, info: dict) -> None:
    from dspark_bench.results import SCHEMA_VERSION, environment

    atomic_json({"schema_version": SCHEMA_VERSION, "run_id": folder.name, "kind": kind,
                 "environment": environment(), **info}, folder / "run.json")


def collect_samples(folder: Path) -> pd.DataFrame:
    parts = [pd.read_parquet(p) for p in sorted((folder / "trials").glob("*.parquet"))]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def finish_real(folder: Path, study: optuna.Study, spec: SweepSpec) -> pd.DataFrame:
    """trials.parquet, samples.parquet and summary.json of a real (grid or Optuna) sweep.
    Written after local workers are done, so their last trials are in, finished."""
    trials = trials_table(study.get_trials(deepcopy=False))
    atomic_parquet(trials, folder / "trials.parquet")
    samples = collect_samples(folder)
    if not samples.empty:
        atomic_parquet(samples, folder / "samples.parquet")
    best = [t.number for t in best_trials(study)]
    complete = trials[trials["state"] == "COMPLETE"] if "state" in trials else trials
    ranked = complete.sort_values("objective_0", ascending=OBJECTIVES[spec.objective[0]] == "minimize") \
        if "objective_0" in complete else complete
    states = trials["state"].value_counts().to_dict() if "state" in trials else {}
    summary = {"engine": "real", "method": spec.method, "objective": list(spec.objective), "best_trials": best,
               "trial_states": states, "best": ranked.head(10).to_dict(orient="records")}
    atomic_json(summary, folder / "summary.json")
    return ranked


def replay_sweep(folder: Path, spec: SweepSpec, prepared: Prepared, records_root: Path,
                 progress: StageProgress | None = None, say: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Record once, simulate the whole space, confirm the best few with real timed runs."""
    from dspark_bench.prompts import encode, prompts_fingerprint
    from dspark_bench.replay import Record, measure_cost, record, simulate_grid
    from dspark_bench.runner import RunnerSettings, run, stage_steps

    pair, prompts, base = prepared.pair, prepared.prompts, prepared.base
    settings = RunnerSettings(repeats=spec.repeats, ignore_eos=spec.ignore_eos)
    configs = points(spec, base)
    gammas = sorted({c.gamma_max for c in configs})
    classic = [base.replace(schedule="fixed", gamma_max=g, min_draft_len=0) for g in gammas]
    configs += [c for c in classic if c not in configs]
    models, fingerprint = pair.describe(), prompts_fingerprint(prompts)
    key = f"{models['target_fingerprint']}-{models['draft_fingerprint']}-{fingerprint}-n{base.max_new_tokens}" \
          f"-g{max(gammas)}-k{base.topk}-{models['dtype']}" + ("-noeos" if spec.ignore_eos else "")
    record_dir = records_root / key
    ids = [encode(pair.tokenizer, p.text) for p in prompts]
    if say:
        from dspark_bench.plan import replay_plan, seconds_per_token

        say(replay_plan(seconds_per_token(pair, ids[0]), len(prompts), base.max_new_tokens, len(configs),
                        min(spec.confirm_top, len(configs) - len(gammas)) + 1, spec.repeats,
                        recorded=(record_dir / "record.json").is_file()))
    if (record_dir / "record.json").is_file():
        rec = Record.load(record_dir)
        rec.check_matches(models, fingerprint)
    else:
        info = {"models": models, "prompts_fingerprint": fingerprint, "prompt_ids": [p.id for p in prompts],
                "categories": [p.category for p in prompts]}
        rec = record(pair, ids, base.max_new_tokens, max(gammas), base.topk, info, eos_ids=settings.eos_ids(pair),
                     progress=stage_steps(progress, "recording", len(ids)))
        partial = record_dir.with_name(f".{record_dir.name}.{os.getpid()}.partial")
        rec.save(partial)
        try:
            os.replace(partial, record_dir)
        except OSError:  # another sweep stored the same record meanwhile: keep theirs
            import shutil

            shutil.rmtree(partial, ignore_errors=True)
    # The cost model is timed with the cache at a realistic length: a prompt plus half its output.
    context = ids[0] + rec.continuation[0, : int(rec.lengths[0]) // 2].tolist()
    if progress:
        progress("timing the cost model", 0, 1)
    cost = measure_cost(pair, context, max(gammas))
    atomic_json(cost.to_dict(), folder / "cost_model.json")
    if progress:
        progress(f"simulating {len(configs):,} policies", 0, 1)
    table = simulate_grid(rec, configs, cost)
    table["source"] = "replay"
    rank_by = "predicted_speedup" if spec.objective[0] == "speedup" else spec.objective[0]
    ascending = OBJECTIVES[spec.objective[0]] == "minimize"
    ranked = table.sort_values(rank_by, ascending=ascending)
    confirm = ranked[ranked["schedule"] != "fixed"].head(spec.confirm_top)
    best_fixed = ranked[ranked["schedule"] == "fixed"].head(1)
    chosen = pd.concat([confirm, best_fixed])
    confirm_configs = [configs[i] for i in chosen["config_id"]]
    output = run(pair, prompts, confirm_configs, settings,
                 progress=stage_steps(progress, f"confirming the best {len(confirm_configs)}",
                                      len(prompts) * len(confirm_configs)))
    measured = summarize(output.samples)
    measured["config_id"] = chosen["config_id"].to_numpy()[measured["config_id"].to_numpy()]
    keep = ["config_id", "speedup", "speedup_low", "speedup_high", "baseline_tokens_per_s", "spec_tokens_per_s",
            "baseline_mean_new_tokens", "spec_mean_new_tokens", "identical_to_baseline"]
    table = table.merge(measured[keep], on="config_id", how="left")
    table.loc[table["speedup"].notna(), "source"] = "confirmed"
    samples = output.samples.assign(config_id=chosen["config_id"].to_numpy()[output.samples["config_id"].to_numpy()])
    atomic_parquet(table, folder / "trials.parquet")
    atomic_parquet(samples, folder / "samples.parquet")
    confirmed = table[table["source"] == "confirmed"].sort_values("speedup", ascending=False)
    ratio = (confirmed["speedup"] / confirmed["predicted_speedup"])
    summary = {
        "engine": "replay", "objective": list(spec.objective), "policies_simulated": len(table),
        "record": str(record_dir), "cost_model": cost.to_dict(),
        "cost_model_accuracy": {"measured_over_predicted_median": float(ratio.median()),
                                "mean_abs_error": float((confirmed["speedup"] - confirmed["predicted_speedup"]).abs().mean())},
        "best": confirmed[confirmed["schedule"] != "fixed"].head(1).to_dict(orient="records"),
        "classic": confirmed[confirmed["schedule"] == "fixed"].to_dict(orient="records"),
        "confirmed": confirmed.to_dict(orient="records"),
    }
    atomic_json(summary, folder / "summary.json")
    return confirmed


def result_title(folder: Path) -> str:
    """What a finished sweep searched and how: the heading of its printed table."""
    from dspark_bench.results import read_json

    summary = read_json(Path(folder) / "summary.json", "summary file")
    spec = read_json(Path(folder) / "run.json", "run file").get("spec", {})
    eos = " · EOS ignored" if spec.get("ignore_eos") else ""
    if summary.get("engine") == "replay":
        confirmed = len(summary.get("confirmed", []))
        return (f"{summary['policies_simulated']:,} policies searched by replay (simulated from one record, fixed "
                f"gamma included); the best {confirmed} confirmed by timed runs{eos}")
    states = summary.get("trial_states", {})
    return f"{states.get('COMPLETE', 0)} policies searched by real timed runs ({summary.get('method')}){eos}"


def masked(url: str) -> str:
    """A storage URL without its password, for printing."""
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


def default_storage(folder: Path) -> str:
    return f"sqlite:///{(folder / 'study.db').resolve()}"


def start_workers(folder: Path, count: int, storage: str) -> list:
    """Extra local worker processes on the same study (Optuna's own distributed mode)."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "dspark_bench.cli", "sweep", "--resume", str(folder), "--worker-only",
               "--storage", storage]
    logs = [open(folder / f"worker-{i + 1}.log", "w") for i in range(count)]  # noqa: SIM115 (closed on exit)
    return [subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT) for log in logs]


def run_sweep(spec: SweepSpec, out: Path, storage: str | None = None, study_name: str | None = None,
              workers: int = 1, progress: StageProgress | None = None,
              say: Callable[[str], None] | None = None) -> tuple[Path, pd.DataFrame]:
    """A new sweep: real (grid / Optuna, in a study) or replay; returns its folder and best table.

    With `say`, the plan and its estimated duration are said before any decoding."""
    if workers < 1:
        raise DsparkError(f"--workers must be at least 1 (got {workers})")
    engine = engine_for(spec)
    prepared = prepare(spec)
    folder = start_folder(out, "sweep")
    if engine == "replay":
        write_run_info(folder, "sweep", run_info(spec, prepared, {"engine": "replay"}))
        return folder, replay_sweep(folder, spec, prepared, Path(out) / "records", progress, say)
    storage = storage or default_storage(folder)
    study_name = study_name or folder.name
    # The password of a database URL is not written into results; --resume asks for it.
    write_run_info(folder, "sweep", run_info(spec, prepared, {"engine": "real", "storage": masked(storage),
                                                               "study": study_name}))
    if say:
        from dspark_bench.plan import real_sweep_plan, seconds_per_token
        from dspark_bench.prompts import encode

        trials = grid_size(spec) if spec.method == "grid" else spec.trials
        per_token = seconds_per_token(prepared.pair, encode(prepared.pair.tokenizer, prepared.prompts[0].text))
        say(real_sweep_plan(per_token, len(prepared.prompts), prepared.base.max_new_tokens,
                            -(-trials // workers), spec.repeats) + (f" with {workers} workers" if workers > 1 else ""))
    return folder, continue_sweep(folder, prepared, workers, progress, storage=storage)


def check_unchanged(folder: Path, info: dict, prepared: Prepared) -> None:
    from dspark_bench.prompts import prompts_fingerprint

    if prompts_fingerprint(prepared.prompts) != info["prompts"]["fingerprint"]:
        raise DsparkError(f"the prompts of {folder} changed since the sweep started; start a new sweep")
    models = prepared.pair.describe()
    for key in ("target_fingerprint", "draft_fingerprint"):
        if models[key] != info["models"][key]:
            raise DsparkError(f"the {key.split('_')[0]} model of {folder} changed since the sweep started; start a new sweep")


def continue_sweep(folder: Path, prepared: Prepared | None = None, workers: int = 1,
                   progress: StageProgress | None = None,
                   worker_only: bool = False, storage: str | None = None) -> pd.DataFrame | None:
    """Work on a real sweep's study until its budget is met; then write its summary."""
    from dspark_bench.results import read_json
    from dspark_bench.runner import RunnerSettings

    info = read_json(Path(folder) / "run.json", "run file")
    if info.get("engine") != "real":
        raise DsparkError(f"{folder} is not a resumable sweep (only real grid/Optuna sweeps keep a study)")
    if storage is None and "***" in info["storage"]:
        raise DsparkError(f"{folder}'s study is in {info['storage']}; pass --storage with the password to resume")
    info["storage"] = storage or info["storage"]
    spec = parse_spec(info["spec"], str(folder))
    if prepared is None:  # a resume: the prompts and models must be those the sweep started with
        prepared = prepare(spec)
        check_unchanged(Path(folder), info, prepared)
    ctx = TrialContext(spec, prepared.pair, prepared.prompts, prepared.base, Path(folder),
                       RunnerSettings(repeats=spec.repeats, ignore_eos=spec.ignore_eos))
    helpers = start_workers(Path(folder), workers - 1, info["storage"]) if workers > 1 else []
    try:
        study = run_study(ctx, info["storage"], info["study"], progress)
    except KeyboardInterrupt:
        # Ctrl-C: Optuna marked the trial in flight failed; queue it again for --resume, and
        # keep everything finished.
        study = optuna.load_study(study_name=info["study"], storage=open_storage(info["storage"], spec.heartbeat_s))
        requeue_interrupted(study)
        if not worker_only:
            finish_real(Path(folder), study, spec)
        raise
    finally:
        failed = [i + 1 for i, helper in enumerate(helpers) if helper.wait() != 0]
    if failed:
        raise DsparkError(f"local worker(s) {failed} failed; see worker-N.log in {folder}")
    if worker_only:
        return None
    return finish_real(Path(folder), study, spec)

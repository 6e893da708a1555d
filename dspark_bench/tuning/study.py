"""The Optuna side of real sweeps: storage, sampler, the one objective, workers and recovery.

Grid and Optuna share one objective function (grid is Optuna's GridSampler) and live in an
Optuna storage — SQLite in the run folder by default, PostgreSQL or a journal file for several
workers — so a sweep resumes where it stopped and several workers can share one study.
"""

from __future__ import annotations

import os
import re
import socket
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import optuna
import pandas as pd

from dspark_bench.config import DecodeConfig
from dspark_bench.errors import DsparkError, first_line
from dspark_bench.harness import runner  # runner.run, looked up per trial (a test replaces it)
from dspark_bench.metrics import summarize
from dspark_bench.objectives import OBJECTIVES
from dspark_bench.results import write_parquet
from dspark_bench.tuning.spec import PARAMS, SweepSpec

if TYPE_CHECKING:
    from dspark_bench.harness.runner import StageProgress

# Heartbeats and trial retries are Optuna's own (marked experimental); their warnings are noise here.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

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
                raise DsparkError(f"cannot open the study storage {masked(url)!r}: {first_line(err)}") from None
            time.sleep(1 + attempt)


def make_sampler(spec: SweepSpec):
    if spec.method == "grid":
        return optuna.samplers.GridSampler(spec.space, seed=spec.sampler_seed)
    return optuna.samplers.TPESampler(seed=spec.sampler_seed, multivariate=True)


def suggest(trial: optuna.Trial, spec: SweepSpec) -> dict:
    """One point of the space; grid and TPE both go through the same suggestions.

    Evenly spaced numbers (a `{low, high, step}` range, or a list that happens to be one) are
    suggested as ordered ints or floats with their step, so TPE learns that 0.3 lies between
    0.2 and 0.4; other lists and the names (metric, schedule) are categorical.
    """
    params, known = {}, known_distributions(trial.study)
    for name, values in spec.space.items():
        if len(values) == 1 and spec.method != "grid":
            params[name] = values[0]
            continue
        step = even_step(values)
        # A study begun before numbers were ordered holds them as categorical: keep its kind.
        if step is None or isinstance(known.get(name), optuna.distributions.CategoricalDistribution):
            params[name] = trial.suggest_categorical(name, values)
        elif all(isinstance(v, int) for v in values):
            params[name] = trial.suggest_int(name, min(values), max(values), step=int(step))
        else:  # rounded: a float step leaves 0.30000000000000004 where the grid says 0.3
            params[name] = round(trial.suggest_float(name, min(values), max(values), step=step), 6)
    return params


def known_distributions(study: optuna.Study) -> dict:
    """The distribution each parameter already has in the study (its first trial that used it)."""
    known: dict = {}
    for trial in study.get_trials(deepcopy=False):
        for name, distribution in trial.distributions.items():
            known.setdefault(name, distribution)
    return known


def even_step(values: list) -> float | None:
    """The step of evenly spaced, increasing numbers; None for anything else (or one value)."""
    if len(values) < 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None
    steps = np.diff(np.asarray(values, dtype=float))
    if steps[0] <= 0 or not np.allclose(steps, steps[0], rtol=0, atol=1e-9):
        return None
    return int(steps[0]) if all(isinstance(v, int) for v in values) else round(float(steps[0]), 9)


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
            output = runner.run(ctx.pair, ctx.prompts, [config], ctx.settings)
        except Exception as err:  # recorded with the trial; the sweep goes on (optimize catches)
            trial.set_user_attr("error", f"{type(err).__name__}: {err}"[:500])
            raise
        samples = output.samples.assign(trial=trial.number)
        samples_dir = ctx.folder / "trials"
        samples_dir.mkdir(exist_ok=True)
        write_parquet(samples_dir / f"{trial.number:05d}.parquet", samples)
        row = summarize(samples).iloc[0].to_dict()
        for name, value in row.items():
            if isinstance(value, (int, float, np.integer, np.floating)) and name not in PARAMS:
                trial.set_user_attr(name, float(value))
        values = objective_values(row, ctx.spec)
        return values[0] if len(values) == 1 else values

    return objective


def trials_table(trials: list[optuna.trial.FrozenTrial]) -> pd.DataFrame:
    """One row per trial: its parameters, state, every metric, and error if it failed."""
    rows, retried = [], retried_numbers(trials)
    for t in trials:
        params = {k: round(v, 6) if isinstance(v, float) else v for k, v in t.params.items()}  # 0.30000000000000004
        row = {"trial": t.number, "state": t.state.name, **params, **t.user_attrs,
               "duration_s": t.duration.total_seconds() if t.duration else None}
        row["error"] = t.user_attrs.get("error") or t.system_attrs.get("fail_reason")
        if t.state == optuna.trial.TrialState.FAIL and not row["error"] and t.number in retried:
            row["error"] = "its worker died or was interrupted; retried"
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
    dead = [t.number for t in running if _worker_of(t) and _died_here(_worker_of(t))]
    unnamed = {t.number for t in running if _worker_of(t) is None}
    if unnamed:
        time.sleep(UNNAMED_GRACE_S)
        dead += [t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
                 if t.number in unnamed and _worker_of(t) is None]
    recovered, retry = 0, retry_callback()
    for number in dead:
        try:  # Study.tell takes a trial by number: any process may finish another's RUNNING trial
            finished = study.tell(number, state=optuna.trial.TrialState.FAIL)
        except (ValueError, optuna.exceptions.UpdateFinishedTrialError):
            continue  # another resume recovered it first
        except RuntimeError:
            # GridSampler.after_trial stops the study when no grid point is left unvisited (the dead
            # trial's counts as visited), which raises outside optimize(); the trial is FAIL by then.
            finished = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
            if finished.state != optuna.trial.TrialState.FAIL:
                continue
        retry(study, finished)
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
    trials = trial.study.get_trials(deepcopy=False)
    attrs = next(t.system_attrs for t in trials if t.number == trial.number)
    grid_id = attrs.get("grid_id")
    if grid_id is None:
        return False
    retried = set(attrs.get("retry_history", []))
    for other in trials:
        if other.number == trial.number or other.number in retried or other.system_attrs.get("grid_id") != grid_id:
            continue
        if other.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING):
            return True
    return False


def run_study(ctx: TrialContext, storage_url: str, study_name: str,
              progress: StageProgress | None = None) -> optuna.Study:
    """Create or load the study and work on it until its budget is met (or Ctrl-C)."""
    storage = open_storage(storage_url, ctx.spec.heartbeat_s)
    directions = [OBJECTIVES[name].direction for name in ctx.spec.objective]
    study = optuna.create_study(study_name=study_name, storage=storage, sampler=make_sampler(ctx.spec),
                                directions=directions, load_if_exists=True)
    recover_dead_trials(study)
    budget = grid_size(ctx.spec) if ctx.spec.method == "grid" else ctx.spec.trials

    def after_trial(study_: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        trials = study_.get_trials(deepcopy=False)
        write_parquet(ctx.folder / "trials.parquet", trials_table(trials))
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

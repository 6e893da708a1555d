"""Sweeps: search the policy's knobs over a task, by grid or Optuna, or exactly by replay.

The specification is spec.py's, the Optuna study study.py's, replay replay_sweep.py's; this module
runs a whole sweep: prepare models and prompts, then either replay or a real study (grid / TPE),
and write the run folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

import optuna
import pandas as pd

from dspark_bench.decoding import capture
from dspark_bench.errors import DsparkError
from dspark_bench.harness.plan import real_sweep_plan, seconds_per_token
from dspark_bench.objectives import rank
from dspark_bench.results import (
    SCHEMA_VERSION,
    check_writable,
    evaluation_of,
    new_run_id,
    provenance,
    read_json,
    write_json,
    write_parquet,
)
from dspark_bench.tasks.prompts import encode, prompts_fingerprint
from dspark_bench.tuning.spec import SweepSpec, evaluation_for, old_keys, parse_spec, per_temperature, points
from dspark_bench.tuning.study import (
    TrialContext,
    best_trials,
    default_storage,
    grid_size,
    masked,
    open_storage,
    requeue_interrupted,
    run_study,
    start_workers,
    trials_table,
)

if TYPE_CHECKING:
    from dspark_bench.harness.runner import StageProgress


from dspark_bench.engines.registry import EngineRegistry, engine_registry
from dspark_bench.measure.record_parts import parse_shard  # noqa: F401 (the CLI's --shard)
from dspark_bench.tuning.preparation import LoadedSweep, SweepResult, check_sampled_replay, prepare
from dspark_bench.tuning.records import load_or_record, parts_folder
from dspark_bench.tuning.replay_sweep import needs_draft_model, record_plan, replay_sweep

# --- the whole sweep: prepare, run (real or replay), summarise ----------------------------------


def run_info(spec: SweepSpec, prepared: LoadedSweep, extra: dict) -> dict:
    pair = prepared.pair
    models = (pair.target, pair.draft)
    return {"spec": spec.to_dict(), "base_config": prepared.base.to_dict(), "models": pair.describe(),
            "capture": capture.describe(capture.captured(prepared.points, pair.device, spec.eager, models),
                                        pair.device, spec.eager, models),
            "prompts": {"count": len(prepared.prompts), "fingerprint": prompts_fingerprint(prepared.prompts),
                        **prepared.source}, **extra}


def start_folder(out: Path, kind: str) -> Path:
    """A sweep's run folder exists while it runs (the study and per-trial files live in it);
    every file in it is written atomically, and a finished sweep only gains, never loses."""

    folder = check_writable(out) / new_run_id(kind)
    folder.mkdir()
    return folder


def write_run_info(folder: Path, kind: str, info: dict) -> None:
    write_json(folder / "run.json", {"schema_version": SCHEMA_VERSION, "run_id": folder.name, "kind": kind,
                                     **provenance(), **info})


def collect_samples(folder: Path) -> pd.DataFrame:
    # Trial files are named by number; a hidden temporary one left by a killed write is not a trial.
    parts = [pd.read_parquet(p) for p in sorted((folder / "trials").glob("[0-9]*.parquet"))]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def finish_real(folder: Path, study: optuna.Study, spec: SweepSpec) -> SweepResult:
    """trials.parquet, samples.parquet and summary.json of a real (grid or Optuna) sweep.
    Written after local workers are done, so their last trials are in, finished."""
    trials = trials_table(study.get_trials(deepcopy=False))
    write_parquet(folder / "trials.parquet", trials)
    samples = collect_samples(folder)
    if not samples.empty:
        write_parquet(folder / "samples.parquet", samples)
    best = [t.number for t in best_trials(study)]
    complete = trials[trials["state"] == "COMPLETE"] if "state" in trials else trials
    ranked = rank(complete, spec.objective[0], "objective_0") if "objective_0" in complete else complete
    states = trials["state"].value_counts().to_dict() if "state" in trials else {}
    summary = {"evaluation": "real", "method": spec.method, "objective": list(spec.objective), "best_trials": best,
               "trial_states": states, "best": ranked.head(10).to_dict(orient="records")}
    write_json(folder / "summary.json", summary)
    return SweepResult(folder, ranked, summary, spec)


def run_sweep(spec: SweepSpec, out: Path, storage: str | None = None, study_name: str | None = None,
              workers: int = 1, progress: StageProgress | None = None,
              say: Callable[[str], None] | None = None, origin: str | None = None,
              engines: EngineRegistry | None = None) -> SweepResult:
    """A new sweep: real (grid / Optuna, in a study) or replay; returns its folder, best policies
    and summary (a SweepResult).

    With `say`, the plan and its estimated duration are said before any decoding; `engines`: what
    measures the prices of an engine --prices names and confirms in it (default: what the engines
    lend here, engines.registry.engine_registry)."""
    if workers < 1:
        raise DsparkError(f"--workers must be at least 1 (got {workers})")
    evaluation = evaluation_for(spec)
    if spec.continuations is not None and evaluation != "replay":
        raise DsparkError("--continuations feeds replay's record: a real sweep decodes every policy here "
                          "(drop --evaluation real, or --continuations)")
    check_writable(out)  # before any model loads or prices are measured
    engines = engines if engines is not None else engine_registry(spec.prices, say)
    prepared = prepare(spec, say, engines, progress)  # prompts read, models loaded, files checked, prices found
    if evaluation == "replay":
        needs_draft_model(prepared.pair)
    if say and origin:
        say(origin)
    folder = start_folder(out, "sweep")
    if evaluation == "replay":
        write_run_info(folder, "sweep", run_info(spec, prepared, {"evaluation": "replay"}))
        return replay_sweep(folder, spec, prepared, Path(out) / "records", progress, say, engines)
    storage = storage or default_storage(folder)
    study_name = study_name or folder.name
    # The password of a database URL is not written into results; --resume asks for it.
    write_run_info(folder, "sweep", run_info(spec, prepared, {"evaluation": "real", "storage": masked(storage),
                                                               "study": study_name}))
    if say:
        trials = grid_size(spec) if spec.method == "grid" else spec.trials
        per_token = seconds_per_token(prepared.pair, encode(prepared.pair.tokenizer, prepared.prompts[0].text,
                                                            spec.chat_template))
        say(real_sweep_plan(per_token, len(prepared.prompts), prepared.base.verification.max_new_tokens,
                            -(-trials // workers), spec.repeats) + (f" with {workers} workers" if workers > 1 else ""))
    return continue_sweep(folder, prepared, workers, progress, storage=storage)


def run_sweeps(spec: SweepSpec, out: Path, storage: str | None = None, study_name: str | None = None,
               workers: int = 1, progress: StageProgress | None = None,
               say: Callable[[str], None] | None = None, origin: str | None = None,
               engines: EngineRegistry | None = None) -> list[SweepResult]:
    """One sweep per temperature the spec lists (`temperatures`: each its own record and folder),
    else the spec's one sweep; every one checked before the first decodes."""
    chosen = per_temperature(spec)
    for one in chosen:
        check_sampled_replay(one, points(one))
    engines = engines if engines is not None else engine_registry(spec.prices, say)  # said once, not per sweep
    results = []
    for one in chosen:
        if say and len(chosen) > 1:
            say(f"temperature {one.temperature:g}, top-p {one.top_p:g}:")
        results.append(run_sweep(one, out, storage, study_name, workers, progress, say, origin, engines))
    return results


def check_unchanged(folder: Path, info: dict, prepared: LoadedSweep) -> None:
    if prompts_fingerprint(prepared.prompts) != info["prompts"]["fingerprint"]:
        raise DsparkError(f"the prompts of {folder} changed since the sweep started; start a new sweep")
    models = prepared.pair.describe()
    for key in ("target_fingerprint", "draft_fingerprint"):
        if models[key] != info["models"][key]:
            raise DsparkError(f"the {key.split('_')[0]} model of {folder} changed since the sweep started; "
                              "start a new sweep")


def record_shard(spec: SweepSpec, records_root: Path, shard: tuple[int, int], progress: StageProgress | None = None,
                 say: Callable[[str], None] | None = None) -> list[Path]:
    """One shard of a replay sweep's records from a continuations file (`sweep --shard I/N`): its
    prompts' parts, into the parts folders the sweep itself reads (other machines run the other
    shards; copied together, or on one shared folder, the sweep finds them and records nothing
    again). Shard 1/1 is every prompt: the records themselves, whole, and nothing else (no
    simulation). Returns the folders written."""
    if spec.continuations is None:
        raise DsparkError("--shard splits recording from an engine's continuations: give --continuations FILE")
    prepared = prepare(spec, say)
    needs_draft_model(prepared.pair)
    _, gamma, record_dirs, ids = record_plan(spec, prepared, records_root)
    folders = []
    for drafter, record_dir in record_dirs.items():
        if (record_dir / "record.json").is_file():
            continue  # already whole
        whole = load_or_record(spec, prepared, gamma, ids, record_dir, progress, drafter, shard=shard)
        folders.append(record_dir if whole is not None else parts_folder(record_dir))
    return folders


def continue_sweep(folder: Path, prepared: LoadedSweep | None = None, workers: int = 1,
                   progress: StageProgress | None = None,
                   worker_only: bool = False, storage: str | None = None) -> SweepResult | None:
    """Work on a real sweep's study until its budget is met; then write its summary."""

    info = read_json(Path(folder) / "run.json", "run file")
    if info.get("kind") != "sweep" or evaluation_of(info) != "real" or "storage" not in info:
        what = f"a {info.get('kind', 'run')} folder" if info.get("kind") != "sweep" else "a replay sweep's folder"
        raise DsparkError(f"--resume {folder}: {what}, not a resumable sweep (only real grid/Optuna sweeps keep a "
                          "study to continue)")
    if storage is None and "***" in info["storage"]:
        raise DsparkError(f"{folder}'s study is in {info['storage']}; pass --storage with the password to resume")
    info["storage"] = storage or info["storage"]
    spec = parse_spec(old_keys(info["spec"]), str(folder))  # a sweep started by an earlier version too
    if prepared is None:  # a resume: the prompts and models must be those the sweep started with
        prepared = prepare(spec)
        check_unchanged(Path(folder), info, prepared)
    ctx = TrialContext(spec, prepared.pair, prepared.prompts, prepared.base, Path(folder),
                       spec.runner_settings())
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

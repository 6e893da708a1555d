"""Sweeps: search the policy's knobs over a task, by grid or Optuna, or exactly by replay.

The specification is sweep_spec.py's, the Optuna study study.py's; this module runs a whole
sweep: prepare models and prompts, then either replay (record once, simulate every policy,
confirm the best with timed runs) or a real study (grid / TPE), and write the run folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import optuna
import pandas as pd

from dspark_bench.config import DecodeConfig
from dspark_bench.errors import DsparkError
from dspark_bench.metrics import summarize
from dspark_bench.objectives import OBJECTIVES, rank
from dspark_bench.results import write_folder, write_json, write_parquet
from dspark_bench.study import (TrialContext, best_trials, default_storage, grid_size, masked, open_storage,
                                requeue_interrupted, run_study, start_workers, trials_table)
from dspark_bench.sweep_spec import SweepSpec, base_config, engine_for, parse_spec, points

if TYPE_CHECKING:
    from dspark_bench.runner import StageProgress

# --- the whole sweep: prepare, run (real or replay), summarise ----------------------------------


@dataclass
class Prepared:
    pair: object
    prompts: list
    base: DecodeConfig
    source: dict


def prepare(spec: SweepSpec) -> Prepared:
    from dspark_bench.models import load_pair
    from dspark_bench.tasks import load_prompts

    prompts, source, task_tokens = load_prompts(spec.task, spec.dataset, spec.split, spec.prompt_field,
                                                spec.category_field, spec.limit)
    base = base_config(spec, task_tokens)
    points(spec, base)  # a threshold outside its range fails here, before models load
    return Prepared(load_pair(spec.target, spec.draft, spec.device, spec.dtype, spec.heads), prompts, base, source)


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
    from dspark_bench.results import SCHEMA_VERSION, provenance

    write_json(folder / "run.json", {"schema_version": SCHEMA_VERSION, "run_id": folder.name, "kind": kind,
                                     **provenance(), **info})


def collect_samples(folder: Path) -> pd.DataFrame:
    # Trial files are named by number; a hidden temporary one left by a killed write is not a trial.
    parts = [pd.read_parquet(p) for p in sorted((folder / "trials").glob("[0-9]*.parquet"))]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def finish_real(folder: Path, study: optuna.Study, spec: SweepSpec) -> pd.DataFrame:
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
    summary = {"engine": "real", "method": spec.method, "objective": list(spec.objective), "best_trials": best,
               "trial_states": states, "best": ranked.head(10).to_dict(orient="records")}
    write_json(folder / "summary.json", summary)
    return ranked


def replay_space(spec: SweepSpec, base: DecodeConfig) -> list[DecodeConfig]:
    """The space's points plus every fixed gamma among them: classic decoding, the baseline to beat."""
    configs = points(spec, base)
    drafters = dict.fromkeys((c.drafter, c.ngram_min, c.ngram_max) for c in configs)
    classic = [base.replace(schedule="fixed", gamma_max=g, min_draft_len=0, batch_size=b, drafter=d, ngram_min=lo,
                            ngram_max=hi)
               for d, lo, hi in drafters for b in sorted({c.batch_size for c in configs})
               for g in sorted({c.gamma_max for c in configs})]
    return configs + [c for c in classic if c not in configs]


def drafter_groups(configs: list[DecodeConfig]) -> dict[tuple, list[int]]:
    """The indexes of the policies each drafter (with its knobs) proposes for: one record each."""
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(configs):
        groups.setdefault((c.drafter, c.ngram_min, c.ngram_max), []).append(i)
    return groups


def goodput_points(configs: list[DecodeConfig], model_file: Path) -> list[DecodeConfig]:
    """The goodput schedule at every metric, gamma_max and batch size of the space: it has no
    threshold to search, so it joins every replay sweep, as fixed gamma does — for the draft
    model (its acceptance fit is the draft model's record's)."""
    configs = [c for c in configs if c.drafter == "model"]
    if not configs:
        return []
    base = configs[0]
    return [base.replace(schedule="goodput", metric=m, gamma_max=g, min_draft_len=0, batch_size=b, semantics="dspark",
                         batch_quorum=0.0, goodput_model=str(Path(model_file).resolve()))
            for b in sorted({c.batch_size for c in configs}) for m in dict.fromkeys(c.metric for c in configs)
            for g in sorted({c.gamma_max for c in configs})]


def write_goodput_model(folder: Path, rec, record_dir: Path, surface) -> Path:
    """Fit acceptance on the record (kept beside it) and write the sweep's goodput model."""
    from dspark_bench.acceptance import load_or_fit
    from dspark_bench.goodput import GoodputModel

    model = GoodputModel.build(load_or_fit(rec, record_dir), surface)
    write_json(folder / "goodput_model.json", model.to_dict())
    return folder / "goodput_model.json"


def load_or_record(spec: SweepSpec, prepared: Prepared, gamma: int, ids: list[list[int]], record_dir: Path,
                   progress: StageProgress | None = None, drafter: DecodeConfig | None = None,
                   continuations: list[list[int]] | None = None):
    """The replay record of these models and prompts (and `drafter`, default the draft model):
    from the cache, else recorded and cached."""
    from dspark_bench.prompts import prompts_fingerprint
    from dspark_bench.replay import Record, record
    from dspark_bench.runner import stage_steps

    pair, prompts, base = prepared.pair, prepared.prompts, prepared.base
    drafter = drafter or base
    models = {**pair.describe(), "drafter_fingerprint": pair.drafter_fingerprint(drafter)}
    fingerprint = prompts_fingerprint(prompts)
    if (record_dir / "record.json").is_file():
        rec = Record.load(record_dir)
        rec.check_matches(models, fingerprint)
        return rec
    info = {"models": models, "prompts_fingerprint": fingerprint, "prompt_ids": [p.id for p in prompts],
            "categories": [p.category for p in prompts]}
    eos_ids = spec.runner_settings().eos_ids(pair)
    stage = "recording" if drafter.drafter == "model" else f"recording ({drafter.drafter})"
    rec = record(pair, ids, base.max_new_tokens, gamma, base.topk, info, eos_ids=eos_ids,
                 progress=stage_steps(progress, stage, len(ids)), drafter=drafter, continuations=continuations)
    try:
        write_folder(record_dir, rec.save)
    except OSError:  # another sweep stored the same record meanwhile: keep theirs
        pass
    return rec


def record_key(spec: SweepSpec, prepared: Prepared, gamma: int, drafter: DecodeConfig | None = None) -> str:
    """A record's cache key: the models (the drafter's), the prompts and every setting that
    changes what it holds."""
    from dspark_bench.prompts import prompts_fingerprint

    models, base = prepared.pair.describe(), prepared.base
    drafted = prepared.pair.drafter_fingerprint(drafter or base).replace(":", "-")
    return (f"{models['target_fingerprint']}-{drafted}-{prompts_fingerprint(prepared.prompts)}"
            f"-n{base.max_new_tokens}-g{gamma}-k{base.topk}-{models['dtype']}" + ("-noeos" if spec.ignore_eos else ""))


def replay_sweep(folder: Path, spec: SweepSpec, prepared: Prepared, records_root: Path,
                 progress: StageProgress | None = None, say: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Record once, simulate the whole space, confirm the best few with real timed runs."""
    from dspark_bench.prompts import encode
    from dspark_bench.batch_replay import simulate_with_surface
    from dspark_bench.cost import measure_surface
    from dspark_bench.replay import simulate_grid

    pair, configs = prepared.pair, replay_space(spec, prepared.base)
    gamma = max(c.gamma_max for c in configs)
    groups = drafter_groups(configs)
    record_dirs = {key: records_root / record_key(spec, prepared, gamma, configs[group[0]])
                   for key, group in groups.items()}
    ids = [encode(pair.tokenizer, p.text) for p in prepared.prompts]
    if say:
        say_replay_plan(spec, prepared, ids[0], configs, all((d / "record.json").is_file() for d in record_dirs.values()),
                        say)
    # One record per drafter: the target's continuation is the same, what each proposes is not.
    records: dict = {}
    for key, group in groups.items():
        known = next(iter(records.values()), None)  # the target's continuations, decoded once
        continuations = None if known is None else [known.continuation[p, : n].tolist()
                                                     for p, n in enumerate(known.lengths)]
        records[key] = load_or_record(spec, prepared, gamma, ids, record_dirs[key], progress, configs[group[0]],
                                      continuations)
    rec = next(iter(records.values()))
    # The cost model is timed with the cache at a realistic length: a prompt plus half its output.
    context = ids[0] + rec.continuation[0, : int(rec.lengths[0]) // 2].tolist()
    if progress:
        progress("timing the cost model", 0, 1)
    batch_sizes = sorted({c.batch_size for c in configs})
    surface = measure_surface(pair, context, gamma, batch_sizes, drafters={key[0] for key in groups})
    cost = surface.at(1)
    write_json(folder / "cost_model.json", cost.to_dict())
    model_key = next((key for key in groups if key[0] == "model"), None)
    if model_key is not None:  # goodput decides with the draft model's acceptance fit
        model_file = write_goodput_model(folder, records[model_key], record_dirs[model_key], surface)
        configs = configs + [c for c in goodput_points(configs, model_file) if c not in configs]
        groups = drafter_groups(configs)
    if progress:
        progress(f"simulating {len(configs):,} policies", 0, 1)
    if batch_sizes != [1]:
        write_json(folder / "cost_surface.json", surface.to_dict())
    parts = []
    for key, group in groups.items():
        chosen = [configs[i] for i in group]
        if batch_sizes == [1]:
            part = simulate_grid(records[key], chosen, cost)
        else:  # every policy at its own batch size, both layouts (batch_replay.py)
            part = simulate_with_surface(records[key], chosen, surface)
        parts.append(part.assign(config_id=np.array(group)))
    table = pd.concat(parts, ignore_index=True).sort_values("config_id", ignore_index=True).assign(source="replay")
    record_dir = record_dirs[model_key] if model_key is not None else next(iter(record_dirs.values()))
    table, samples = confirm(table, configs, spec, prepared, progress)
    write_parquet(folder / "trials.parquet", table)
    write_parquet(folder / "samples.parquet", samples)
    return write_replay_summary(folder, table, spec, cost, record_dir)


def say_replay_plan(spec: SweepSpec, prepared: Prepared, first_ids: list[int], configs: list[DecodeConfig],
                    recorded: bool, say: Callable[[str], None]) -> None:
    from dspark_bench.plan import replay_plan, seconds_per_token

    # Confirmed: the best scheduled few + the best goodput + the best fixed γ, at each batch size.
    sizes = {c.batch_size for c in configs}
    scheduled = sum(c.schedule != "fixed" for c in configs) // len(sizes)
    policies = len(configs) + len(goodput_points(configs, Path("goodput_model.json")))  # goodput joins after recording
    line = replay_plan(seconds_per_token(prepared.pair, first_ids), len(prepared.prompts), prepared.base.max_new_tokens,
                       policies, (min(spec.confirm_top, scheduled) + 2) * len(sizes), spec.repeats,
                       recorded=recorded)
    say(line + (" — an upper bound: a batched run takes less than a batch-1 one" if max(sizes) > 1 else ""))


def confirm(table: pd.DataFrame, configs: list[DecodeConfig], spec: SweepSpec, prepared: Prepared,
            progress: StageProgress | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Time the best `confirm_top` scheduled policies, the best goodput and the best fixed gamma (by the replay's
    ranking); their measured columns join the table, their samples are returned."""
    from dspark_bench.runner import run, stage_steps

    objective = OBJECTIVES[spec.objective[0]]
    ranked = rank(table, objective.name, objective.column("replay"))
    # Per batch size (which policy wins depends on what a step costs at B) and drafter: the best
    # threshold-style policies, the best goodput and the best fixed γ.
    chosen = pd.concat([part for _, by_batch in ranked.groupby(["batch_size", "drafter"], sort=True)
                        for part in (by_batch[~by_batch["schedule"].isin(["fixed", "goodput"])].head(spec.confirm_top),
                                     by_batch[by_batch["schedule"] == "goodput"].head(1),
                                     by_batch[by_batch["schedule"] == "fixed"].head(1))])
    ids = chosen["config_id"].to_numpy()
    output = run(prepared.pair, prepared.prompts, [configs[i] for i in ids],
                 spec.runner_settings(),
                 progress=stage_steps(progress, f"confirming the best {len(ids)}", len(prepared.prompts) * len(ids)))
    measured = summarize(output.samples)
    measured["config_id"] = ids[measured["config_id"].to_numpy()]
    keep = ["config_id", "speedup", "speedup_low", "speedup_high", "baseline_tokens_per_s", "spec_tokens_per_s",
            "baseline_mean_new_tokens", "spec_mean_new_tokens", "identical_to_baseline"]
    keep += [c for c in ("spec_latency_per_token_s", "baseline_latency_per_token_s", "layout") if c in measured]
    table = table.merge(measured[keep], on="config_id", how="left")
    table.loc[table["speedup"].notna(), "source"] = "confirmed"
    return table, output.samples.assign(config_id=ids[output.samples["config_id"].to_numpy()])


def write_replay_summary(folder: Path, table: pd.DataFrame, spec: SweepSpec, cost, record_dir: Path) -> pd.DataFrame:
    """summary.json of a replay sweep; returns the confirmed policies, best first."""
    objective = OBJECTIVES[spec.objective[0]]
    confirmed = rank(table[table["source"] == "confirmed"], objective.name, objective.column("real"))
    summary = {
        "engine": "replay", "objective": list(spec.objective), "policies_simulated": len(table),
        "record": str(record_dir), "cost_model": cost.to_dict(), "cost_model_accuracy": accuracy(confirmed),
        "best": confirmed[confirmed["schedule"] != "fixed"].head(1).to_dict(orient="records"),
        "classic": confirmed[confirmed["schedule"] == "fixed"].to_dict(orient="records"),
        "goodput": confirmed[confirmed["schedule"] == "goodput"].to_dict(orient="records"),
        "confirmed": confirmed.to_dict(orient="records"),
    }
    if (table["batch_size"] > 1).any():
        summary["by_batch_size"] = by_batch_size(table, confirmed, objective)
    if table["drafter"].nunique() > 1:
        summary["by_drafter"] = by_drafter(confirmed)
    write_json(folder / "summary.json", summary)
    return confirmed


def by_drafter(confirmed: pd.DataFrame) -> list[dict]:
    """The best confirmed policy of each drafter (scheduled or fixed γ), best first: the side-by-side
    comparison the report shows."""
    columns = ["drafter", "config_label", "speedup", "speedup_low", "speedup_high", "tokens_per_round",
               "acceptance_rate", "avg_draft_len", "identical_to_baseline"]
    best = confirmed.groupby("drafter", sort=False).head(1)  # `confirmed` is ranked best first
    return best[[c for c in columns if c in best]].to_dict(orient="records")


def accuracy(confirmed: pd.DataFrame) -> dict:
    """How far the cost model's predicted speedup is from the measured one."""
    ratio = confirmed["speedup"] / confirmed["predicted_speedup"]
    return {"measured_over_predicted_median": float(ratio.median()),
            "mean_abs_error": float((confirmed["speedup"] - confirmed["predicted_speedup"]).abs().mean())}


def by_batch_size(table: pd.DataFrame, confirmed: pd.DataFrame, objective) -> list[dict]:
    """Per batch size: the best scheduled policy and the best fixed gamma, predicted in both
    layouts and measured (padded) where confirmed, with the cost model's accuracy at that B."""
    rows = []
    for batch_size, group in table.groupby("batch_size", sort=True):
        row = {"batch_size": int(batch_size), "layout_measured": "padded"}
        for layout, column in (("padded", "predicted_speedup"), ("packed", "predicted_speedup_packed")):
            scheduled = group[group["schedule"] != "fixed"].sort_values(column, ascending=False)
            fixed = group[group["schedule"] == "fixed"].sort_values(column, ascending=False)
            row[f"{layout}_predicted"] = {
                "best_scheduled": scheduled.iloc[0]["config_label"], "best_scheduled_speedup": float(scheduled.iloc[0][column]),
                "best_fixed": fixed.iloc[0]["config_label"], "best_fixed_speedup": float(fixed.iloc[0][column]),
                "scheduled_over_fixed": float(scheduled.iloc[0][column] / fixed.iloc[0][column])}
        measured = confirmed[confirmed["batch_size"] == batch_size]
        row["measured"] = measured[["config_label", "schedule", "speedup", "speedup_low", "speedup_high",
                                    "predicted_speedup", "baseline_tokens_per_s", "spec_tokens_per_s"]
                                   ].to_dict(orient="records")
        row["cost_model_accuracy"] = accuracy(measured) if len(measured) else None
        rows.append(row)
    return rows


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


def run_sweep(spec: SweepSpec, out: Path, storage: str | None = None, study_name: str | None = None,
              workers: int = 1, progress: StageProgress | None = None,
              say: Callable[[str], None] | None = None, origin: str | None = None) -> tuple[Path, pd.DataFrame]:
    """A new sweep: real (grid / Optuna, in a study) or replay; returns its folder and best table.

    With `say`, the plan and its estimated duration are said before any decoding."""
    if workers < 1:
        raise DsparkError(f"--workers must be at least 1 (got {workers})")
    engine = engine_for(spec)
    prepared = prepare(spec)  # prompts read and models loaded: bad input has failed by now
    if say and origin:
        say(origin)
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

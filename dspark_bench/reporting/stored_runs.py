"""Baselines: a run folder's run.json, summary.json and samples.parquet, kept to compare against.

Reading one (checked: schema, keys, readable samples), deciding whether two runs measured the
same thing (`comparable`), re-running the benchmark a baseline describes, and writing a
baseline or a report. regress.py compares; this module says what is compared with what.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dspark_bench.config import with_defaults
from dspark_bench.errors import DsparkError
from dspark_bench.results import (
    SCHEMA_VERSION,
    check_writable,
    describe_machine,
    provenance,
    read_json,
    read_parquet,
    write_folder,
    write_text,
)
from dspark_bench.tasks.prompts import prompts_fingerprint

# The files a baseline keeps; samples.parquet is needed for the outputs' fingerprint.
BASELINE_FILES = ("run.json", "summary.json", "samples.parquet")
DETERMINISTIC_METRICS = ("tokens_per_round", "acceptance_rate", "avg_draft_len", "block_acceptance_rate")
SUMMARY_KEYS = ("config_id", "config_label", *DETERMINISTIC_METRICS, "speedup")
RUN_KEYS = {"configs": (), "settings": (), "models": ("target", "draft", "target_fingerprint", "draft_fingerprint",
                                                      "device", "dtype"), "prompts": ("count", "fingerprint")}
SAMPLE_COLUMNS = ("prompt_id", "turn", "config_id", "output_ids")
TIMING_COLUMNS = ("baseline_time_s", "baseline_new_tokens", "spec_time_s", "new_tokens")
# Settings that change what is generated; repeats, warm-up and tracing only change timing.
OUTPUT_SETTINGS = ("chat_template", "turns", "ignore_eos")


class NotComparable(DsparkError):
    """The baseline and the current run measured different things."""

    def __init__(self, reasons: list[str]):
        self.reasons = reasons
        super().__init__("baseline and current run are not comparable: " + "; ".join(reasons))


@dataclass(frozen=True)
class RunRecord:
    """A run folder (or baseline) as regress reads it."""

    folder: Path
    run: dict  # run.json
    summary: dict  # summary.json
    outputs: dict[int, str]  # config_id -> fingerprint of the generated ids
    samples: pd.DataFrame | None = None  # samples.parquet: per prompt times, for paired speed checks

    @property
    def configs(self) -> dict[int, dict]:
        """summary.json's per-config rows, by config_id."""
        return {int(row["config_id"]): row for row in self.summary["configs"]}

    def describe(self) -> str:
        commit = self.run.get("environment", {}).get("git_commit")
        return f"`{self.run.get('run_id', self.folder.name)}`" + (f" (commit {commit})" if commit else "")


# ---------------------------------------------------------------------------------------------
# Loading


def summary_path(path: Path) -> Path:
    """Accept a baseline's summary.json or the folder holding it."""
    path = Path(path)
    return path / "summary.json" if path.is_dir() else path


def _check_schema(data: object, what: str, path: Path) -> dict:
    if not isinstance(data, dict):
        raise DsparkError(f"{what} {str(path)!r} is not a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise DsparkError(f"{what} {str(path)!r} has schema_version {version!r}; this dspark-bench reads "
                          f"schema_version {SCHEMA_VERSION} (re-create it with `dspark-bench regress --update`)")
    return data


def _missing(mapping: dict, keys, prefix: str = "") -> list[str]:
    return [prefix + key for key in keys if key not in mapping]


def _check_run_keys(run: dict, path: Path, what: str) -> None:
    missing = _missing(run, RUN_KEYS)
    for section, keys in RUN_KEYS.items():
        if isinstance(run.get(section), dict):
            missing += _missing(run[section], keys, f"{section}.")
    if missing:
        raise DsparkError(f"{what} {str(path)!r} lacks {', '.join(missing)}")


def _check_summary_keys(summary: dict, path: Path, what: str) -> None:
    rows = summary.get("configs")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise DsparkError(f"{what} {str(path)!r} lacks a non-empty list of configs")
    missing = sorted({key for row in rows for key in _missing(row, SUMMARY_KEYS)})
    if missing:
        raise DsparkError(f"{what} {str(path)!r} lacks {', '.join(missing)} in its configs")


def _read_samples(path: Path, what: str) -> pd.DataFrame:
    if not path.is_file():
        raise DsparkError(f"{what} {str(path)!r} does not exist (it holds the generated ids compared)")
    samples = read_parquet(path, what)
    missing = [c for c in SAMPLE_COLUMNS if c not in samples]
    if missing:
        raise DsparkError(f"{what} {str(path)!r} lacks column(s) {', '.join(missing)}")
    # The timings too where the run kept them: speed is compared per prompt (paired) with them.
    return samples[[c for c in (*SAMPLE_COLUMNS, *TIMING_COLUMNS) if c in samples]]


def load_record(folder: Path, what: str = "run", summary_file: Path | None = None) -> RunRecord:
    """Read and check run.json, summary.json (or the summary file named) and samples.parquet
    of a run folder or baseline."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DsparkError(f"{what} folder {str(folder)!r} does not exist")
    summary_file, run_file = Path(summary_file or folder / "summary.json"), folder / "run.json"
    summary = _check_schema(read_json(summary_file, f"{what} summary"), f"{what} summary", summary_file)
    _check_summary_keys(summary, summary_file, f"{what} summary")
    run = _check_schema(read_json(run_file, f"{what} run file"), f"{what} run file", run_file)
    _check_run_keys(run, run_file, f"{what} run file")
    samples = _read_samples(folder / "samples.parquet", f"{what} samples")
    outputs = {int(config_id): outputs_fingerprint(group) for config_id, group in samples.groupby("config_id")}
    return RunRecord(folder, run, summary, outputs, samples)


def load_baseline(path: Path) -> RunRecord:
    """A baseline from its summary.json (run.json and samples.parquet lie beside it)."""
    path = summary_path(path)
    if not path.is_file():
        raise DsparkError(f"baseline summary {str(path)!r} does not exist")
    return load_record(path.parent, "baseline", summary_file=path)


def outputs_fingerprint(samples: pd.DataFrame) -> str:
    """sha256 of every sample's generated ids, independent of row order."""
    rows = sorted(
        (str(prompt_id), int(turn), int(config_id), [int(t) for t in ids])
        for prompt_id, turn, config_id, ids in samples[list(SAMPLE_COLUMNS)].itertuples(index=False)
    )
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Comparability


def _device_type(models: dict) -> str:
    return str(models["device"]).split(":")[0]  # cuda:0 and cuda:1 measure the same kind of thing


def _config_differences(baseline: list[dict], current: list[dict]) -> list[str]:
    if len(baseline) != len(current):
        return [f"configs differ (baseline has {len(baseline)}, current {len(current)})"]
    reasons = []
    for index, (old, new) in enumerate(zip(baseline, current)):
        changed = [f"{key} {old.get(key)!r} → {new.get(key)!r}" for key in sorted(set(old) | set(new))
                   if old.get(key) != new.get(key)]
        if changed:
            reasons.append(f"config {index} differs ({', '.join(changed)})")
    return reasons


def comparable(baseline_run: dict, current_run: dict, batch_sizes: list[int] | None = None) -> list[str]:
    """Reasons a comparison of two run.json's would be meaningless; empty when it is sound.

    With `batch_sizes`, the current run must hold every baseline policy at each of them."""
    reasons = []
    if batch_sizes:
        baseline_run = {**baseline_run, "configs": [{**with_defaults(c), "batch_size": b} for b in batch_sizes
                                                     for c in baseline_run["configs"]]}

    def differs(what: str, old, new) -> None:
        if old != new:
            reasons.append(f"{what} differs (baseline {old!r}, current {new!r})")

    old_models, new_models = baseline_run["models"], current_run["models"]
    differs("schema_version", baseline_run.get("schema_version"), current_run.get("schema_version"))
    differs("target fingerprint", old_models["target_fingerprint"], new_models["target_fingerprint"])
    differs("draft fingerprint", old_models["draft_fingerprint"], new_models["draft_fingerprint"])
    differs("dtype", old_models["dtype"], new_models["dtype"])
    differs("device type", _device_type(old_models), _device_type(new_models))
    differs("prompts fingerprint", baseline_run["prompts"]["fingerprint"], current_run["prompts"]["fingerprint"])
    # Captured passes (CUDA's default) and eager ones time different loops; a run made before
    # run.json said how its passes ran ran them eagerly.
    differs("capture mode", _capture_mode(baseline_run), _capture_mode(current_run))
    old_configs, new_configs = ([with_defaults(c) for c in run["configs"]] for run in (baseline_run, current_run))
    # Named on their own: the generation settings most likely to be changed by hand.
    for key in ("max_new_tokens", "temperature"):
        differs(key, [c.get(key) for c in old_configs], [c.get(key) for c in new_configs])
    strip = lambda configs: [{k: v for k, v in c.items() if k not in ("max_new_tokens", "temperature")}
                             for c in configs]
    reasons += _config_differences(strip(old_configs), strip(new_configs))

    from dspark_bench.harness.runner import RunnerSettings  # loads torch: kept off the CLI's import

    defaults = dataclasses.asdict(RunnerSettings())  # a run made before a setting existed ran with its default
    for key in OUTPUT_SETTINGS:
        differs(f"setting {key}", baseline_run["settings"].get(key, defaults[key]),
                current_run["settings"].get(key, defaults[key]))
    return reasons


def _capture_mode(run: dict) -> str:
    return (run.get("capture") or {}).get("mode", "eager")


# ---------------------------------------------------------------------------------------------
# Re-running a baseline


def plan_rerun(baseline: RunRecord):
    """The baseline's run config, resolved (models loaded, prompts read, policies built), the way
    `run --config` resolves one; refused (NotComparable) if what it resolves to is not what the
    baseline measured. Checked before anything is decoded, so a changed model or prompt set
    costs seconds, not a run."""

    info = baseline.run
    from dspark_bench.harness.run import from_run_info, plan_run  # loads torch: kept off the CLI's import

    planned = plan_run(from_run_info(info, "the baseline's run.json"))
    current = {"schema_version": SCHEMA_VERSION, "configs": [c.to_dict() for c in planned.configs],
               "settings": dataclasses.asdict(planned.config.settings()), "models": planned.pair.describe(),
               "prompts": {"count": len(planned.prompts), "fingerprint": prompts_fingerprint(planned.prompts)}}
    reasons = comparable(info, current)
    if reasons:
        raise NotComparable(reasons)
    return planned


def at_batch_sizes(planned, batch_sizes: list[int] | None):
    """A planned re-run with every policy at each of `batch_sizes` (unchanged without them)."""
    if not batch_sizes:
        return planned
    if planned.config.calibration is not None:
        raise DsparkError("this baseline's policies come from a calibration file; it re-runs at its own batch "
                          "sizes only (drop --batch-size, or make a baseline with run --calibration --batch-size)")
    configs = [c.replace(batch_size=b) for b in batch_sizes for c in planned.configs]
    config = dataclasses.replace(planned.config, policies=tuple(c.to_dict() for c in configs),
                                 grid={**planned.config.grid, "batch_size": tuple(batch_sizes)})
    return dataclasses.replace(planned, config=config, configs=configs)


def rerun(baseline_folder: Path, out: Path, progress=None, plan=None) -> Path:
    """Run the benchmark a baseline describes again; returns the new run folder under `out`.
    `progress(stage, done, total)` follows the decoding."""

    plan = plan or plan_rerun(load_record(Path(baseline_folder), "baseline"))
    from dspark_bench.harness.run import execute  # loads torch: kept off the CLI's import

    folder, _ = execute(plan.config, out, progress, planned=plan)
    return folder


# ---------------------------------------------------------------------------------------------
# Writing


def baseline_folder(path: Path) -> Path:
    """The folder of a baseline given by its summary.json (which may not exist yet) or itself."""
    path = Path(path)
    return path.parent if path.suffix == ".json" else path


def update_baseline(run_folder: Path, baseline_dir: Path, replace: bool = False) -> Path:
    """Copy a run's baseline files into `baseline_dir`, atomically; replace one only if asked."""
    record = load_record(run_folder, "run")  # only a complete, readable run becomes a baseline
    baseline_dir = Path(baseline_dir)
    if baseline_dir.exists() and not replace:
        raise DsparkError(f"baseline {str(baseline_dir)!r} already exists; pass --update to replace it")
    check_writable(baseline_dir.parent)

    def fill(partial: Path) -> None:
        for name in BASELINE_FILES:
            shutil.copy2(record.folder / name, partial / name)
        made = {"source_run": record.run.get("run_id"), "source_folder": str(record.folder),
                "updated": dt.datetime.now().isoformat(timespec="seconds"), "outputs_fingerprints": record.outputs}
        (partial / "baseline.json").write_text(json.dumps(made, indent=2) + "\n")

    try:
        return write_folder(baseline_dir, fill, replace=True)
    except OSError as err:
        raise DsparkError(f"cannot write baseline {str(baseline_dir)!r}: {err.strerror or err}") from None


def write_report(path: Path, text: str) -> Path:
    """The Markdown report, with a line saying when, by which commit and on which machine."""
    made = provenance()
    commit = made["environment"].get("git_commit") or "unknown commit"
    footer = f"\n_Made {made['created']} by dspark-bench {commit} on {describe_machine(made['environment'])}._\n"
    return write_text(path, text + footer)

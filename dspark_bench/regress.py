"""Compare a run against a stored baseline, with tolerances: the CI regression verdict.

A baseline is a copy of a run folder's run.json, summary.json and samples.parquet (usually
`results/baselines/<name>/`). Two runs are compared only when they measured the same thing:
same model weights, prompts, policies and generation settings, dtype and device type;
otherwise the comparison is refused, never made quietly.

What is compared, per configuration:
- the policy metrics (avg_draft_len, acceptance_rate, block_acceptance_rate, tokens_per_round,
  identical_to_baseline): deterministic for a fixed pair, prompts and config, so they must
  match within a tight relative tolerance;
- the generated ids (their fingerprint), exactly, where outputs are deterministic (greedy
  verification in float32);
- the speedup, as a ratio current / baseline with a wide tolerance: wall-clock time is noisy,
  so a slower run is flagged rather than failed unless asked (`strict_speed`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from dspark_bench.errors import DsparkError
from dspark_bench.results import SCHEMA_VERSION, check_writable, describe_machine, read_json

# The files a baseline keeps; samples.parquet is needed for the outputs' fingerprint.
BASELINE_FILES = ("run.json", "summary.json", "samples.parquet")
DETERMINISTIC_METRICS = ("tokens_per_round", "acceptance_rate", "avg_draft_len", "block_acceptance_rate")
SUMMARY_KEYS = ("config_id", "config_label", *DETERMINISTIC_METRICS, "speedup")
RUN_KEYS = {"configs": (), "settings": (), "models": ("target", "draft", "target_fingerprint", "draft_fingerprint",
                                                      "device", "dtype"), "prompts": ("count", "fingerprint")}
SAMPLE_COLUMNS = ("prompt_id", "turn", "config_id", "output_ids")
# Settings that change what is generated; repeats, warm-up and tracing only change timing.
OUTPUT_SETTINGS = ("chat_template", "turns", "ignore_eos")
DEFAULT_TOLERANCE = 1e-6
DEFAULT_SPEED_TOLERANCE = 0.25


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
    try:
        samples = pd.read_parquet(path, columns=list(SAMPLE_COLUMNS))
    except Exception as err:  # pyarrow raises many types for a bad file; all mean "unreadable"
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DsparkError(f"{what} {str(path)!r} cannot be read: {reason}") from None
    return samples


def load_record(folder: Path, what: str = "run") -> RunRecord:
    """Read and check run.json, summary.json and samples.parquet of a run folder or baseline."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DsparkError(f"{what} folder {str(folder)!r} does not exist")
    summary_file, run_file = folder / "summary.json", folder / "run.json"
    summary = _check_schema(read_json(summary_file, f"{what} summary"), f"{what} summary", summary_file)
    _check_summary_keys(summary, summary_file, f"{what} summary")
    run = _check_schema(read_json(run_file, f"{what} run file"), f"{what} run file", run_file)
    _check_run_keys(run, run_file, f"{what} run file")
    samples = _read_samples(folder / "samples.parquet", f"{what} samples")
    outputs = {int(config_id): outputs_fingerprint(group) for config_id, group in samples.groupby("config_id")}
    return RunRecord(folder, run, summary, outputs)


def load_baseline(path: Path) -> RunRecord:
    """A baseline from its summary.json (run.json and samples.parquet lie beside it)."""
    path = summary_path(path)
    if not path.is_file():
        raise DsparkError(f"baseline summary {str(path)!r} does not exist")
    return load_record(path.parent, "baseline")


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


def comparable(baseline_run: dict, current_run: dict) -> list[str]:
    """Reasons a comparison of two run.json's would be meaningless; empty when it is sound."""
    reasons = []

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
    old_configs, new_configs = baseline_run["configs"], current_run["configs"]
    # Named on their own: the generation settings most likely to be changed by hand.
    for key in ("max_new_tokens", "temperature"):
        differs(key, [c.get(key) for c in old_configs], [c.get(key) for c in new_configs])
    strip = lambda configs: [{k: v for k, v in c.items() if k not in ("max_new_tokens", "temperature")} for c in configs]
    reasons += _config_differences(strip(old_configs), strip(new_configs))
    defaults = dataclasses.asdict(_settings({}))  # a run made before a setting existed ran with its default
    for key in OUTPUT_SETTINGS:
        differs(f"setting {key}", baseline_run["settings"].get(key, defaults[key]),
                current_run["settings"].get(key, defaults[key]))
    return reasons


# ---------------------------------------------------------------------------------------------
# Comparison


@dataclass(frozen=True)
class Row:
    config: str  # the config's label
    metric: str
    baseline: float | str | None
    current: float | str | None
    change: str
    verdict: str  # "pass" | "fail" | "flag"


@dataclass
class Comparison:
    rows: list[Row]
    baseline: str = ""  # how the two runs are named in the report
    current: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(row.verdict == "fail" for row in self.rows)

    @property
    def flagged(self) -> bool:
        return any(row.verdict == "flag" for row in self.rows)

    def verdict(self) -> str:
        counts = {v: sum(row.verdict == v for row in self.rows) for v in ("pass", "fail", "flag")}
        word = "FAIL" if self.failed else "PASS"
        detail = f"{counts['pass']} passed, {counts['fail']} failed, {counts['flag']} flagged"
        if self.failed:
            return f"**Verdict: {word}** — a deterministic metric or output changed ({detail})."
        if self.flagged:
            return f"**Verdict: {word}** — metrics unchanged; speed flagged for a look ({detail})."
        return f"**Verdict: {word}** — metrics unchanged ({detail})."

    def markdown(self) -> str:
        lines = ["## dspark-bench regression check", ""]
        if self.baseline or self.current:
            lines += [f"Baseline {self.baseline} · current {self.current}", ""]
        lines += ["| config | metric | baseline | current | change | verdict |", "|---|---|---:|---:|---:|---|"]
        for row in self.rows:
            cells = [row.config, f"`{row.metric}`", _cell(row.baseline), _cell(row.current), row.change, row.verdict]
            lines.append("| " + " | ".join(cells) + " |")
        lines += [""] + [f"- {note}" for note in self.notes] + ([""] if self.notes else []) + [self.verdict()]
        return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)


def _number(value) -> float:
    return float("nan") if value is None else float(value)


def metric_row(label: str, metric: str, old, new, tolerance: float) -> Row:
    """A deterministic metric: equal within a relative tolerance (NaN equals NaN: nothing drafted)."""
    old, new = _number(old), _number(new)
    if math.isnan(old) or math.isnan(new):
        same = math.isnan(old) and math.isnan(new)
        return Row(label, metric, old, new, "" if same else "changed", "pass" if same else "fail")
    same = math.isclose(new, old, rel_tol=tolerance, abs_tol=tolerance * 1e-6)
    change = f"{(new - old) / abs(old):+.2%}" if old else f"{new - old:+.6g}"
    return Row(label, metric, old, new, change, "pass" if same else "fail")


def speed_row(label: str, old, new, speed_tolerance: float, strict_speed: bool) -> Row:
    """Speedup as a ratio current / baseline; too slow is flagged (failed when strict)."""
    old, new = _number(old), _number(new)
    ratio = new / old if old and not math.isnan(old) else float("nan")
    slow = not ratio >= 1.0 - speed_tolerance  # NaN counts as slow: nothing sound to compare
    verdict = ("fail" if strict_speed else "flag") if slow else "pass"
    return Row(label, "speedup", old, new, f"×{ratio:.3f}", verdict)


def fingerprint_row(label: str, old: str | None, new: str | None) -> Row:
    same = old is not None and old == new
    return Row(label, "outputs_fingerprint", old, new, "same" if same else "differs", "pass" if same else "fail")


def outputs_deterministic(run: dict, config: dict) -> bool:
    # Greedy in float32 gives the same ids on any machine; bf16/fp16 rounding may not.
    return float(config.get("temperature", 0.0)) == 0.0 and run["models"]["dtype"] == "float32"


def compare(
    baseline: RunRecord,
    current: RunRecord,
    tolerance: float = DEFAULT_TOLERANCE,
    speed_tolerance: float = DEFAULT_SPEED_TOLERANCE,
    strict_speed: bool = False,
) -> Comparison:
    """Every check of `current` against `baseline`, per configuration (runs must be comparable)."""
    rows = []
    old_rows, new_rows = baseline.configs, current.configs
    for config_id, config in enumerate(baseline.run["configs"]):
        old = old_rows.get(config_id)
        new = new_rows.get(config_id)
        label = (old or new or {}).get("config_label", f"config {config_id}")
        if old is None or new is None:
            side = "baseline" if old is None else "current run"
            rows.append(Row(label, "summary", None, None, f"missing in {side}", "fail"))
            continue
        for metric in DETERMINISTIC_METRICS:
            rows.append(metric_row(label, metric, old[metric], new[metric], tolerance))
        # Lossless decoding: the share of outputs equal to the target's own must not move.
        if old.get("identical_to_baseline") is not None or new.get("identical_to_baseline") is not None:
            rows.append(metric_row(label, "identical_to_baseline", old.get("identical_to_baseline"),
                                   new.get("identical_to_baseline"), tolerance))
        if outputs_deterministic(baseline.run, config):
            rows.append(fingerprint_row(label, baseline.outputs.get(config_id), current.outputs.get(config_id)))
        rows.append(speed_row(label, old["speedup"], new["speedup"], speed_tolerance, strict_speed))
    notes = [f"tolerance {tolerance:g} (relative) on policy metrics; speedup (seconds per token, baseline over "
             f"speculative) below {1 - speed_tolerance:.2f}× the baseline's is "
             f"{'a failure' if strict_speed else 'flagged'}"]
    suspect = machine_note(baseline.run, current.run, speed_moved=any(
        row.metric == "speedup" and row.verdict != "pass" for row in rows))
    if suspect:
        notes.insert(0, suspect)
    if current.run["settings"].get("ignore_eos"):
        notes.append("timed with EOS ignored: every sequence is exactly max_new_tokens long")
    return Comparison(rows, baseline.describe(), current.describe(), notes)


# What a different machine changes: the speed, never the policy metrics.
MACHINE_KEYS = ("cpu", "cpu_cores", "torch_threads", "blas", "gpu")


def machine_note(baseline_run: dict, current_run: dict, speed_moved: bool) -> str | None:
    """Name a machine change as the first suspect when speed moved (and say when machines differ)."""
    old = (baseline_run.get("environment") or {}).get("machine")
    new = (current_run.get("environment") or {}).get("machine")
    if old is None:
        return ("speed moved, and the baseline does not record its machine (made before dspark-bench kept one): "
                "suspect a different machine first" if speed_moved else None)
    changed = [key for key in MACHINE_KEYS if old.get(key) != (new or {}).get(key)]
    if not changed:
        return "same machine as the baseline: a speed change is the code's, or noise" if speed_moved else None
    where = (f"baseline {describe_machine(baseline_run['environment'])}; "
             f"current {describe_machine(current_run.get('environment') or {})}")
    if speed_moved:
        return f"first suspect: the machine changed ({', '.join(changed)}: {where})"
    return f"the machine changed ({', '.join(changed)}: {where}); speed compared anyway"


# ---------------------------------------------------------------------------------------------
# Re-running a baseline


def _is_shipped(name: str) -> bool:
    # A baseline made with the reference pair records its install path, which is another
    # machine's in CI; the fingerprints prove the weights are the same ones.
    parts = Path(name).parts
    return any(parts[i : i + 3] == ("dspark_bench", "reference", "weights") for i in range(len(parts)))


def model_names(models: dict) -> tuple[str | None, str | None]:
    """What to load the baseline's pair by: (None, None) means the shipped reference pair."""
    if _is_shipped(models["target"]) and _is_shipped(models["draft"]):
        return None, None
    return models["target"], models["draft"]


def baseline_prompts(prompts: dict):
    """The baseline's prompts (same task and limit, or same dataset) and their source record."""
    from dspark_bench.tasks import get_task, load_dataset_prompts, load_task

    count = int(prompts["count"])
    if prompts.get("task"):
        spec = get_task(prompts["task"])
        source = {"task": spec.name, "task_version": spec.version, "domain": spec.domain}
        return load_task(spec.name, count), source
    if prompts.get("dataset"):
        split = prompts.get("split", "train")
        return load_dataset_prompts(prompts["dataset"], split, limit=count), {"dataset": prompts["dataset"], "split": split}
    raise DsparkError("the baseline's run.json names neither a task nor a dataset, so it cannot be re-run")


def _settings(values: dict):
    from dspark_bench.runner import RunnerSettings

    known = {f.name for f in dataclasses.fields(RunnerSettings)}
    return RunnerSettings(**{k: v for k, v in values.items() if k in known})


@dataclass
class Rerun:
    """Everything needed to run a baseline's benchmark again, checked against the baseline."""

    pair: object  # models.ModelPair
    prompts: list
    configs: list
    settings: object  # runner.RunnerSettings
    source: dict  # where the prompts came from, as run.json records it

    @property
    def samples(self) -> int:
        from dspark_bench.runner import planned_samples

        return planned_samples(self.prompts, self.configs, self.settings)


def plan_rerun(baseline: RunRecord) -> Rerun:
    """Load the baseline's models, prompts and configs; refuse (NotComparable) if they are not its.

    Checked before anything is decoded, so a changed model or prompt set costs seconds, not a run.
    """
    from dspark_bench.config import from_dict
    from dspark_bench.models import load_pair
    from dspark_bench.prompts import prompts_fingerprint

    info = baseline.run
    configs = [from_dict(c) for c in info["configs"]]
    settings = _settings(info["settings"])
    prompts, source = baseline_prompts(info["prompts"])
    target, draft = model_names(info["models"])
    pair = load_pair(target, draft, _device_type(info["models"]), info["models"]["dtype"])
    planned = {"schema_version": SCHEMA_VERSION, "configs": [c.to_dict() for c in configs],
               "settings": dataclasses.asdict(settings), "models": pair.describe(),
               "prompts": {"count": len(prompts), "fingerprint": prompts_fingerprint(prompts)}}
    reasons = comparable(info, planned)
    if reasons:
        raise NotComparable(reasons)
    return Rerun(pair, prompts, configs, settings, source)


def rerun(baseline_folder: Path, out: Path, progress: Callable[[], None] | None = None, plan: Rerun | None = None) -> Path:
    """Run the benchmark a baseline describes again; returns the new run folder under `out`."""
    from dspark_bench.runner import run_to_folder

    check_writable(out)
    plan = plan or plan_rerun(load_record(Path(baseline_folder), "baseline"))
    folder, _ = run_to_folder(plan.pair, plan.prompts, plan.configs, out, plan.settings, plan.source, progress)
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
    parent = check_writable(baseline_dir.parent)
    token = uuid.uuid4().hex[:6]
    partial = parent / f".{baseline_dir.name}.{token}.partial"
    try:
        partial.mkdir()
        for name in BASELINE_FILES:
            shutil.copy2(record.folder / name, partial / name)
        made = {"source_run": record.run.get("run_id"), "source_folder": str(record.folder),
                "updated": dt.datetime.now().isoformat(timespec="seconds"), "outputs_fingerprints": record.outputs}
        (partial / "baseline.json").write_text(json.dumps(made, indent=2) + "\n")
        _swap_into_place(partial, baseline_dir, parent / f".{baseline_dir.name}.{token}.old")
    except OSError as err:
        raise DsparkError(f"cannot write baseline {str(baseline_dir)!r}: {err.strerror or err}") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return baseline_dir


def _swap_into_place(new: Path, final: Path, old: Path) -> None:
    # A directory cannot be renamed over a non-empty one: move the old aside first and put it
    # back if the second rename fails, so a baseline is never lost half-way.
    if not final.exists():
        os.rename(new, final)
        return
    os.rename(final, old)
    try:
        os.rename(new, final)
    except BaseException:
        os.rename(old, final)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_report(path: Path, text: str) -> Path:
    """Write the Markdown report under a temporary name, then rename it into place."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:6]}.partial")
    try:
        partial.write_text(text)
        os.replace(partial, path)
    except OSError as err:
        partial.unlink(missing_ok=True)
        raise DsparkError(f"cannot write report {str(path)!r}: {err.strerror or err}") from None
    return path

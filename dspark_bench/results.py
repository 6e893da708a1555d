"""Run folders: how results are written (atomically, never rewritten) and read back.

results/<run_id>/
  run.json         what ran: kind, configs, models and prompts with fingerprints, versions, device
  samples.parquet  one row per (prompt, config)
  rounds.parquet   per-round trace (when asked)
  summary.json     aggregate metrics per config
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import platform
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pandas as pd

from dspark_bench import __version__
from dspark_bench.errors import DsparkError, first_line

SCHEMA_VERSION = 1


def environment() -> dict:
    import optuna
    import torch
    import transformers

    return {
        "dspark_bench": __version__,
        "torch": str(torch.__version__),  # a TorchVersion: plain str for JSON and YAML
        "transformers": transformers.__version__,
        "optuna": optuna.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "git_commit": git_commit(),
        "machine": machine(),
    }


def machine() -> dict:
    """What a speed was measured on: CPU model and cores, torch threads and BLAS, and the GPU
    (name, memory, CUDA and driver versions) where there is one. Speedups do not travel between
    machines, so every result says which one it came from."""
    import torch

    info = {
        "cpu": cpu_model(),
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "blas": torch_build_setting("BLAS_INFO"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "gpu": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                       "count": torch.cuda.device_count(), "cuda": torch.version.cuda, "driver": gpu_driver()}
    return info


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def torch_build_setting(name: str) -> str | None:
    """One `NAME=value` of torch's build configuration (e.g. BLAS_INFO=mkl)."""
    import re

    import torch

    found = re.search(rf"{name}=([^,\s]+)", torch.__config__.show())
    return found.group(1) if found else None


def gpu_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def describe_machine(env: dict) -> str:
    """One line naming the machine of an environment block ("—" for results made before it was kept)."""
    info = (env or {}).get("machine")
    if not info:
        return "—"
    text = f"{info.get('cpu', '?')} · {info.get('cpu_cores', '?')} cores · {info.get('torch_threads', '?')} threads"
    if info.get("blas"):
        text += f" · {info['blas']}"
    gpu = info.get("gpu")
    if gpu:
        text += f" · {gpu['name']} {gpu.get('memory_gib', '?')} GiB, CUDA {gpu.get('cuda')}, driver {gpu.get('driver')}"
    return text


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _to_json(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n"


def cache_dir(name: str, variable: str) -> Path:
    """A cache of ours: $variable if set, else ~/.cache/dspark-bench/<name> (under XDG_CACHE_HOME)."""
    if os.environ.get(variable):
        return Path(os.environ[variable])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dspark-bench" / name


def check_writable(root: Path) -> Path:
    """Fail before any work is done if results cannot be written under `root`."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".write-check-"):
            pass
    except OSError as err:
        raise DsparkError(f"output folder {str(root)!r} is not writable: {err.strerror or err}") from None
    return root


def atomic_write(path: Path, write) -> Path:
    """The one way a file is written: `write(partial_path)` fills a hidden temporary beside
    `path`, which is then renamed over it, so a reader (or a crash) never sees half a file."""
    path = Path(path)
    partial = path.with_name(f".{path.stem}.{uuid.uuid4().hex[:8]}.partial{path.suffix}")
    try:
        write(partial)
        os.replace(partial, path)
    except OSError as err:
        raise DsparkError(f"cannot write {str(path)!r}: {err.strerror or err}") from None
    finally:
        partial.unlink(missing_ok=True)
    return path


def write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda partial: partial.write_text(text, encoding="utf-8"))


def write_bytes(path: Path, data: bytes) -> Path:
    return atomic_write(path, lambda partial: partial.write_bytes(data))


def write_json(path: Path, data: dict) -> Path:
    return write_text(path, _to_json(data))


def write_parquet(path: Path, table: pd.DataFrame) -> Path:
    return atomic_write(path, lambda partial: table.to_parquet(partial, index=False))


def provenance() -> dict:
    """What every artifact says about how it was made: when, and with what (versions, git
    commit, machine). The config that made it is the artifact's own business to add."""
    return {"created": dt.datetime.now().isoformat(timespec="seconds"), "environment": environment()}


def new_run_id(kind: str) -> str:
    return f"{dt.datetime.now():%Y%m%d-%H%M%S}-{kind}-{uuid.uuid4().hex[:6]}"




def write_run(
    root: Path,
    kind: str,
    run_info: dict,
    summary: dict,
    tables: dict[str, pd.DataFrame | None],
    run_id: str | None = None,
) -> Path:
    """Write a complete run folder under a temporary name, then rename it into place.

    A crash leaves at most a hidden `.partial` folder; an existing run is never touched.
    """
    root = check_writable(root)
    run_id = run_id or new_run_id(kind)
    final = root / run_id
    if final.exists():
        raise DsparkError(f"run folder {str(final)!r} already exists; results are never rewritten")

    def fill(partial: Path) -> None:
        info = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "kind": kind, **provenance(), **run_info}
        (partial / "run.json").write_text(_to_json(info))
        for name, table in tables.items():
            if table is not None:
                table.to_parquet(partial / f"{name}.parquet", index=False)
        (partial / "summary.json").write_text(_to_json({"schema_version": SCHEMA_VERSION, **summary}))

    return write_folder(final, fill)


def write_folder(final: Path, fill, replace: bool = False) -> Path:
    """The one way a folder is written: `fill(partial)` fills a hidden folder beside `final`,
    which is renamed into place only when complete, so a crash leaves at most a `.partial` folder.

    An existing `final` is kept (FileExistsError) unless `replace`: then it is moved aside first
    (a folder cannot be renamed over a non-empty one) and put back if the swap fails, so the old
    one is never lost half-way.
    """
    final = Path(final)
    token = uuid.uuid4().hex[:8]
    partial, old = (final.with_name(f".{final.name}.{token}.{what}") for what in ("partial", "old"))
    partial.mkdir(parents=True)
    try:
        fill(partial)
        if final.exists():
            if not replace:
                raise FileExistsError(errno.EEXIST, "already exists", str(final))
            os.rename(final, old)
            try:
                os.rename(partial, final)
            except BaseException:
                os.rename(old, final)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(partial, final)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return final


def read_json(path: Path, what: str) -> dict:
    path = Path(path)
    if not path.is_file():
        raise DsparkError(f"{what} {str(path)!r} does not exist")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DsparkError(f"{what} {str(path)!r} is not valid JSON: {err}") from None


def read_parquet(path: Path, what: str = "table", columns: list[str] | None = None) -> pd.DataFrame:
    """A Parquet table of a run folder; a corrupt or unreadable one is one clear error."""
    try:
        return pd.read_parquet(path, columns=columns)
    except Exception as err:  # pyarrow raises many types for a bad file; all mean "unreadable"
        raise DsparkError(f"{what} {str(path)!r} cannot be read: {first_line(err)}") from None


def read_run(folder: Path) -> tuple[dict, pd.DataFrame]:
    """run.json and samples.parquet of one run folder."""
    folder = Path(folder)
    if not (folder / "run.json").is_file():
        raise DsparkError(f"{str(folder)!r} is not a run folder (no run.json)")
    info = read_json(folder / "run.json", "run file")
    samples_path = folder / "samples.parquet"
    samples = read_parquet(samples_path, "samples") if samples_path.is_file() else pd.DataFrame()
    return info, samples


def evaluation_of(info: dict) -> str:
    """How a sweep evaluated its policies (replay | real), as its run.json or summary.json says:
    `evaluation`, or `engine` in a folder written before the word changed; a run's is real."""
    return info.get("evaluation", info.get("engine", "real"))


def _run_columns(info: dict) -> dict:
    """What identifies a run in a merged table: its id, kind, task and models."""
    prompts, models = info.get("prompts", {}), info.get("models", {})
    return {
        "run_id": info.get("run_id"), "kind": info.get("kind"), "evaluation": evaluation_of(info),
        "study": info.get("study"), "task": prompts.get("task") or prompts.get("dataset"),
        "domain": prompts.get("domain"), "target": models.get("target"), "draft": models.get("draft"),
        "device": models.get("device"), "dtype": models.get("dtype"),
    }


def _policy_table(folder: Path, info: dict) -> pd.DataFrame:
    if (folder / "trials.parquet").is_file():  # a sweep: one row per trial / simulated policy
        table = read_parquet(folder / "trials.parquet", "trials")
        for name, value in info.get("base_config", {}).items():
            if name not in table:  # knobs the sweep did not search keep their base value
                table[name] = value
        return table
    summary = read_json(folder / "summary.json", "summary file") if (folder / "summary.json").is_file() else {}
    return pd.DataFrame(summary.get("configs", []))


def load(paths) -> pd.DataFrame:
    """Trials (sweeps) or configurations (runs) of one or more run folders, one row each.

    Folders of several workers on one study repeat its trials; each trial is kept once, in its
    latest state: a worker that finished first wrote the others' trials still running.
    """
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise DsparkError("no run folder given")
    frames = []
    for path in paths:
        folder = Path(path)
        info = read_json(folder / "run.json", "run file") if (folder / "run.json").is_file() else None
        if info is None:
            raise DsparkError(f"{str(folder)!r} is not a run folder (no run.json)")
        table = _policy_table(folder, info)
        for name, value in _run_columns(info).items():
            table[name] = value
        frames.append(table)
    merged = pd.concat(frames, ignore_index=True)
    if "trial" in merged:
        # A trial's state only moves forward: WAITING, RUNNING, then finished.
        progress = merged["state"].map({"WAITING": 0, "RUNNING": 1}).fillna(2) if "state" in merged else 0
        order = merged.assign(_progress=progress).sort_values("_progress", ascending=False, kind="stable").index
        shared = merged["study"].notna() & merged["trial"].notna()
        repeated = merged.loc[order][shared.loc[order]].duplicated(subset=["study", "trial"], keep="first")
        merged = merged.drop(index=repeated[repeated].index).reset_index(drop=True)
    return merged


def load_table(paths, name: str) -> pd.DataFrame:
    """samples or rounds of one or more run folders, with their run_id (empty if none has it)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    frames = []
    for path in paths:
        file = Path(path) / f"{name}.parquet"
        if file.is_file():
            frames.append(read_parquet(file, name).assign(run_id=Path(path).name))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

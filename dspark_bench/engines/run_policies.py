"""A run or sweep folder's policies as an export reads them: its best policy at each batch size
(measured where it was, else replay's), the record and cost model that replay them, and whose
prices those are (`run_policies`); with `--controller`, an engine controller's tuned policy at each
batch size in place of the best (`with_controller`)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dspark_bench import objectives, schedules
from dspark_bench.config import FIELDS, LEARNED, DecodeConfig, from_dict, with_defaults
from dspark_bench.decoding import learned_signal
from dspark_bench.decoding.learned_signal import FILE as LEARNED_FILE
from dspark_bench.errors import DsparkError
from dspark_bench.metrics import summarize
from dspark_bench.replay import sampled
from dspark_bench.replay.learned import with_learned
from dspark_bench.replay.record import resolve_record
from dspark_bench.results import evaluation_of, read_json


@dataclass
class RunPolicies:
    folder: Path
    info: dict
    best: dict[int, tuple[DecodeConfig, float, str]]  # B -> (policy, its speedup, measured | predicted)
    record: Path | None  # replay record, where the run has one
    cost: dict | None  # cost_model.json / cost_surface.json contents
    prices: str = ""  # whose costs those are (a sweep's summary "prices"; older sweeps: ours)

    @functools.cached_property
    def rec(self):
        """The replay record, read once (every replay of this export uses it), with the sweep's
        learned signal where a best policy reads it (only then: an older sweep's fit, or a record
        made before the signal's context features, fails in one line only where it is needed)."""
        rec = sampled.as_one(sampled.load(self.record))  # a sampled sweep's: every replicate
        if any(LEARNED in schedules.round_metrics(c)
               for c, _, _ in self.best.values()) and (self.folder / LEARNED_FILE).is_file():
            rec = with_learned(rec, learned_signal.load(str(self.folder / LEARNED_FILE)))
        return rec

    @property
    def depth(self) -> int:
        """The deepest draft the record can replay."""
        return self.rec.gamma_record


def policy_of(row: pd.Series, folder: Path) -> DecodeConfig:
    fields = FIELDS
    values = with_defaults({k: (v.item() if hasattr(v, "item") else v) for k, v in row.items() if k in fields})
    if (values["goodput_model"] and not Path(values["goodput_model"]).exists()
            and (folder / "goodput_model.json").is_file()):
        values["goodput_model"] = str(folder / "goodput_model.json")  # the sweep moved, or runs from elsewhere
    if (values["signal_model"] and not Path(values["signal_model"]).exists()
            and (folder / "learned_signal.json").is_file()):
        values["signal_model"] = str(folder / "learned_signal.json")
    return from_dict(values)


def run_policies(folder: Path) -> RunPolicies:
    """A run or sweep folder's best policy at each batch size (measured where it was)."""

    folder = Path(folder)
    if not (folder / "run.json").is_file():
        raise DsparkError(f"{str(folder)!r} is not a run folder (no run.json)")
    info = read_json(folder / "run.json", "run file")
    if (folder / "trials.parquet").is_file() and evaluation_of(info) == "replay":
        table = pd.read_parquet(folder / "trials.parquet")
    elif (folder / "samples.parquet").is_file():
        samples = pd.read_parquet(folder / "samples.parquet")
        fields = [c for c in FIELDS if c in samples]
        policies = samples.groupby("config_id", sort=True)[fields].first().reset_index()
        measured = summarize(samples)
        if "speedup" not in measured:
            raise DsparkError(f"{folder} has no best policy: its samples carry no measured speedup")
        table = policies.merge(measured[["config_id", "speedup"]], on="config_id")
    else:
        raise DsparkError(f"{folder} has no results to export (no trials.parquet or samples.parquet)")
    if "drafter" in table:  # engines' own n-gram and Medusa drafters have other knobs: not mapped here
        others = sorted(set(table["drafter"]) - {"model"})
        table = table[table["drafter"] == "model"]
        if table.empty:
            raise DsparkError(f"export writes draft-model policies; {folder} holds {' and '.join(others)} drafter "
                              "policies only")
    best = best_by_batch(table, folder)
    if not best:
        raise DsparkError(f"{folder} has no best policy (no measured or predicted speedup)")
    summary = read_json(folder / "summary.json", "summary file") if (folder / "summary.json").is_file() else {}
    record = resolve_record(folder, summary["record"]) if summary.get("record") else None
    cost = None
    for name in ("cost_surface.json", "cost_model.json"):
        if (folder / name).is_file():
            cost = {"kind": name, **read_json(folder / name, "cost file")}
            break
    prices = (summary.get("prices") or {}).get("label", "our decoder") if cost else ""
    return RunPolicies(folder, info, best, record, cost, prices)


def with_controller(run: RunPolicies, fmt: str) -> RunPolicies:
    """`run` with each batch size's best replaced by the best policy of `fmt`'s own draft-length
    controller there (`export --controller`: a sweep that searched it, `--schedule sglang-adaptive`,
    `trtllm-schedule` or `vllm-adaptive`); refused in one line where the engine has none or the run never ran it."""
    own = [name for name in schedules.names(controlled=True) if fmt in schedules.named(name).engines]
    if not own:
        raise DsparkError(f"--controller: {fmt} has no draft-length controller this tool replays (SGLang's "
                          f"{schedules.SGLANG_ADAPTIVE}, TensorRT-LLM's {schedules.TRTLLM_SCHEDULE}, vLLM's "
                          f"{schedules.VLLM_ADAPTIVE})")
    path = run.folder / "trials.parquet"
    table = pd.read_parquet(path) if path.is_file() else pd.DataFrame(columns=["schedule"])
    table = table[table["schedule"].isin(own)]
    if table.empty:
        raise DsparkError(f"--controller: {run.folder.name} replayed no {own[0]} policy; sweep with "
                          f"--schedule {own[0]}")
    return dataclasses.replace(run, best=best_by_batch(table, run.folder))


def best_by_batch(table: pd.DataFrame, folder: Path) -> dict[int, tuple[DecodeConfig, float, str]]:
    """The best row of `table` at each batch size: B -> (policy, speedup, "measured" | "predicted"),
    measured where any row at B was."""
    best = {}
    for batch_size, rows in table.groupby("batch_size" if "batch_size" in table else np.ones(len(table), int)):
        measured = rows[rows["speedup"].notna()] if "speedup" in rows else rows.iloc[:0]
        column, rows = ("speedup", measured) if len(measured) else ("predicted_speedup", rows)
        if column not in rows or rows[column].isna().all():
            continue
        top = objectives.best(rows, "speedup", column)
        best[int(batch_size)] = (policy_of(top, folder), float(top[column]),
                                 "measured" if column == "speedup" else "predicted")
    return best

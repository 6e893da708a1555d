"""A finished replay sweep studied: what any stopping rule could win, how well each signal predicts
acceptance, how good a signal the rules would need. Run on request (`dspark-bench analyze SWEEP`,
`sweep --analyze`); the result is the sweep folder's analysis.json, which the report reads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dspark_bench.analysis.oracle import headroom
from dspark_bench.analysis.signal_headroom import signal_headroom, summary_rows
from dspark_bench.analysis.signal_quality import signal_quality
from dspark_bench.config import LEARNED
from dspark_bench.decoding.learned_signal import FILE as LEARNED_FILE
from dspark_bench.decoding.learned_signal import LearnedSignal
from dspark_bench.errors import DsparkError
from dspark_bench.replay.cost import CostModel, CostSurface
from dspark_bench.replay.learned import with_learned
from dspark_bench.replay.record import Record, resolve_record
from dspark_bench.results import evaluation_of, read_json, read_parquet, write_json

FILE = "analysis.json"


@dataclass
class Studied:
    """What an analysis reads: a sweep's replayed table, the draft model's record (with the
    learned signal at every rollout step, where the sweep fitted one) and the prices it replayed under."""

    table: pd.DataFrame
    record: Record
    cost: CostModel
    surface: CostSurface | None  # None at batch size 1 only


def analyze(studied: Studied, progress=None) -> dict:
    """The three studies of one record, as analysis.json holds them."""
    table, rec, cost, surface = studied.table, studied.record, studied.cost, studied.surface
    batch_sizes = sorted({int(b) for b in table["batch_size"]})
    gamma = int(table["gamma_max"].max())
    return {
        # Per batch size (and layout): fixed γ, the best scheduled policy and the oracle, all predicted,
        # and the share of the oracle's gain over fixed γ the best captures (oracle.py).
        "headroom": headroom(table, rec, cost, surface),
        # Per signal (the raw metrics and `learned`): AUC, Brier and ECE, held out by prompt (signal_quality.py).
        "signals": signal_quality(rec),
        # Per better signal and batch size: its AUC and the share of the oracle's gain the best
        # per-row rule on it captures (signal_headroom.py); none without a learned signal.
        "signal_headroom": summary_rows(signal_headroom(rec, cost, surface, batch_sizes, gamma, progress=progress))
        if LEARNED in rec.confidences else [],
    }


def load_studied(folder: Path) -> Studied:
    """A replay sweep folder's table, record and prices; one line where any is missing."""
    folder = Path(folder)
    summary = read_json(folder / "summary.json", "summary file")
    if evaluation_of(summary) != "replay":
        raise DsparkError(f"{folder} is not a replay sweep: an analysis studies a replay record")
    if summary.get("sampling"):
        raise DsparkError(f"{folder} replayed sampled paths: the analyses (the oracle's headroom, each signal's "
                          "quality) study greedy records; sweep at temperature 0 for them")
    table = read_parquet(folder / "trials.parquet", "replay table")
    table = table[table["drafter"] == "model"] if "drafter" in table else table
    if table.empty:
        raise DsparkError(f"{folder} replayed no draft-model policies: the analyses study the draft model's record")
    record_dir = resolve_record(folder, summary["record"])
    if record_dir is None:
        raise DsparkError(f"the replay record {summary['record']} of {folder} is gone: "
                          "run the sweep again to record it")
    rec = Record.load(record_dir)
    if (folder / LEARNED_FILE).is_file():
        rec = with_learned(rec, LearnedSignal.from_dict(read_json(folder / LEARNED_FILE, "learned signal")))
    surface = None
    if (table["batch_size"] > 1).any():
        surface = CostSurface.from_dict(read_json(folder / "cost_surface.json", "cost surface"))
    return Studied(table, rec, CostModel.from_dict(summary["cost_model"]), surface)


def analyze_folder(folder: Path, progress=None) -> dict:
    """Analyse a finished replay sweep and write its analysis.json (a new file; nothing else is touched)."""
    result = analyze(load_studied(folder), progress)
    write_json(Path(folder) / FILE, result)
    return result

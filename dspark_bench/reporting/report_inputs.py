"""What a report draws on: one or more run folders read into policies, samples and rounds,
and which of their rows is "best" (by the runs' own objective, through objectives.rank)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dspark_bench.config import FIELDS
from dspark_bench.errors import DsparkError
from dspark_bench.objectives import ranking_column
from dspark_bench.replay import cost_file
from dspark_bench.replay.cost import CostModel
from dspark_bench.reporting import plots
from dspark_bench.reporting.batch_sizes import has_batch_sizes
from dspark_bench.results import load, load_table, read_json
from dspark_bench.sections import registry
from dspark_bench.sections.analyses import Analyses
from dspark_bench.sections.base import ReportView

SUMMARY_METRICS = ("tokens_per_round", "acceptance_rate", "avg_draft_len", "block_acceptance_rate",
                   "accepted_per_round")
KNOBS = tuple(FIELDS)


# --- inputs ------------------------------------------------------------------------------------


class Skip(Exception):
    """A figure whose data is absent; its message goes into report.md."""


@dataclass
class Inputs:
    folders: list[Path]
    infos: dict[str, dict]  # run_id -> run.json
    summaries: dict[str, dict]  # run_id -> summary.json
    policies: pd.DataFrame  # one row per configuration / trial / simulated policy
    samples: pd.DataFrame
    rounds: pd.DataFrame
    objective: str = "speedup"  # what the runs optimised (a sweep's own objective), objectives.OBJECTIVES
    column: str = "speedup"  # the column "best" is read from: measured where any was, else predicted
    folder_of: dict[str, Path] = field(default_factory=dict)
    # A sweep over batch sizes: every B's policies (the batch-size section); `policies` and
    # `samples` above then hold the smallest B's only, so every other figure compares like with like.
    batched: pd.DataFrame | None = None

    @property
    def batch_size(self) -> int | None:
        return int(self.policies["batch_size"].min()) if self.batched is not None else None


def load_inputs(paths) -> Inputs:
    """Everything the report draws on, from one or more run folders."""
    folders = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    policies = load(folders)  # refuses a folder without run.json
    infos, summaries, folder_of = {}, {}, {}
    for folder in folders:
        info = read_json(folder / "run.json", "run file")
        run_id = info.get("run_id") or folder.name
        infos[run_id], folder_of[run_id] = info, folder
        summary_path = folder / "summary.json"
        summary = read_json(summary_path, "summary file") if summary_path.is_file() else {}
        # A sweep's analyses (analysis/: headroom, signals, signal_headroom) where they were run;
        # a sweep made before they had their own file holds them in its summary.
        analysis = folder / Analyses.FILE
        summaries[run_id] = {**summary, **(read_json(analysis, "analysis file") if analysis.is_file() else {})}
    policies = _with_knobs(policies, infos)
    renamed = {folder.name: run_id for run_id, folder in folder_of.items()}
    samples, rounds = (load_table(folders, name) for name in ("samples", "rounds"))
    for table in (samples, rounds):
        if not table.empty:
            table["run_id"] = table["run_id"].map(lambda name: renamed.get(name, name))
            table["task"] = table["run_id"].map(lambda r: (infos[r].get("prompts") or {}).get("task")
                                                or (infos[r].get("prompts") or {}).get("dataset"))
    if policies.empty or not any(c in policies for c in ("speedup", "predicted_speedup", "tokens_per_round")):
        raise DsparkError("the run folder(s) hold no measured or simulated configuration to report on")
    batched = None
    if has_batch_sizes(policies):
        smallest = policies["batch_size"].min()
        batched, policies = policies, policies[policies["batch_size"] == smallest]
        samples = samples[samples["batch_size"] == smallest] if "batch_size" in samples else samples
    objective = run_objective(infos)
    column = ranking_column(policies, objective)
    if column is None:  # a table without this objective's column at all: rank what every run counts
        objective, column = "tokens_per_round", "tokens_per_round"
    return Inputs(folders, infos, summaries, policies, samples, rounds, objective, column, folder_of, batched)


def run_objective(infos: dict[str, dict]) -> str:
    """The objective the runs were made for: the first sweep's own; speedup otherwise."""
    for info in infos.values():
        names = (info.get("spec") or {}).get("objective")
        if names:
            return list(names)[0]
    return "speedup"


def _with_knobs(policies: pd.DataFrame, infos: dict) -> pd.DataFrame:
    """A run's summary rows carry only config_id and label; add the config fields from run.json."""
    policies = policies.copy()
    for knob in KNOBS:
        if knob not in policies:
            policies[knob] = None
    for index, row in policies.iterrows():
        configs = infos.get(row["run_id"], {}).get("configs") or []
        if pd.isna(row.get("metric")) and pd.notna(row.get("config_id")) and int(row["config_id"]) < len(configs):
            for knob, value in configs[int(row["config_id"])].items():
                if knob in policies:
                    policies.at[index, knob] = value
    for knob in ("threshold", "threshold_start", "threshold_end", "temperature", "top_p"):
        policies[knob] = pd.to_numeric(policies[knob], errors="coerce")
    for knob in ("gamma_max", "min_draft_len"):
        policies[knob] = pd.to_numeric(policies[knob], errors="coerce").astype("Int64")
    return policies


def best_and_classic(inputs: Inputs, policies: pd.DataFrame | None = None) -> tuple[pd.Series | None, pd.Series | None]:
    """The best confidence-scheduled and the best fixed-gamma row, by the runs' own objective."""
    policies = inputs.policies if policies is None else policies
    return (plots.best_row(policies, inputs.column, objective=inputs.objective),
            plots.best_row(policies, inputs.column, fixed=True, objective=inputs.objective))


def section_blocks(inputs: Inputs, at: str) -> list[tuple]:
    """The blocks the sweeps' sections (sections/registry.py) place at `at` in the report."""
    def policy(run_id: str, label: str) -> dict | None:
        rows = inputs.policies[(inputs.policies["run_id"] == run_id) & (inputs.policies["config_label"] == label)]
        return None if rows.empty else rows.iloc[0].to_dict()

    view = ReportView(several=len(inputs.summaries) > 1, short=plots.short_run, policy=policy)
    return registry.report_blocks(inputs.summaries, view, at)


def samples_of(inputs: Inputs, row: pd.Series | None) -> pd.DataFrame:
    """The per-prompt samples of one policy row (same run, same configuration label)."""
    if row is None or inputs.samples.empty:
        return inputs.samples.iloc[:0]
    s = inputs.samples
    return s[(s["run_id"] == row["run_id"]) & (s["config_label"] == row["config_label"])]


def engine_costs(folder: Path) -> dict:
    """{whose costs: batch-1 CostModel} a folder priced with: a sweep's prices.json (and
    prices_ours.json beside an engine's), a llama.cpp run's llama.cpp and our costs."""
    found = {}
    for name in ("prices.json", "prices_ours.json"):
        if (folder / name).is_file():
            prices = cost_file.load(folder / name)
            found[prices.label] = prices.surface.at(min(prices.surface.models))
    if (folder / "llamacpp.json").is_file():
        info = read_json(folder / "llamacpp.json", "llama.cpp result")
        if info.get("prices", {}).get("llamacpp") and Path(info["prices"]["llamacpp"]).is_file():
            prices = cost_file.load(info["prices"]["llamacpp"])
            found[prices.label] = prices.surface.at(1)
            found["our decoder"] = CostModel.from_dict(info["prices"]["ours"])
    if (folder / "priced.json").is_file():  # run --decoder hf
        info = read_json(folder / "priced.json", "priced predictions")
        if Path(info["prices"]).is_file():
            found[info["engine"]] = cost_file.load(info["prices"]).surface.at(1)
            found["our decoder"] = CostModel.from_dict(info["ours"])
    return found

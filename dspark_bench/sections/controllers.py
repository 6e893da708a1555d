"""The engines' own draft-length controllers set beside fixed γ and our best policy (a sweep whose
space holds a controlled schedule, `sweep --schedule sglang-adaptive ...`; summary.json's
`controllers`; docs/engine-controllers.md). Per batch size, each controller at its engine's
defaults and tuned (the sweep's best of it), the best fixed γ and our best policy, replayed on the
sweep's prices (measured too where the confirm stage timed them); under load the same four at each
arrival rate, from the load stage's table; and the length each of those controllers picks step by
step (controllers.parquet), which the report draws (reporting/controllers.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd

from dspark_bench import objectives, schedules
from dspark_bench.decoding import controllers
from dspark_bench.objectives import rank_under_load
from dspark_bench.replay import sampled
from dspark_bench.replay.joint_walks import walk_controlled
from dspark_bench.replay.rounds import match_lengths
from dspark_bench.replay.slots import unpriced
from dspark_bench.replay.step_prices import step_prices
from dspark_bench.results import read_parquet, write_parquet
from dspark_bench.sections.base import END, UNDER_HEADLINE, Line, OneKey, ReportView, Rows, SweepFacts, cell
from dspark_bench.sections.under_load import FILE as LOAD_FILE

FILE = "controllers.parquet"
FIXED, OURS = "best fixed γ", "our best"
SHOWN = ("config_label", "predicted_speedup", "speedup", "acceptance_rate", "avg_draft_len", "tokens_per_round")
SERVED = ("config_label", "throughput", "tpot_p50_s", "tpot_p99_s")


def roles(table: pd.DataFrame, configs: list, batch_size: int, objective: str) -> list[tuple[str, int]]:
    """(role, config_id) of the rows set side by side at one batch size: each controller of the space at
    its engine's defaults and tuned, the best fixed γ, our best policy (none where the space has none)."""
    here = table[table["batch_size"] == batch_size]
    column = objectives.get(objective).predicted or objectives.ranking_column(here, objective)
    out = []
    for name in schedules.names(controlled=True):
        own = here[here["schedule"] == name]  # (a schedule's rows by its registry name: no literal)
        if own.empty:
            continue
        tuned = int(objectives.best(own, objective, column)["config_id"])
        shipped = controllers.shipped(configs[tuned])  # (TensorRT-LLM's: no schedule nor gate, at its max_draft_len)
        out += pair_roles(name, tuned, configs.index(shipped) if shipped in configs else None)
    fixed = here[schedules.where(here, baseline=True)]
    ours = here[~schedules.where(here, baseline=True) & ~schedules.where(here, controlled=True)]
    for role, rows in ((FIXED, fixed), (OURS, ours)):
        found = objectives.best(rows, objective, column) if not rows.empty else None
        if found is not None:
            out.append((role, int(found["config_id"])))
    return out


def pair_roles(name: str, tuned: int, shipped: int | None) -> list[tuple[str, int]]:
    """A controller's rows: at its engine's defaults, then tuned (one row where tuning kept the defaults)."""
    if shipped == tuned:
        return [(f"{name} · tuned (its defaults)", tuned)]
    return ([] if shipped is None else [(f"{name} · its defaults", shipped)]) + [(f"{name} · tuned", tuned)]


def row_of(table: pd.DataFrame, config_id: int, columns=SHOWN) -> dict:
    found = table[table["config_id"] == config_id].iloc[0]
    return {k: (None if pd.isna(found[k]) else found[k].item() if hasattr(found[k], "item") else found[k])
            for k in columns if k in found}


def by_batch(facts: SweepFacts, objective: str) -> list[dict]:
    return [{"batch_size": int(b), "rows": [{"role": role, "config_id": i, **row_of(facts.table, i)}
                                            for role, i in roles(facts.table, facts.configs, int(b), objective)]}
            for b in sorted(facts.table["batch_size"].unique())]


def by_rate(facts: SweepFacts, objective: str) -> list[dict]:
    """Under load (the load stage's table, every policy at its max batch): per rate, each controller at
    its defaults and tuned (the best of it at that rate), the best fixed γ and our best, by the load objective."""
    path = facts.folder / LOAD_FILE
    if facts.max_batch is None or not path.is_file():
        return []
    load, configs = read_parquet(path), facts.configs
    kinds = {i: schedules.of(c) for i, c in enumerate(configs)}
    out = []
    for (rate, label), group in load[load["config_id"] >= 0].groupby(["arrival_rate", "arrival"], sort=True):
        rows = []
        for name in schedules.names(controlled=True):
            own = group[group["schedule"] == name]
            if own.empty:
                continue
            tuned = int(rank_under_load(own, objective).iloc[0]["config_id"])
            shipped = controllers.shipped(configs[tuned])
            shipped = configs.index(shipped) if shipped in configs else None
            rows += [{"role": role, **row_of(own, i, SERVED)}
                     for role, i in pair_roles(name, tuned, shipped if shipped in set(own["config_id"]) else None)]
        fixed = group[[kinds[i].baseline for i in group["config_id"]]]
        ours = group[[not kinds[i].baseline and not kinds[i].controlled for i in group["config_id"]]]
        rows += [{"role": role, **rank_under_load(part, objective).iloc[0][list(SERVED)].to_dict()}
                 for role, part in ((FIXED, fixed), (OURS, ours)) if not part.empty]
        out.append({"arrival": label, "arrival_rate": float(rate), "rows": rows})
    return out


def traces(facts: SweepFacts, batches: list[dict]) -> pd.DataFrame:
    """Each controller row's walk at its batch size: the length it picked at every step, the step's
    rows and mean accepted drafts (replay.joint_walks.walk_controlled)."""
    rec = sampled.as_one(facts.model_record if facts.model_record is not None else facts.record)
    matches, zeros = match_lengths(rec).astype(np.int64), np.zeros(len(rec.lengths))
    frames = []
    for batch in batches:
        for row in batch["rows"]:
            config = facts.configs[row["config_id"]]
            if not schedules.of(config).controlled:
                continue
            chosen: list = []
            walk_controlled(rec, config, step_prices(facts.surface, batch["batch_size"]), unpriced(len(zeros)), True,
                            matches, zeros,
                            zeros.copy(), zeros.copy(), chosen)
            frames.append(pd.DataFrame(chosen, columns=["rows", "length", "accepted"]).assign(
                step=np.arange(len(chosen)), batch_size=batch["batch_size"], role=row["role"],
                config_label=row["config_label"]))
    return pd.concat(frames, ignore_index=True)


def verdict(batches: list[dict]) -> str:
    """Which of the rows is predicted fastest at each batch size, in one sentence."""
    said = []
    for batch in batches:
        ranked = sorted(batch["rows"], key=lambda r: -(r.get("predicted_speedup") or 0))
        said.append(f"B={batch['batch_size']}: {ranked[0]['role']} ({ranked[0]['predicted_speedup']:.3f}× predicted)")
    return "predicted fastest at " + "; ".join(said)


@dataclass(frozen=True)
class EngineControllers(OneKey):
    """The section: per batch size and per arrival rate, the controllers (at their defaults and tuned)
    beside the best fixed γ and our best policy, and where each controller's steps are (FILE)."""

    KEYS: ClassVar[tuple[str, ...]] = ("controllers",)
    ABSENT: ClassVar[dict] = {}  # nothing where no controller was searched: earlier summaries keep their keys
    CONSOLE_AT: ClassVar[int] = UNDER_HEADLINE
    REPORT_AT: ClassVar[str] = END

    objective: str
    load_objective: str | None
    by_batch: list
    by_rate: list
    table: str
    verdict: str

    @classmethod
    def of_sweep(cls, facts: SweepFacts) -> EngineControllers | None:
        if not any(schedules.of(c).controlled for c in facts.configs):
            return None
        objective, load_objective = facts.spec.objective[0], getattr(facts.spec, "load_objective", None)
        batches = by_batch(facts, objective)
        write_parquet(facts.folder / FILE, traces(facts, batches))
        found = cls(objective, load_objective, batches, by_rate(facts, load_objective) if load_objective else [],
                    FILE, verdict(batches))
        if facts.say:
            facts.say(f"the engines' controllers: {found.verdict}")
        return found

    def console(self) -> list:
        rows = [[str(batch["batch_size"]) if i == 0 else "", r["role"], r["config_label"], cell(r["predicted_speedup"]),
                 cell(r.get("speedup")), cell(r["acceptance_rate"], 2), cell(r["avg_draft_len"], 2)]
                for batch in self.by_batch for i, r in enumerate(batch["rows"])]
        columns = ("B", "row", "policy", "predicted", "measured", "accept", "draft len")
        shown = [Rows("the engines' controllers beside fixed γ and our best (replayed)", columns, rows,
                      left=("B", "row", "policy"))]
        if self.by_rate:
            served = [[rate["arrival"] if i == 0 else "", r["role"], r["config_label"], f"{r['throughput']:.1f}",
                       f"{r['tpot_p50_s'] * 1e3:.1f} / {r['tpot_p99_s'] * 1e3:.1f}"]
                      for rate in self.by_rate for i, r in enumerate(rate["rows"])]
            shown.append(Rows(f"under load (best by {self.load_objective}): tokens/s, TPOT p50 / p99 (ms)",
                              ("load", "row", "policy", "tokens/s", "TPOT"), served, left=("load", "row", "policy")))
        return [*shown, Line(self.verdict, "bold")]

    @classmethod
    def report_blocks(cls, found: dict[str, EngineControllers], view: ReportView) -> list[tuple]:
        """The first run's four rows by batch size, and by arrival rate where it served a load."""
        if not found:
            return []
        section = next(iter(found.values()))
        rows = [[str(b["batch_size"]), r["role"], r["config_label"], cell(r["predicted_speedup"]),
                 cell(r.get("speedup")), cell(r["acceptance_rate"], 2), cell(r["avg_draft_len"], 2)]
                for b in section.by_batch for r in b["rows"]]
        blocks = [("h3", "The engines' own controllers"),
                  ("p", "Each engine controller of the sweep at its engine's defaults and tuned (the sweep's best of "
                        "it), beside the best fixed γ and our best policy, replayed at each batch size on the sweep's "
                        "prices; measured where the confirm stage timed it (docs/engine-controllers.md). "
                        f"{section.verdict[0].upper()}{section.verdict[1:]}."),
                  ("table", ["B", "row", "policy", "predicted speedup", "measured", "acceptance", "draft length"],
                   rows)]
        if section.by_rate:
            served = [[rate["arrival"], r["role"], r["config_label"], f"{r['throughput']:.1f}",
                       f"{r['tpot_p50_s'] * 1e3:.1f} / {r['tpot_p99_s'] * 1e3:.1f}"]
                      for rate in section.by_rate for r in rate["rows"]]
            blocks.append(("table", ["load", "row", "policy", "tokens/s", "TPOT p50 / p99 (ms)"], served))
        return blocks

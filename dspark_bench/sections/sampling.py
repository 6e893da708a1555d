"""Sampling precision (summary.json's `sampling`): how a sampled record was sampled (temperature,
top-p, seed, K paths, coin draws) and what its paths bought, the half-width of replay's 95 %
intervals (replay/sampled.precision); a line under the sweep's table, and the report's words in
its cost-model paragraph."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pandas as pd

from dspark_bench.replay import sampled
from dspark_bench.sections.base import END, UNDER_HEADLINE, Line, OneKey, ReportView, SweepFacts, known


@dataclass(frozen=True)
class Sampling(OneKey):
    """The section: the record's sampling (record.json's "sampling") and its precision."""

    KEYS: ClassVar[tuple[str, ...]] = ("sampling",)
    ABSENT: ClassVar[dict] = {"sampling": None}
    CONSOLE_AT: ClassVar[int] = UNDER_HEADLINE
    REPORT_AT: ClassVar[str] = END

    temperature: float
    top_p: float
    seed: int
    paths: int
    draws: int
    precision: dict | None = None  # half_width per metric, policies, sentence

    @classmethod
    def of(cls, rec, table: pd.DataFrame) -> Sampling | None:
        """How a sampled record was sampled and what its paths bought; None: greedy."""
        info = rec.info.get("sampling")
        return None if info is None else cls(**known(cls, info), precision=sampled.precision(table, info))

    @classmethod
    def of_sweep(cls, facts: SweepFacts) -> Sampling | None:
        return cls.of(facts.record, facts.table)

    def per_prompt(self) -> str:
        """The replicates in words, for a table's title."""
        return f"{self.paths} paths × {self.draws} coin draws per prompt"

    def described(self) -> str:
        """The record's sampling in words, for the report's cost-model paragraph."""
        return (f" sampled at temperature {self.temperature:g}, top-p {self.top_p:g} ({self.per_prompt()}: "
                "expectations, exact in distribution)")

    def console(self) -> list:
        return [Line(self.precision["sentence"], "dim")] if self.precision else []

    @classmethod
    def report_blocks(cls, found: dict[str, Sampling], view: ReportView) -> list[tuple]:
        return []  # said in the cost-model paragraph (reporting/text.py: described, and the precision's sentence)

"""The deployment engine's verdict (summary.json's `engine_verdict`): a sweep priced on a serving
engine's costs and confirmed in that engine (engines/llamacpp_confirm.py), its policies as measured
there and its verdict in that engine's words, said before anything of ours on the console and at the
head of the report's summary (they are what deploys)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dspark_bench.sections.base import BEFORE_TABLE, SUMMARY_HEAD, Line, OneKey, ReportView, Rows, cell


def _number(value, digits: int) -> str:
    return "—" if value is None or value != value else f"{value:.{digits}f}"


@dataclass(frozen=True)
class EngineVerdict(OneKey):
    """The section: the engine, whether speculation wins there, its best policy, the break-even,
    the verdict's sentence and every confirmed policy's row (predicted, measured with its 95 %
    interval, acceptance)."""

    KEYS: ClassVar[tuple[str, ...]] = ("engine_verdict",)
    ABSENT: ClassVar[dict] = {"engine_verdict": None}
    CONSOLE_AT: ClassVar[int] = BEFORE_TABLE
    REPORT_AT: ClassVar[str] = SUMMARY_HEAD

    engine: str
    wins: bool | None = None
    best: dict | None = None
    over_defaults: list | None = None
    break_even_acceptance: float | None = None
    break_even_gamma: int | None = None
    sentence: str = ""
    rows: list = ()
    measured_in: str = ""

    def console(self) -> list:
        rows = [[r["policy"], cell(r["predicted"]), f"{r['measured']:.3f} [{r['measured_low']:.2f}, "
                 f"{r['measured_high']:.2f}]", cell(r["acceptance_rate"], 2)] for r in self.rows]
        return [Rows(f"confirmed in {self.engine}: {self.measured_in}", ("policy", "predicted", "measured [95 % CI]",
                                                                         "accept"), rows, left=("policy",)),
                Line(self.sentence, "bold")]

    @classmethod
    def report_blocks(cls, found: dict[str, EngineVerdict], view: ReportView) -> list[tuple]:
        """That engine's verdict first, and its confirmed policies as measured there; the table
        after it is our decoder's."""
        blocks = []
        for run_id, verdict in found.items():
            rows = [[r["policy"], _number(r.get("predicted"), 3), f"{r['measured']:.3f}× [{r['measured_low']:.2f}, "
                     f"{r['measured_high']:.2f}]", _number(r.get("acceptance_rate"), 2)] for r in verdict.rows]
            where = f" ({view.short(run_id)})" if view.several else ""
            blocks += [("p", f"Confirmed in {verdict.engine}{where}: {verdict.sentence}. Measured in "
                             f"{verdict.measured_in}; the summary table below is our decoder's."),
                       ("table", ["policy", f"predicted on {verdict.engine}'s prices", "measured [95% CI]",
                                  "acceptance"], rows)]
        return blocks

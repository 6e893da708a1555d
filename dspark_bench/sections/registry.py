"""The one registration list of a sweep's sections, and how the layers above compose them: the
sweep writes their JSON into summary.json (or their own file), the console shows their rows, the
report places their blocks. A new section is one module and one entry in `SECTIONS`."""

from __future__ import annotations

from typing import Iterable

from dspark_bench.sections.analyses import Analyses
from dspark_bench.sections.base import END, Line, ReportView, Rows, Section, SweepFacts
from dspark_bench.sections.controllers import EngineControllers
from dspark_bench.sections.depth import DepthSearch
from dspark_bench.sections.engine_verdict import EngineVerdict
from dspark_bench.sections.sampling import Sampling
from dspark_bench.sections.served import ServedRun
from dspark_bench.sections.under_load import UnderLoad

# In the order the console shows them where two share a place (sections/base.py's places).
# EngineControllers after UnderLoad: it reads the load stage's table.
SECTIONS: tuple[type, ...] = (EngineVerdict, Analyses, Sampling, DepthSearch, UnderLoad, EngineControllers, ServedRun)
SUMMARY = "summary.json"
# summary.json's order for the sections' keys and the plain ones the sweep writes among them
# (sweeps written before sections existed have it); a key not named here follows them.
ORDER = ("depth_search", "depth_verdict", "prices", "engine_verdict", "continuations", "sampling", "load",
         "controllers", "load_run")


def file_of(section: type) -> str:
    return getattr(section, "FILE", SUMMARY)


def summary_json(found: Iterable[Section], **plain) -> dict:
    """What the sections written into summary.json add to it: each registered section's JSON (or
    what it writes when it has no result), and the `plain` keys among them, in `ORDER`."""
    by_type = {type(result): result for result in found}
    written = dict(plain)
    for section in SECTIONS:
        if file_of(section) == SUMMARY:
            written.update(by_type[section].to_json() if section in by_type else section.ABSENT)
    return {key: written[key] for key in sorted(written, key=lambda k: ORDER.index(k) if k in ORDER else len(ORDER))}


def computed(facts: SweepFacts) -> list:
    """Every registered section that computes itself from a finished sweep (`of_sweep`) and found something."""
    return [result for section in SECTIONS if hasattr(section, "of_sweep")
            and (result := section.of_sweep(facts)) is not None]


def read(summary: dict) -> list:
    """Every section a summary holds (summary.json with its own files' keys beside), registration order."""
    return [result for section in SECTIONS if (result := section.from_json(summary)) is not None]


def find(results: Iterable[Section], section: type):
    """The result of `section` among `results`; None where absent."""
    return next((result for result in results if isinstance(result, section)), None)


def console(results: Iterable[Section], at: int) -> list[Rows | Line]:
    """What the console shows at `at` (base.BEFORE_TABLE, …), registration order."""
    results = list(results)
    return [shown for section in SECTIONS if section.CONSOLE_AT == at
            for result in results if isinstance(result, section) for shown in result.console()]


def report_blocks(summaries: dict[str, dict], view: ReportView, at: str = END) -> list[tuple]:
    """The report's blocks placed at `at` (base.SUMMARY_HEAD, …): each section's, over the runs holding it."""
    blocks = []
    for section in SECTIONS:
        if section.REPORT_AT == at:
            found = {run_id: result for run_id, summary in summaries.items()
                     if (result := section.from_json(summary)) is not None}
            blocks += section.report_blocks(found, view) if found else []
    return blocks

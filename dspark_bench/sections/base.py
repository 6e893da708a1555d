"""What every section of a sweep's results shares: the protocol a section keeps (its typed result
read from and written to the exact JSON it owns, its console rows, its report blocks), what a
section's console rows are, and what the report hands a section's blocks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, ClassVar, Protocol

# Where the console shows a section (cli/console.print_best): before the sweep's table (what
# deploys comes first), under it, or under the headline.
BEFORE_TABLE, UNDER_TABLE, UNDER_HEADLINE = 0, 1, 2
# Where the report places a section's blocks (reporting/): at the summary's head, in its
# "By depth" part, after the drafters, or at the end of the text (before the figures).
SUMMARY_HEAD, BY_DEPTH, AFTER_DRAFTERS, END = "summary head", "by depth", "after drafters", "end"


@dataclass(frozen=True)
class Rows:
    """A titled table of pre-formatted cells (numbers right-aligned, `left` columns left)."""

    title: str
    columns: tuple[str, ...]
    rows: list[list[str]]
    left: tuple[str, ...] = ()


@dataclass(frozen=True)
class Line:
    """One line said under or above a table, in a rich style."""

    text: str
    style: str | None = None


@dataclass(frozen=True)
class ReportView:
    """What a section's report blocks may read of the report's runs, handed down by reporting/."""

    several: bool  # more than one run in the report: rows and sentences name their run
    short: Callable[[str], str]  # a run's short name (reporting.plots.short_run)
    policy: Callable[[str, str], dict | None]  # (run id, policy label) -> that policy's row, None where absent


@dataclass(frozen=True)
class SweepFacts:
    """What a replay sweep knows once its policies are confirmed, handed to every registered section
    that computes itself from it (`of_sweep`); the layers below know nothing of the sweep's types."""

    folder: Path  # the sweep folder: where a section writes its own files
    spec: object  # the sweep's spec (tuning.spec.SweepSpec)
    configs: list  # every policy replayed, in config_id order
    table: object  # the replayed (and confirmed) table, one row per policy (a DataFrame)
    record: object  # the record the summary names (the draft model's where it has one)
    model_record: object  # the draft model's record; None where the sweep has none
    surface: object  # the cost surface that priced the ranking
    max_batch: int | None = None  # under load, the rows a server decodes at once (tuning.spec.max_batch_of); else None
    say: Callable[[str], None] | None = None
    progress: Callable | None = None


def known(section: type, stored: dict) -> dict:
    """A section's stored keys that are its fields: a file written by another version may hold more."""
    names = {f.name for f in fields(section)}
    return {key: value for key, value in stored.items() if key in names}


class OneKey:
    """A section stored whole under its one key of summary.json (`KEYS[0]`): its JSON both ways."""

    @classmethod
    def from_json(cls, summary: dict):
        stored = summary.get(cls.KEYS[0])
        return cls(**known(cls, stored)) if stored else None

    def to_json(self) -> dict:
        return {self.KEYS[0]: asdict(self)}


class Section(Protocol):
    """One optional result of a sweep: a frozen dataclass that knows its JSON, its console rows and
    its report blocks. `KEYS`: the keys of summary.json (or of `FILE`) it owns; `ABSENT`: what the
    sweep writes there when the section has no result. A section the sweep does not call by
    name computes itself in `of_sweep(facts)` (a SweepFacts; None: nothing to say)."""

    KEYS: ClassVar[tuple[str, ...]]
    ABSENT: ClassVar[dict]
    CONSOLE_AT: ClassVar[int]
    REPORT_AT: ClassVar[str]

    @classmethod
    def from_json(cls, summary: dict) -> Section | None: ...

    def to_json(self) -> dict: ...

    def console(self) -> list[Rows | Line]: ...

    @classmethod
    def report_blocks(cls, found: dict, view: ReportView) -> list[tuple]: ...


def cell(value, digits: int = 3) -> str:
    """A number as a console table shows it; None or NaN: an empty cell."""
    if value is None or value != value:
        return ""
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

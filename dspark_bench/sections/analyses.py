"""A replay sweep's analyses (analysis.json, `sweep --analyze` or `dspark-bench analyze`): the
oracle's headroom, every signal's held-out quality and what better signals would capture
(analysis/); their tables on the console and the report's "Headroom" section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dspark_bench.analysis.analyze import FILE, Studied, analyze
from dspark_bench.analysis.oracle import captured_cell
from dspark_bench.analysis.signal_headroom import pivot
from dspark_bench.sections.base import AFTER_DRAFTERS, UNDER_TABLE, ReportView, Rows

HEADROOM = ("Predicted by replay on one record and cost table: the oracle knows which drafted tokens the target will "
            "accept (at batch size 1 the exact optimum over every draft length; at larger batch sizes perfect "
            "stopping, a rule that knows after each drafted token whether it will be accepted). The best scheduled "
            "policy of each kind: the per-row rules on a raw metric, the same on the learned signal, and the budget "
            "schedule, which decides for the whole batch and so can pass per-row perfect stopping. `captured` is the "
            "share of the oracle's gain over the best fixed γ that the best scheduled policy reaches: near 0, the "
            "rules' signal says little; near 100 %, little is left to tune.")
BETTER_SIGNALS = (
    "Is the gap between the best policy and the oracle the rules' or the signal's? Replay gives the rules "
    "better signals: the learned one with more evidence of each drafted token's verdict in its log-odds "
    "(logit s + β · (±1)), up to the verdict itself. Each column is one such signal, named with its AUC over "
    "the record's drafted tokens (in-sample, so the learned signal's reads higher here than held out); each "
    "cell, the share of the oracle's gain over the best fixed γ that the best threshold or cumulative rule on "
    "it captures (its cost left out, as perfect stopping's is). Where the oracle is barely over fixed γ (the "
    "padded layout at B > 1, where the longest row sets every pass) those shares are of almost nothing. Even "
    "the verdict leaves a gap at batch size 1: a rule learns a token's verdict only after drafting it, a "
    "forward the oracle never spends.")


def _number(value) -> str:
    return "—" if value is None or value != value else f"{value:.3f}"


def _speedup(row: dict, kind: str) -> str:  # a sweep made before the kinds were kept has none
    value = row.get(f"best_{kind}_speedup")
    return "—" if value is None else f"{value:.3f}"


@dataclass(frozen=True)
class Analyses:
    """The section: per batch size and layout the headroom over fixed γ (analysis/oracle.py), per
    signal its held-out AUC, Brier and ECE (signal_quality.py), per better signal the share of the
    oracle's gain it would capture (signal_headroom.py)."""

    KEYS: ClassVar[tuple[str, ...]] = ("headroom", "signals", "signal_headroom")
    ABSENT: ClassVar[dict] = {}
    FILE: ClassVar[str] = FILE  # its own file beside summary.json
    CONSOLE_AT: ClassVar[int] = UNDER_TABLE
    REPORT_AT: ClassVar[str] = AFTER_DRAFTERS

    headroom: list
    signals: list
    signal_headroom: list

    @classmethod
    def of(cls, studied: Studied, progress=None) -> Analyses:
        """The three studies of a sweep's record (analysis.analyze)."""
        return cls.read(analyze(studied, progress))

    @classmethod
    def read(cls, analysis: dict) -> Analyses:
        """analysis.json's three lists, each empty where the file has none."""
        return cls(**{key: analysis.get(key) or [] for key in cls.KEYS})

    @classmethod
    def from_json(cls, analysis: dict) -> Analyses | None:
        found = cls.read(analysis)
        return found if any(found.to_json().values()) else None

    def to_json(self) -> dict:
        return {"headroom": self.headroom, "signals": self.signals, "signal_headroom": self.signal_headroom}

    def console(self) -> list:
        """Headroom, held-out signal quality, better signals: three tables, each where it has rows."""
        headroom = [[str(r["batch_size"]), r["layout"], "1.000", f"{r['best_fixed_speedup']:.3f}",
                     *(_speedup(r, kind) for kind in ("raw", "learned", "budget")),
                     f"{r['oracle_speedup']:.3f} ({r['oracle']})", captured_cell(r["captured"])] for r in self.headroom]
        signals = [[r["signal"], f"{r['tokens']:,}", f"{r['auc']:.3f}", f"{r['brier']:.4f}", f"{r['ece']:.4f}"]
                   for r in self.signals]
        shown = [Rows("headroom (predicted): how much of the oracle's gain over fixed γ the best policy captures",
                      ("B", "layout", "autoregressive", "best fixed γ", "raw metrics", "learned", "budget", "oracle",
                       "captured"), headroom),
                 Rows("acceptance signals, held out by prompt: AUC (higher is better), Brier and ECE (lower)",
                      ("signal", "tokens", "AUC", "Brier", "ECE"), signals, left=("signal",))]
        if self.signal_headroom:
            header, body = pivot(self.signal_headroom)
            rows = [[str(b), layout, f"{gain:+.1%}", *(captured_cell(c) for c in shares)]
                    for b, layout, gain, *shares in body]
            shown.append(Rows(
                "better signals (predicted): the share of the oracle's gain the best per-row rule would capture if "
                "the learned signal knew more of each verdict (its log-odds + β for an accepted token, − β for a "
                "rejected one; β = 0 is the signal itself). Their AUC is in-sample over the tokens a verify judges, "
                "so it is not the held-out AUC above; the signal's cost is left out",
                ("B", "layout", "oracle over fixed γ", *header), rows))
        return shown

    @classmethod
    def report_blocks(cls, found: dict[str, Analyses], view: ReportView) -> list[tuple]:
        """Each replay sweep's headroom: fixed γ, the best scheduled policy and the oracle; then
        what better signals would capture."""
        rows = [[view.short(run_id), str(r["batch_size"]), r["layout"], _number(r["best_fixed_speedup"]),
                 *(_number(r.get(f"best_{kind}_speedup")) for kind in ("raw", "learned", "budget")),
                 f"{_number(r['oracle_speedup'])} ({r['oracle']})", captured_cell(r["captured"])]
                for run_id, analyses in found.items() for r in analyses.headroom]
        if not rows:
            return []
        header = ["run", "batch size", "layout", "best fixed γ", "raw metrics", "learned", "budget", "oracle",
                  "captured"]
        better = []
        for run_id, analyses in found.items():
            if not analyses.signal_headroom:
                continue
            columns, body = pivot(analyses.signal_headroom)
            lines = [[str(b), layout, f"{gain:+.1%}", *map(captured_cell, shares)] for b, layout, gain, *shares in body]
            if view.several:
                better.append(("p", f"Run {view.short(run_id)}:"))
            better.append(("table", ["batch size", "layout", "oracle over fixed γ", *columns], lines))
        if better:
            better = [("h3", "How good a signal would have to be"), ("p", BETTER_SIGNALS), *better]
        return [("h2", "Headroom"), ("p", HEADROOM), ("table", header, rows), *better]

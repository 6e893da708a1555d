"""A sweep's sections (dspark_bench/sections/): each reads and writes the exact JSON it owns, the
sweep's composition keeps summary.json's order, and the console and the report take their rows and
blocks from the registration list alone."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

from dspark_bench.config import DecodeConfig
from dspark_bench.sections import registry
from dspark_bench.sections.base import END, UNDER_HEADLINE, Line, ReportView, SweepFacts
from dspark_bench.sections.depth import DepthSearch
from dspark_bench.sections.sampling import Sampling
from dspark_bench.sections.under_load import UnderLoad

SERVED = {"config_label": "fixed γ=3", "throughput": 120.0, "tpot_p50_s": 0.01, "tpot_p99_s": 0.02,
          "ttft_p50_s": 0.1, "ttft_p99_s": 0.3}
SUMMARY = {
    "evaluation": "replay",
    "depth_search": {"buckets": ["0-256", "256-1k"], "per_bucket_best": [
        {"depth_bucket": "0-256", "config_label": "top1 threshold 0.3 γ≤4 min0", "threshold": 0.3, "gamma_max": 4,
         "predicted_speedup": 1.2}],
        "depth_policy": {"config_label": "top1 depth 0.3/4", "buckets": []},
        "best_single": {"config_label": "top1 threshold 0.3 γ≤4 min0", "buckets": []},
        "best_fixed": {"config_label": "fixed γ=3", "buckets": []}, "ranked_by": "predicted_speedup"},
    "depth_verdict": None,
    "prices": {"label": "our decoder", "measured_by": "ours", "file": "prices.json", "source": "timed here"},
    "engine_verdict": None,
    "continuations": None,
    "sampling": {"temperature": 0.7, "top_p": 1.0, "seed": 0, "paths": 2, "draws": 4,
                 "precision": {"half_width": {"speedup": 0.01}, "policies": 10, "sentence": "±1 %"}},
    "load": {"max_batch": 4, "requests": "20 requests per rate", "objective": "throughput", "tpot_limit_s": None,
             "policies": 3, "points": 8, "seconds": 0.5, "table": "load.parquet",
             "by_rate": [{"arrival": "1/s", "best": SERVED, "best_fixed": SERVED, "plain": None}],
             "verdict": "the same policy is best at every load: fixed γ=3"},
}


def test_every_section_writes_back_the_json_it_read_in_the_same_order():
    found = registry.read(SUMMARY)
    assert {type(f) for f in found} == {DepthSearch, Sampling, UnderLoad}
    written = registry.summary_json(found, prices=SUMMARY["prices"], continuations=None)
    assert json.dumps(written) == json.dumps({k: v for k, v in SUMMARY.items() if k != "evaluation"})
    # What a sweep that found nothing writes: the keys it always had, as null; no depth search.
    assert registry.summary_json([], prices=None) == {"prices": None, "engine_verdict": None, "sampling": None,
                                                      "load": None}


def test_the_console_and_the_report_take_each_section_from_the_registration():
    found = registry.read(SUMMARY)
    shown = registry.console(found, UNDER_HEADLINE)
    # Sampling's precision, then the depth search, then the load, as the sweep always printed them.
    assert shown[0] == Line("±1 %", "dim") and shown[-1] == Line(SUMMARY["load"]["verdict"], "bold")
    view = ReportView(several=False, short=str, policy=lambda run_id, label: None)
    blocks = registry.report_blocks({"sweep-a": SUMMARY}, view, END)
    assert [b[0] for b in blocks] == ["h2", "table", "p"] and blocks[0][1] == "Under load"


def test_a_new_section_is_one_class_and_one_registration(monkeypatch):
    @dataclass(frozen=True)
    class Queue:
        KEYS: ClassVar[tuple[str, ...]] = ("queue",)
        ABSENT: ClassVar[dict] = {}
        CONSOLE_AT: ClassVar[int] = UNDER_HEADLINE
        REPORT_AT: ClassVar[str] = END

        steps: int

        @classmethod
        def of_sweep(cls, facts):
            return cls(len(facts.configs))

        @classmethod
        def from_json(cls, summary):
            return cls(**summary["queue"]) if summary.get("queue") else None

        def to_json(self):
            return {"queue": {"steps": self.steps}}

        def console(self):
            return [Line(f"{self.steps} steps")]

        @classmethod
        def report_blocks(cls, found, view):
            return [("p", f"{len(found)} sweep(s) with a queue")]

    monkeypatch.setattr(registry, "SECTIONS", (*registry.SECTIONS, Queue))
    facts = _facts([DecodeConfig.of(gamma_max=g) for g in (1, 2, 3)])
    (result,) = [r for r in registry.computed(facts) if isinstance(r, Queue)]
    summary = registry.summary_json([result], prices=None)
    assert list(summary)[-1] == "queue" and summary["queue"] == {"steps": 3}
    assert registry.console(registry.read(summary), UNDER_HEADLINE) == [Line("3 steps")]
    view = ReportView(several=False, short=str, policy=lambda run_id, label: None)
    assert registry.report_blocks({"sweep-a": summary}, view, END) == [("p", "1 sweep(s) with a queue")]


def _facts(configs: list):
    """Facts for the registered sections: a greedy record (no sampling) and a spec naming no load."""
    record = type("Record", (), {"info": {}})()
    spec = type("Spec", (), {"arrival_rates": (), "arrival_trace": None})()
    return SweepFacts(folder=None, spec=spec, configs=configs, table=None, record=record, model_record=record,
                      surface=None)

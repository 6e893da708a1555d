"""Timing health on synthetic timings: every check's verdicts, the re-timing of a cost table that
fails, and the health a run and a sweep write (no timed assertions: the inputs are made up)."""

from __future__ import annotations

import pandas as pd
import pytest

from dspark_bench.harness import health
from dspark_bench.replay.cost import CostModel, CostSurface


def surface(*t_verify, spread=0.02, **more) -> CostSurface:
    models = {1: CostModel(0.004, list(t_verify), 64, spread=spread)}
    for b, (draft, verify) in more.items():
        models[int(b.lstrip("B"))] = CostModel(draft, list(verify), 64, int(b.lstrip("B")), spread=spread)
    return CostSurface(models)


QUIET = (0.022, 0.023, 0.024, 0.025, 0.026)
# The busy machine: t_verify(0) 0.143 s, then 1.034, 0.99, 1.33, 1.29, 0.54, 0.46, 0.26, 0.47.
BUSY = (0.143, 1.034, 0.99, 1.33, 1.29, 0.54, 0.46, 0.26, 0.47)


def test_a_monotone_quiet_cost_table_is_ok():
    checks = health.cost_checks(surface(*QUIET))
    assert [c.verdict for c in checks] == ["ok", "ok"]
    assert checks[1].numbers["largest_dip"] == 1.0


def test_a_non_monotone_cost_table_is_unreliable():
    monotone = health.cost_monotone(surface(*BUSY))
    assert monotone.verdict == "unreliable"
    assert monotone.numbers["largest_dip"] == pytest.approx(1.33 / 0.26)
    assert "5.1× cheaper" in monotone.message
    assert health.cost_monotone(surface(0.022, 0.030, 0.024, 0.031)).verdict == "ok"  # 1.25×: idle tables dip so
    assert health.cost_monotone(surface(0.022, 0.040, 0.024, 0.041)).verdict == "noisy"  # 1.67×


def test_the_surface_must_be_monotone_in_the_batch_size_too():
    flat = surface(*QUIET, B4=(0.006, [0.030] * 5), B8=(0.002, [0.031] * 5))
    check = health.cost_monotone(flat)
    assert check.verdict == "unreliable" and check.numbers["where"] == "t_draft(B)"


def test_dispersion_grades_the_worst_repeats():
    assert health.cost_dispersion(surface(*QUIET, spread=0.34)).verdict == "ok"  # the worst idle table seen here
    assert health.cost_dispersion(surface(*QUIET, spread=0.6)).verdict == "noisy"
    assert health.cost_dispersion(surface(*QUIET, spread=3.8)).verdict == "unreliable"  # with the CPU hog


def test_a_failing_cost_table_is_retimed_and_never_used_silently():
    tables = iter([surface(*BUSY), surface(*QUIET)])
    used, checks = health.timed_surface(None, [], 4, [1], measure=lambda *a, **k: next(tables))
    assert used.at(1).t_verify == list(QUIET)
    assert all(c.numbers["try_used"] == 2 and c.numbers["tries"] == 2 for c in checks)
    assert "passed on try 2" in checks[0].message
    # Never passing: the least bad table is used, and every failing check says so.
    tables = iter([surface(*BUSY), surface(*BUSY, spread=0.5), surface(*BUSY)])
    used, checks = health.timed_surface(None, [], 4, [1], measure=lambda *a, **k: next(tables))
    assert health.worst(c.verdict for c in checks) == "unreliable"
    assert checks[0].numbers["tries"] == 3 and checks[0].numbers["try_used"] == 1
    assert "never passing: predicted speedups are untrustworthy" in checks[1].message


def probe_with(medians, spreads):
    probe = health.LoadProbe()
    probe.medians, probe.spreads, probe.stages = list(medians), list(spreads), [f"s{i}" for i in range(len(medians))]
    return probe


def test_a_drifting_load_probe_is_flagged():
    steady = {c.name: c.verdict for c in probe_with([0.010, 0.0105, 0.0101], [0.03, 0.05, 0.04]).checks()}
    assert steady == {"load_drift": "ok", "load_dispersion": "ok"}
    drifting = {c.name: c.verdict for c in probe_with([0.010, 0.026, 0.011], [0.03, 0.05, 0.04]).checks()}
    assert drifting["load_drift"] == "unreliable"
    assert {c.name: c.verdict for c in probe_with([0.010, 0.017], [0.03, 0.05]).checks()}["load_drift"] == "noisy"
    shared = {c.name: c.verdict for c in probe_with([0.020, 0.021], [2.9, 3.1]).checks()}  # the hog's
    assert shared == {"load_drift": "ok", "load_dispersion": "unreliable"}  # busy all along: no drift, but jitter


def test_threads_that_run_no_faster_than_one_are_fighting_another_process():
    def scaling(*values):
        probe = probe_with([0.010] * len(values), [0.03] * len(values))
        probe.scalings = list(values)
        return {c.name: c.verdict for c in probe.checks()}["thread_scaling"]

    assert scaling(1.39, 1.41) == "ok"  # 2 threads, idle, on this 2-core machine
    assert scaling(1.39, 1.1) == "noisy"
    assert scaling(1.4, 0.66) == "unreliable"  # a busy loop on the other core: 2 threads slower than 1
    assert "thread_scaling" not in {c.name for c in probe_with([0.01], [0.03]).checks()}  # 1 thread: no check


def test_the_load_probe_measures_something():
    probe = health.LoadProbe(repeats=3)
    probe.sample("a")
    assert probe.medians[0] > 0 and probe.stages == ["a"]


def confirmed(*rows):
    columns = ["config_label", "batch_size", "predicted_speedup", "tokens_per_round", "avg_draft_len",
               "acceptance_rate", "speedup"]
    return pd.DataFrame([dict(zip(columns, row)) for row in rows])


def test_measured_far_from_predicted_is_flagged():
    table = confirmed(("entropy 0.05", 1, 0.968, 3.879, 3.9, 0.7, 2.639), ("fixed", 1, 1.78, 3.0, 3.0, 0.7, 1.73))
    check = health.measured_over_predicted(table)
    assert check.verdict == "unreliable" and check.numbers["policy"] == "entropy 0.05"
    assert health.measured_over_predicted(table.iloc[[1]]).verdict == "ok"


def test_baseline_drift_and_wall_time():
    steady = pd.DataFrame({"baseline_time_s": [1.0, 1.1, 0.95, 1.05, 1.0, 1.02], "baseline_new_tokens": [32] * 6})
    assert health.baseline_drift(steady).verdict == "ok"
    slowed = steady.assign(baseline_time_s=[1.0, 1.1, 0.95, 2.0, 2.1, 1.9])
    assert health.baseline_drift(slowed).verdict == "unreliable"
    assert health.wall_over_estimate(354, 79).verdict == "unreliable"  # the 354 s against 79 s
    assert health.wall_over_estimate(80, 79).verdict == "ok"
    assert health.wall_over_estimate(80, None) is None
    assert health.wall_over_estimate(9, 2) is None  # a job of seconds: fixed costs, not judged


def test_a_job_s_health_is_its_worst_check_with_a_line_saying_why():
    checks = [health.cost_monotone(surface(*BUSY)), health.cost_dispersion(surface(*QUIET)), None]
    summary = health.health(checks)
    assert summary["verdict"] == "unreliable" and len(summary["checks"]) == 2
    assert summary["headline"].startswith("timings unreliable: a target pass over more tokens")
    assert "--threads 1" in summary["headline"]
    assert health.health([health.cost_dispersion(surface(*QUIET))])["headline"].startswith("timings ok")


"""`dspark-bench regress`: the CI regression verdict against a committed baseline.

Exit status: 0 pass (speed flags allowed), 1 regression, 2 no verdict (an unusable baseline,
runs that measured different things, or bad input).
"""

from __future__ import annotations

from pathlib import Path

import typer

from dspark_bench.cli.console import cli_errors, out_console, reporting
from dspark_bench.cli.declared import knob_fields, with_options
from dspark_bench.cli.options import command_options
from dspark_bench.errors import DsparkError
from dspark_bench.reporting import regress as lib

NO_VERDICT = 2  # not cli_errors' usual 1: that means "regression" here, so CI can tell them apart


@with_options("sizes", knob_fields(("batch_size",)), many=True, unset="the baseline's",
              helps={"batch_size": "Re-run every baseline policy at this batch size instead (repeatable)."})
@command_options("baseline", "current", "out", "tolerance", "speed_tolerance", "strict_speed", "report", "update",
                 "force", helps={"out": "Folder that receives the re-run's run folder.",
                                 "force": "With --update: accept a run whose timings were unreliable."})
def regress(
    *, baseline: Path, current: Path | None, out: Path, tolerance: float, speed_tolerance: float, strict_speed: bool,
    report: Path | None, update: bool, force: bool, sizes: dict | None = None,
):
    """Re-run (or take) a benchmark and compare it with a baseline: exit 0 pass, 1 regression, 2 no verdict.

    Policy metrics must match the baseline's within --tolerance and greedy float32 outputs must
    be identical; a slower speedup is only flagged unless --strict-speed.

    Example: dspark-bench regress --baseline results/baselines/ci/summary.json --report regress.md
    Example: dspark-bench regress --baseline results/baselines/ci/summary.json --batch-size 8
        (the same policies at B = 8)
    """
    batch_size = sizes["batch_size"]
    with cli_errors(status=NO_VERDICT), reporting("re-running the baseline") as (progress, _):
        if batch_size and (update or current is not None):
            raise DsparkError("--batch-size re-runs the baseline's benchmark at those batch sizes; drop "
                              + ("--update" if update else "--current"))
        if update:
            text = lib.update(baseline, current, out, progress, force)
        else:
            comparison, text = lib.check(baseline, current, out, tolerance, speed_tolerance, strict_speed, report,
                                         progress, batch_size or None)
    out_console.print(text, markup=False, highlight=False, soft_wrap=True)
    if not update and comparison.failed:
        raise typer.Exit(1)

"""`dspark-bench regress`: the CI regression verdict against a committed baseline.

Exit status: 0 pass (speed flags allowed), 1 regression, 2 no verdict (an unusable baseline,
runs that measured different things, or bad input).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dspark_bench.cli.console import cli_errors, out_console, reporting
from dspark_bench.cli.declared import knob_fields, with_options
from dspark_bench.errors import DsparkError
from dspark_bench.reporting import regress as lib

NO_VERDICT = 2  # not cli_errors' usual 1: that means "regression" here, so CI can tell them apart


@with_options("sizes", knob_fields(("batch_size",)), many=True, unset="the baseline's",
              helps={"batch_size": "Re-run every baseline policy at this batch size instead (repeatable)."})
def regress(
    baseline: Annotated[Path, typer.Option(help="The baseline's summary.json (run.json and samples.parquet beside it).")],
    current: Annotated[Optional[Path], typer.Option(help="Compare this run folder instead of re-running the baseline's benchmark.")] = None,
    out: Annotated[Path, typer.Option(help="Folder that receives the re-run's run folder.")] = Path("results"),
    tolerance: Annotated[float, typer.Option(help="Relative tolerance on the deterministic policy metrics.")] = lib.DEFAULT_TOLERANCE,
    speed_tolerance: Annotated[float, typer.Option(help="Flag a speedup below (1 - this) × the baseline's.")] = lib.DEFAULT_SPEED_TOLERANCE,
    strict_speed: Annotated[bool, typer.Option(help="Fail, not just flag, a speedup outside --speed-tolerance.")] = False,
    report: Annotated[Optional[Path], typer.Option(help="Write the Markdown table here (default: regress.md in the current run folder).")] = None,
    update: Annotated[bool, typer.Option(help="Rewrite the baseline from --current or a fresh re-run, on purpose.")] = False,
    force: Annotated[bool, typer.Option(help="With --update: accept a run whose timings were unreliable.")] = False,
    sizes: dict | None = None,
):
    """Re-run (or take) a benchmark and compare it with a baseline: exit 0 pass, 1 regression, 2 no verdict.

    Policy metrics must match the baseline's within --tolerance and greedy float32 outputs must
    be identical; a slower speedup is only flagged unless --strict-speed.

    Example: dspark-bench regress --baseline results/baselines/ci/summary.json --report regress.md
    Example: dspark-bench regress --baseline results/baselines/ci/summary.json --batch-size 8 (the same policies at B = 8)
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

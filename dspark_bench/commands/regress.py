"""`dspark-bench regress`: the CI regression verdict against a committed baseline.

Exit status: 0 pass (speed flags allowed), 1 regression, 2 no verdict (an unusable baseline,
runs that measured different things, or bad input). Registered in cli.py with
`app.command()(regress)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dspark_bench import regress as lib
from dspark_bench.errors import DsparkError
from dspark_bench.results import check_writable

NO_VERDICT = 2


def regress(
    baseline: Annotated[Path, typer.Option(help="The baseline's summary.json (run.json and samples.parquet beside it).")],
    current: Annotated[Optional[Path], typer.Option(help="Compare this run folder instead of re-running the baseline's benchmark.")] = None,
    out: Annotated[Path, typer.Option(help="Folder that receives the re-run's run folder.")] = Path("results"),
    tolerance: Annotated[float, typer.Option(help="Relative tolerance on the deterministic policy metrics.")] = lib.DEFAULT_TOLERANCE,
    speed_tolerance: Annotated[float, typer.Option(help="Flag a speedup below (1 - this) × the baseline's.")] = lib.DEFAULT_SPEED_TOLERANCE,
    strict_speed: Annotated[bool, typer.Option(help="Fail, not just flag, a speedup outside --speed-tolerance.")] = False,
    report: Annotated[Optional[Path], typer.Option(help="Write the Markdown table here (default: regress.md in the current run folder).")] = None,
    update: Annotated[bool, typer.Option(help="Rewrite the baseline from --current or a fresh re-run, on purpose.")] = False,
):
    """Re-run (or take) a benchmark and compare it with a baseline: exit 0 pass, 1 regression, 2 no verdict.

    Policy metrics must match the baseline's within --tolerance and greedy float32 outputs must
    be identical; a slower speedup is only flagged unless --strict-speed.

    Example: dspark-bench regress --baseline results/baselines/ci/summary.json --report regress.md
    """
    from dspark_bench.cli import cli_errors, err_console, out_console, progress_bar

    with cli_errors():
        try:
            check_tolerances(tolerance, speed_tolerance)
            if update:
                text = update_baseline(baseline, current, out, progress_bar)
                out_console.print(text, markup=False, highlight=False, soft_wrap=True)
                return
            old = lib.load_baseline(baseline)
            folder = current if current is not None else rerun(old, out, progress_bar)
            new = lib.load_record(folder, "current run")
            reasons = lib.comparable(old.run, new.run)
            if reasons:
                raise lib.NotComparable(reasons)
            comparison = lib.compare(old, new, tolerance, speed_tolerance, strict_speed)
            text = comparison.markdown()
            out_console.print(text, markup=False, highlight=False, soft_wrap=True)
            lib.write_report(report or new.folder / "regress.md", text)
        except DsparkError as err:
            # Not cli_errors' status 1: that means "regression" here, so CI can tell them apart.
            err_console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
            raise typer.Exit(NO_VERDICT) from None
    if comparison.failed:
        raise typer.Exit(1)


def check_tolerances(tolerance: float, speed_tolerance: float) -> None:
    if tolerance < 0:
        raise DsparkError(f"--tolerance must be >= 0 (got {tolerance:g})")
    if not 0 <= speed_tolerance < 1:
        raise DsparkError(f"--speed-tolerance must be in [0, 1) (got {speed_tolerance:g})")


def rerun(baseline: lib.RunRecord, out: Path, progress_bar) -> Path:
    """Re-run the baseline's benchmark under `out`, with a progress bar once decoding starts."""
    check_writable(out)
    plan = lib.plan_rerun(baseline)  # refuses other models or prompts before any bar is drawn
    with progress_bar() as bar:
        job = bar.add_task("re-running the baseline", total=plan.samples)
        return lib.rerun(baseline.folder, out, progress=lambda: bar.advance(job), plan=plan)


def update_baseline(baseline: Path, current: Optional[Path], out: Path, progress_bar) -> str:
    """Replace the baseline by --current, or by a fresh re-run of the baseline's own benchmark."""
    target = lib.baseline_folder(baseline)
    if current is None:
        if not lib.summary_path(baseline).is_file():
            raise DsparkError(f"baseline {str(baseline)!r} does not exist yet; pass --current RUN to create it")
        current = rerun(lib.load_baseline(baseline), out, progress_bar)
    lib.update_baseline(current, target, replace=True)
    return f"baseline {target} updated from run {current}"

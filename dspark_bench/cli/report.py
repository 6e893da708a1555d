"""`dspark-bench report`: figures, report.md and a self-contained report.html for run folders."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dspark_bench.cli.console import cli_errors, out_console
from dspark_bench.cli.options import command_options


@command_options("out", "fmt", "by", defaults={"out": None},
                 helps={"out": "Write the report here (default: the first run folder)."})
def report(
    runs: Annotated[list[Path], typer.Argument(help="Run or sweep folders (several: compared in one report).")],
    *, out: Path | None, fmt: str, by: str | None,
):
    """Draw the figures and write report.md and report.html (figures embedded) for run folders.

    Figures go under plots/ beside the report; figures whose data is absent are skipped and the
    report says why. Earlier reports are replaced file by file, atomically; results never change.

    Example: dspark-bench report results/20250101-120000-sweep-abc123 --format svg
    """
    from dspark_bench.reporting import report as lib  # loaded when the command runs, not for --help

    with cli_errors():
        path = lib.build_report(runs, out=out, fmt=fmt, by=by)
        out_console.print(f"report: {path}\nhtml:   {path.with_name('report.html')}\nplots:  {path.parent / 'plots'}",
                          highlight=False, soft_wrap=True)

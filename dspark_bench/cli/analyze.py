"""`dspark-bench analyze`: the studies of a finished replay sweep's record (analysis/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dspark_bench.cli.console import cli_errors, out_console, print_shown, reporting


def analyze(
    sweep: Annotated[Path, typer.Argument(help="A replay sweep's folder.")],
):
    """What the sweep's pair could give beyond its best policy: the oracle's headroom over the best
    fixed γ, how well each signal predicts acceptance on prompts it never saw, and how good a
    signal the rules would need to take that headroom.

    Reads the sweep's record, replayed table and cost model; writes analysis.json into the sweep
    folder (the report shows it) and changes nothing else. About 10 s for 4 prompts here.

    Example: dspark-bench analyze results/20250101-120000-sweep-abc123
    """
    from dspark_bench.analysis import analyze_folder  # loaded when the command runs, not for --help

    with cli_errors():
        with reporting("analyze") as (progress, _say):
            result = analyze_folder(sweep, progress)
        from dspark_bench.sections.analyses import Analyses  # loaded when the command runs, not for --help

        print_shown(Analyses.read(result).console())
        out_console.print(f"analysis: {Path(sweep) / 'analysis.json'}", highlight=False, soft_wrap=True)

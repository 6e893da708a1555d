"""`dspark-bench export`: a run's tuned policy in a serving engine's own configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from dspark_bench.cli.console import cli_errors, out_console


def export(
    run: Annotated[Path, typer.Argument(help="A run or sweep folder (a replay sweep's can find the nearest policy).")],
    fmt: Annotated[str, typer.Option("--format", help="hf | vllm | sglang | trtllm | llamacpp")] = "hf",
    out: Annotated[Optional[Path], typer.Option(help="Write here (default: RUN/export/<the engine's file name>).")] = None,
):
    """Write the run's best policy in an engine's own vocabulary; where the engine cannot express
    it, the nearest policy it can (replayed on the run's record), with both predicted speedups.

    Example: dspark-bench export results/20250101-120000-sweep-abc123 --format llamacpp
    """
    from dspark_bench.tuning import export as lib  # loaded when the command runs, not for --help

    with cli_errors():
        path, choices, text = lib.export(run, fmt, out)
    table = Table(title=f"what deploying on {fmt} costs (speedups replayed on the run's record and cost model)")
    for column in ("batch size", "tuned policy", "speedup", f"{fmt} runs", "speedup ", "kept"):
        table.add_column(column, justify="right" if "speedup" in column or column in ("batch size", "kept") else "left")
    for c in choices:
        kept = c.exported_speedup / c.tuned_speedup if c.exported_speedup and c.tuned_speedup else float("nan")
        table.add_row(str(c.batch_size), c.tuned.label(), f"{c.tuned_speedup:.3f}",
                      "the same policy" if not c.reasons else c.exported.label(),
                      f"{c.exported_speedup:.3f}" if c.exported_speedup is not None else "n/a", f"{kept:.1%}")
    out_console.print(table)
    for c in choices:
        if c.reasons:
            out_console.print(f"B={c.batch_size}: {fmt} cannot express {'; '.join(c.reasons)}", highlight=False)
    out_console.print(f"note: {lib.NOTES[fmt]}", highlight=False, soft_wrap=True)
    out_console.print(text.rstrip(), highlight=False, soft_wrap=True, markup=False)
    out_console.print(f"written: {path}", highlight=False, soft_wrap=True)

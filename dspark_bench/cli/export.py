"""`dspark-bench export`: a run's tuned policy in a serving engine's own configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dspark_bench.cli.console import cli_errors, out_console
from dspark_bench.cli.options import command_options


@command_options("fmt", "engine_version", "controller", "out", defaults={"fmt": "hf", "out": None},
                 helps={"fmt": "hf | vllm | sglang | trtllm | llamacpp",
                        "out": "Folder to write into (default: RUN/export/)."})
def export(
    run: Annotated[Path, typer.Argument(help="A run or sweep folder (a replay sweep's can find the nearest policy).")],
    *, fmt: str, engine_version: str | None, controller: bool, out: Path | None,
):
    """Write the run's best policy in an engine's own vocabulary, for a named engine version; where
    the engine cannot express it, the nearest policy it can (replayed on the run's record), with
    both predicted speedups.

    Example: dspark-bench export results/20250101-120000-sweep-abc123 --format llamacpp
    (--controller: SGLang's or TensorRT-LLM's own controller, as the sweep tuned it)
    """
    from dspark_bench.engines import export as lib  # loaded when the command runs, not for --help

    with cli_errors():
        written, choices, text, version = lib.export(run, fmt, out, engine_version, controller)
    priced = choices[0].prices or "the run's cost model"
    table = Table(title=f"what deploying on {fmt} costs (speedups replayed on the run's record, priced on {priced})")
    for column in ("batch size", "tuned policy", "speedup", f"{fmt} runs", "speedup ", "kept"):
        table.add_column(column, justify="right" if "speedup" in column or column in ("batch size", "kept") else "left")
    for c in choices:
        kept = c.exported_speedup / c.tuned_speedup if c.exported_speedup and c.tuned_speedup else float("nan")
        table.add_row(str(c.batch_size), c.tuned.label(), f"{c.tuned_speedup:.3f}",
                      ("plain decoding" if c.plain else "the same policy" if c.exported == c.tuned
                       else c.exported.label()),
                      f"{c.exported_speedup:.3f}" if c.exported_speedup is not None else "n/a", f"{kept:.1%}")
    out_console.print(table)
    say = lambda line: out_console.print(line, highlight=False, soft_wrap=True, markup=False)  # noqa: E731
    for c in choices:
        if c.reasons:
            out_console.print(f"B={c.batch_size}: {fmt} cannot express {'; '.join(c.reasons)}", highlight=False)
        if c.over_defaults is not None:
            name = {"llamacpp": "llama.cpp"}.get(fmt, fmt)
            say(f"B={c.batch_size}: predicted {c.over_defaults:.3f}× {name}'s own default policy (fixed γ = 3)")
        if c.plain:
            say(f"B={c.batch_size}: writes plain decoding: {c.plain}")
    measured = lib.measured_verdict(run, fmt)
    if measured and not any(c.plain.startswith("the sweep measured") for c in choices):  # (else said above)
        say(f"measured by the sweep: {measured['sentence']}")
    say(f"written for: {version.covers}")
    say(f"note: {lib.NOTES[fmt]}")
    say(text.rstrip())
    for path in written:
        say(f"written: {path}")

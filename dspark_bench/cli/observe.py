"""`dspark-bench observe`: what a deployed engine accepted, read from its own counters."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from dspark_bench.cli.console import cli_errors, out_console, print_small_table
from dspark_bench.cli.options import command_options


@command_options("window", "prices", "out", helps={"out": "Folder that receives the observation's folder."})
def observe(
    sources: Annotated[list[str], typer.Argument(help="A metrics URL (scraped twice, --window apart), two saved "
                                                      "scrapes (start, end), or one (every count since it started).")],
    *, window: float, prices: Path | None, out: Path,
):
    """Per draft position, what a deployed engine accepted (vLLM, llama-server --metrics, TensorRT-LLM
    counters), with 95 % intervals; with --prices, the best draft length up to the deployed one.

    Example: dspark-bench observe http://localhost:8080/metrics --window 300 --prices llamacpp-prices.json
    Example: dspark-bench observe before.prom after.prom
    """
    from dspark_bench.engines.observed import observe as lib  # loaded when the command runs, not for --help

    say = lambda line: out_console.print(line, highlight=False, soft_wrap=True, markup=False)  # noqa: E731
    with cli_errors():
        folder, result = lib(sources, window, prices, out, say=say)
    say(f"{result['engine']}, {result['window']}: {result['rounds']:,} rounds, {result['draft_tokens']:,} draft "
        f"tokens, {result['accepted']:,} accepted")
    low, high = result["mean_accepted_interval"]
    rate = result["acceptance_rate"]
    say(f"mean accepted a round {result['mean_accepted']:.3f} [{low:.3f}, {high:.3f}] (acceptance length "
        f"{result['acceptance_length']:.3f}), acceptance rate {'n/a' if rate is None else f'{rate:.3f}'}")
    print_small_table("per draft position (95 % intervals)",
                      ("position", "rounds accepting it", "survival", "conditional"),
                      [[str(p["position"]), f"{p['accepted_rounds']:,}",
                        interval(p["survival"], p["survival_interval"]),
                        interval(p["conditional"], p["conditional_interval"])] for p in result["positions"]])
    print_advice(result.get("advice"), say)
    say(f"written: {folder / 'observed.json'}")


def interval(value: float, bounds) -> str:
    return "n/a" if math.isnan(value) else f"{value:.3f} [{bounds[0]:.3f}, {bounds[1]:.3f}]"


def print_advice(advice: dict | None, say) -> None:
    if advice is None:
        return
    if "refused" in advice:
        say(f"no advice: {advice['refused']}")
        return
    print_small_table(f"each draft length up to the deployed {advice['deployed']}, priced on {advice['prices']}",
                      ("draft length", "mean accepted", "speedup"),
                      [[str(r["draft_length"]), interval(r["mean_accepted"], r["mean_accepted_interval"]),
                        interval(r["speedup"], r["speedup_interval"])] for r in advice["by_length"]])
    best = advice["best"]
    say(f"advice: draft length {best} ({advice['best_speedup']:.3f}×)" if best else
        "advice: plain decoding (no draft length beats it on these prices)")
    say(advice["note"])

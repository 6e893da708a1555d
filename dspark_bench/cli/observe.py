"""`dspark-bench observe`: what a deployed engine accepted, read from its own counters."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from dspark_bench.cli.console import cli_errors, out_console, print_small_table
from dspark_bench.cli.options import command_options

NO_VERDICT = 2  # with --against, as `regress`: 0 as predicted, 1 drifted, 2 no verdict (bad input included)


@command_options("window", "prices", "against", "served_model", "out",
                 helps={"out": "Folder that receives the observation's folder."})
def observe(
    sources: Annotated[list[str], typer.Argument(help="A metrics URL (scraped twice, --window apart), two saved "
                                                      "scrapes (start, end), or one (every count since it started).")],
    *, window: float | None, prices: Path | None, against: Path | None, served_model: str | None, out: Path,
):
    """Per draft position, what a deployed engine accepted (vLLM, llama-server --metrics, TensorRT-LLM
    counters), with 95 % intervals; with --prices, the best draft length up to the deployed one.

    Example: dspark-bench observe http://localhost:8080/metrics --window 300 --prices llamacpp-prices.json
    Example: dspark-bench observe before.prom after.prom --against results/<sweep_id>
    (with --against: exit 0 as predicted, 1 drifted, 2 no verdict)
    """
    from dspark_bench.engines.observed import observe as lib  # loaded when the command runs, not for --help

    say = lambda line: out_console.print(line, highlight=False, soft_wrap=True, markup=False)  # noqa: E731
    with cli_errors(NO_VERDICT if against is not None else 1):
        folder, result = lib(sources, window, prices, out, say=say, against=against, served_model=served_model)
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
    if "against" in result:
        raise typer.Exit(print_verdict(result["against"], say))


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


def print_verdict(verdict: dict, say) -> int:
    """The window against replay's prediction; the exit status it means."""
    if verdict["verdict"] == "no verdict":
        say(f"no verdict against {verdict['folder']}: {verdict['why']}")
        return NO_VERDICT
    print_small_table(f"observed against replay of {verdict['policy']} on {verdict['folder']} "
                      f"({verdict['observed_rounds']:,} rounds seen, {verdict['predicted_rounds']:,} replayed)",
                      ("position", "observed", "predicted", "difference (95 %)", "drifted"),
                      [[str(r["position"]), f"{r['observed']:.3f}", f"{r['predicted']:.3f}",
                        interval(r["difference"], r["difference_interval"]), "yes" if r["drifted"] else ""]
                       for r in verdict["positions"]])
    if verdict["verdict"] == "drifted":
        say(f"drifted: position(s) {', '.join(map(str, verdict['drifted_positions']))} differ by ≥ "
            f"{verdict['tolerance']:.2f} and beyond chance; calibrate again on this traffic")
        return 1
    say("as predicted")
    return 0

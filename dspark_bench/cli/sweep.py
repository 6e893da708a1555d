"""`dspark-bench sweep`: search the policy's knobs: exact replay (greedy), grid or Optuna."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dspark_bench.cli.console import cli_errors, out_console, print_best, reporting
from dspark_bench.cli.declared import fields_of, knob_fields, with_options
from dspark_bench.config import KNOBS
from dspark_bench.harness.workload import Workload
from dspark_bench.tuning.spec import SweepSpec

# The knobs whose values the sweep's flags give as its search space (a spec's `space`).
SPACE = tuple(name for name, f in KNOBS.items() if f.metadata["searched"] and f.metadata["repeats"])
# A sweep's own settings (SweepSpec declares them); objective and continuations take lists.
STUDY = ("method", "evaluation", "trials", "confirm_top", "analyze", "prices")


@with_options("workload", fields_of(Workload, without=("turns", "trace")), unset="the spec's")  # a sweep refuses both
@with_options("space", knob_fields(SPACE), many=True, unset="the spec's")
@with_options("study_flags", fields_of(SweepSpec, STUDY), unset="the spec's")
def sweep(
    spec: Annotated[Optional[Path], typer.Option(help="Sweep specification (YAML), e.g. sweeps/code.yaml.")] = None,
    objective: Annotated[Optional[str], typer.Option(help="speedup | tokens_per_round | ...; two, comma-separated, for a Pareto front.")] = None,
    storage: Annotated[Optional[str], typer.Option(help="Optuna storage URL (sqlite:///, postgresql://, journal:///path) (default: SQLite in the run folder).")] = None,
    study: Annotated[Optional[str], typer.Option(help="Study name, shared by workers on one storage.")] = None,
    workers: Annotated[int, typer.Option(help="Local worker processes on the same study.")] = 1,
    resume: Annotated[Optional[Path], typer.Option(help="Continue this sweep's run folder where it stopped.")] = None,
    continuations: Annotated[Optional[Path], typer.Option(help="Replay: the target's greedy continuations from the engine that serves it (a continuations file: `dspark-bench continuations`), recorded from instead of decoding the target here.")] = None,
    shard: Annotated[Optional[str], typer.Option(help="With --continuations: record only shard I/N of the prompts (machine I of N) and stop; the sweep without --shard assembles every shard's parts. 1/1: record every prompt, and stop.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override any spec field: key=value (YAML value), e.g. space.threshold=[0.2,0.4].")] = None,
    out: Annotated[Path, typer.Option(help="Folder that receives the run folder.")] = Path("results"),
    wide: Annotated[bool, typer.Option("--wide", help="Print every column of the best policies' table, not the six that fit 100 columns.")] = False,
    worker_only: Annotated[bool, typer.Option(hidden=True)] = False,
    workload: dict | None = None, space: dict | None = None, study_flags: dict | None = None,
):
    """Search the policy's knobs over a task: replay (exact, greedy), grid or Optuna; resumable.

    Example: dspark-bench sweep --task code --spec sweeps/code.yaml --limit 10
    Example: dspark-bench sweep --task code --drafter model --drafter heads --drafter lookup
    Example: dspark-bench sweep --task code --continuations continuations.jsonl
    """
    from dspark_bench.tuning import spec as specs  # loaded when the command runs, not for --help
    from dspark_bench.tuning import sweep as lib  # loaded when the command runs, not for --help

    with cli_errors():
        flags = {**workload, **space, **study_flags, "objective": objective,
                 "continuations": None if continuations is None else str(continuations)}
        with reporting("sweep") as (progress, say):
            if shard is not None:
                chosen, _ = specs.resolve_spec(spec, specs.command_overrides(flags, set_ or []))
                index, count = lib.parse_shard(shard)
                written = lib.record_shard(chosen, out / "records", (index, count), progress, say)
                where = ", ".join(str(p) for p in written) or "nothing: the records are whole already"
                say(f"shard {index}/{count} recorded into {where}" + (
                    "; the sweep without --shard assembles every shard's parts" if count > 1 else ""))
                return
            if resume is not None:
                results = [lib.continue_sweep(resume, workers=workers, worker_only=worker_only, progress=progress,
                                              storage=storage)]
            else:
                chosen, origin = specs.resolve_spec(spec, specs.command_overrides(flags, set_ or []))
                # One sweep per temperature a spec lists (`temperatures`), else the one.
                results = lib.run_sweeps(chosen, out, storage, study, workers, progress, say, origin,
                                         engines=engine_tools(chosen.prices, say))
        for result in results:
            if result is not None:  # a worker-only process leaves the table to the sweep's own process
                print_best(result, wide)
        if len(results) > 1:
            out_console.print(f"the best policy against temperature: dspark-bench report "
                              f"{' '.join(str(r.folder) for r in results)}", highlight=False, soft_wrap=True)


def engine_tools(prices: str | None, say):
    """The engines a sweep priced on their costs measures and confirms in (--prices llamacpp, or a
    llama.cpp cost-model file): confirmed in llama-server where one is built here, else said."""
    from dspark_bench.engines.llama_server import find_server  # engines load only when a sweep runs, not for --help
    from dspark_bench.engines.llamacpp_confirm import confirm_in_llamacpp  # the same
    from dspark_bench.engines.llamacpp_run import sweep_prices  # the same
    from dspark_bench.errors import DsparkError  # with the engines: only when a sweep runs
    from dspark_bench.tuning.preparation import EngineTools  # the same: tuning loads when the command runs

    try:
        find_server(None)
    except DsparkError as error:  # ranked on llama.cpp's prices still; confirmed on ours alone, as said
        if prices not in (None, "", "ours"):
            say(f"no llama-server here ({error}): a sweep priced on llama.cpp's costs is confirmed on our engine only")
        return EngineTools(measure={"llamacpp": sweep_prices})
    return EngineTools(measure={"llamacpp": sweep_prices}, confirm={"llamacpp": confirm_in_llamacpp})

"""`dspark-bench sweep`: search the policy's knobs: exact replay (greedy), grid or Optuna."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dspark_bench.cli.console import cli_errors, out_console, print_best, reporting
from dspark_bench.cli.declared import fields_of, knob_fields, with_options
from dspark_bench.cli.options import command_options
from dspark_bench.config import KNOBS
from dspark_bench.harness.workload import Workload
from dspark_bench.tuning.spec import SweepSpec

# The knobs whose values the sweep's flags give as its search space (a spec's `space`).
SPACE = tuple(name for name, f in KNOBS.items() if f.metadata["searched"] and f.metadata["repeats"])
# A sweep's own settings (SweepSpec declares them); objective and continuations take lists.
STUDY = ("method", "evaluation", "trials", "confirm_top", "paths", "analyze", "prices",
         "arrival_trace", "requests", "max_batch", "load_objective", "tpot_limit", "isolated_prices")


@with_options("workload", fields_of(Workload, without=("turns", "trace")), unset="the spec's")  # a sweep refuses both
@with_options("space", knob_fields(SPACE), many=True, unset="the spec's")
@with_options("study_flags", fields_of(SweepSpec, STUDY), unset="the spec's")
@command_options("spec", "objective", "storage", "study", "workers", "resume", "continuations", "shard", "arrival_rate",
                 "set_", "out", "wide")
def sweep(
    *, spec: Path | None, objective: str | None, storage: str | None, study: str | None, workers: int,
    resume: Path | None, continuations: Path | None, shard: str | None, arrival_rate: list[float] | None,
    set_: list[str] | None, out: Path, wide: bool,
    worker_only: Annotated[bool, typer.Option(hidden=True)] = False,
    workload: dict | None = None, space: dict | None = None, study_flags: dict | None = None,
):
    """Search the policy's knobs over a task: replay (exact, greedy), grid or Optuna; resumable.

    Example: dspark-bench sweep --task code --spec sweeps/code.yaml --limit 10
    Example: dspark-bench sweep --task code --drafter model --drafter heads --drafter lookup
    Example: dspark-bench sweep --task code --continuations continuations.jsonl
    Example: dspark-bench sweep --task code --batch-size 1 --batch-size 8 --arrival-rate 1 --arrival-rate 4
    """
    from dspark_bench.tuning import spec_files as specs  # loaded when the command runs, not for --help

    with cli_errors():
        flags = {**workload, **space, **study_flags, "objective": objective,
                 "continuations": None if continuations is None else str(continuations),
                 "arrival_rates": arrival_rate or None}
        # The spec first, every field checked as declared: a flag out of bounds is refused in the
        # seconds tuning.spec takes to load, before the sweep's own libraries (torch, Optuna) do.
        chosen, origin = (specs.resolve_spec(spec, specs.command_overrides(flags, set_ or []))
                          if shard is not None or resume is None else (None, None))
        from dspark_bench.tuning import sweep as lib  # loaded when the command runs, not for --help

        with reporting("sweep") as (progress, say):
            if shard is not None:
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
                # One sweep per temperature a spec lists (`temperatures`), else the one.
                results = lib.run_sweeps(chosen, out, storage, study, workers, progress, say, origin)
        for result in results:
            if result is not None:  # a worker-only process leaves the table to the sweep's own process
                print_best(result, wide)
        if len(results) > 1:
            out_console.print(f"the best policy against temperature: dspark-bench report "
                              f"{' '.join(str(r.folder) for r in results)}", highlight=False, soft_wrap=True)


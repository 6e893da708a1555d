"""`dspark-bench calibrate`: the best policy per domain, written to a file the decoder loads."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from dspark_bench.cli.console import cli_errors, out_console, reporting
from dspark_bench.cli.declared import fields_of, knob_fields, with_options
from dspark_bench.cli.options import command_options
from dspark_bench.harness.workload import Workload
from dspark_bench.tuning.spec import SweepSpec

# What a calibration's flags override of its spec: the models, how prompts are read and decoded,
# and the search space of the knobs that matter per domain.
WORKLOAD = ("split", "prompt_field", "category_field", "limit", "target", "draft", "device", "dtype", "eager",
            "repeats", "max_new_tokens", "temperature")
SPACE = ("metric", "threshold", "gamma_max", "min_draft_len", "batch_size")


@with_options("workload", fields_of(Workload, WORKLOAD), unset="the spec's",
              helps={"category_field": "Column holding the domain (default: guessed).",
                     "limit": "Prompts per domain (default: the spec's).",
                     "repeats": "Timed pairs per prompt in the confirmation runs (default: the spec's)."})
@with_options("space", knob_fields(SPACE), many=True, unset="the spec's")
@with_options("study", fields_of(SweepSpec, ("evaluation", "paths", "isolated_prices")), unset="the spec's")
@with_options(None, fields_of(Workload, ("dataset",)),  # the prompts' source, handed over beside the spec
              helps={"dataset": "Your prompts (JSONL/JSON/CSV/Parquet/text or hub id): one domain per category."})
@command_options("tasks", "spec", "out", "force", "objective", "continuations", many=("continuations",), helps={
    "out": "Calibration file to write (the figure goes beside it, as .png).",
    "objective": "What to maximise: speedup | tokens_per_round | ... (the first is used).",
    "continuations": "Replay: the target's greedy continuations from the engine that serves it (`dspark-bench "
                     "continuations write`; repeatable, e.g. one file per task), recorded from instead of decoding "
                     "the target here."}, defaults={"out": Path("calibration.yaml")})
def calibrate(
    *, tasks: str | None, dataset: str | None, spec: Path | None, out: Path, force: bool, objective: str | None,
    continuations: list[Path] | None,
    workload: dict | None = None, space: dict | None = None, study: dict | None = None,
):
    """Find the best policy per domain and the best global one, confirm both with timed runs,
    and write a calibration file (plus a threshold-curve figure) that run/decode can load.

    Example: dspark-bench calibrate --tasks code,prose,structured --spec sweeps/default.yaml --out calibration.yaml
    Example: dspark-bench calibrate --tasks code,prose --batch-size 1 --batch-size 8 --batch-size 32
        (a policy per domain and batch size)
    Example: dspark-bench calibrate --tasks code,prose --continuations code.jsonl --continuations prose.jsonl
    """
    from dspark_bench.reporting.plots import domain_threshold_curves  # the same
    from dspark_bench.tuning import calibrate as lib  # loaded when the command runs, not for --help

    with cli_errors():
        flags = {**workload, **space, **study, "objective": objective,
                 "continuations": [str(path) for path in continuations] if continuations else None}
        with reporting("calibrating") as (progress, _):
            result = lib.calibrate_command(tasks, dataset, spec, flags, out, force, progress, domain_threshold_curves)
        out_console.print(calibration_table(result.data))
        for size, part in (result.data.get("by_batch_size") or {}).items():
            out_console.print(calibration_table({**result.data, **part}, f" · batch size {size}"))
        out_console.print(f"calibration file: {result.path}", highlight=False, soft_wrap=True)
        out_console.print(f"figure: {result.figure}", highlight=False, soft_wrap=True)
        if result.profiles or result.profiles_note:
            out_console.print(f"acceptance profiles: {result.profiles}" if result.profiles else result.profiles_note,
                              highlight=False, soft_wrap=True)


def calibration_table(data: dict, suffix: str = "") -> Table:
    """One row per domain, and the global policy measured on all prompts."""
    view = Table(title=f"calibration · objective {data['objective']} · "
                       f"evaluation {data.get('evaluation', data.get('engine'))}{suffix}",
                 title_justify="left")
    for name in ("domain", "policy", "prompts", "tokens per round", "acceptance rate", "speedup", "global speedup",
                 "gain"):
        view.add_column(name, justify="left" if name in ("domain", "policy") else "right")

    def speedup(entry: dict, prefix: str = "") -> str:
        return (f"{entry[prefix + 'speedup']:.2f}× "
                f"[{entry[prefix + 'speedup_low']:.2f}, {entry[prefix + 'speedup_high']:.2f}]")

    for domain, entry in data["domains"].items():
        view.add_row(domain, entry["label"], str(entry["prompts"]), f"{entry['tokens_per_round']:.3f}",
                     f"{entry['acceptance_rate']:.3f}", speedup(entry), speedup(entry, "global_"),
                     f"{entry['gain']:.3f}×")
    measured = data["global"]["measured"]
    view.add_row("(global)", data["global"]["label"], "", f"{measured['tokens_per_round']:.3f}",
                 f"{measured['acceptance_rate']:.3f}", speedup(measured), "", "", style="dim")
    return view


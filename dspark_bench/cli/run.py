"""`dspark-bench run`: decode prompts with the speculative decoder and the baseline, interleaved."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dspark_bench.cli.console import cli_errors, out_console, reporting, summary_table
from dspark_bench.cli.options import (
    Batching,
    BatchSizes,
    CategoryField,
    ChatTemplate,
    Compile,
    Dataset,
    Device,
    Draft,
    Drafters,
    DraftModes,
    Dtype,
    GammaMaxes,
    GoodputModel,
    HeadsPath,
    IgnoreEos,
    Limit,
    MaxNewTokens,
    Metrics,
    MinDraftLens,
    NgramMax,
    NgramMin,
    PromptField,
    PromptsFile,
    Repeats,
    Schedules,
    Seed,
    SemanticsOption,
    Split,
    Target,
    Task,
    Temperature,
    ThresholdEnd,
    Thresholds,
    ThresholdStart,
    TopK,
    TopP,
    Turns,
)
from dspark_bench.errors import DsparkError


def run(
    target: Target = None, draft: Draft = None, task: Task = None, dataset: Dataset = None,
    prompts: PromptsFile = None, split: Split = "train", prompt_field: PromptField = None,
    category_field: CategoryField = None, limit: Limit = None, turns: Turns = "first",
    chat_template: ChatTemplate = "auto",
    metric: Metrics = None, schedule: Schedules = None, threshold: Thresholds = None,
    gamma_max: GammaMaxes = None, min_draft_len: MinDraftLens = None, semantics: SemanticsOption = None,
    goodput_model: GoodputModel = None, draft_mode: DraftModes = None, compiled: Compile = False,
    drafter: Drafters = None, ngram_min: NgramMin = 1, ngram_max: NgramMax = 3, heads: HeadsPath = None,
    threshold_start: ThresholdStart = 0.3, threshold_end: ThresholdEnd = 0.8, topk: TopK = 5,
    temperature: Temperature = 0.0, top_p: TopP = 1.0, max_new_tokens: MaxNewTokens = None, seed: Seed = 0,
    batch_size: BatchSizes = None, batching: Batching = "refill",
    engine: Annotated[str, typer.Option(help="The speculative side: ours | hf (HF assisted generation, HF's rule: --semantics hf, top1, --min-draft-len 0).")] = "ours",
    repeats: Repeats = 1,
    trace: Annotated[bool, typer.Option(help="Also write rounds.parquet, the per-round trace.")] = False,
    ignore_eos: IgnoreEos = False,
    device: Device = "auto", dtype: Dtype = "auto",
    calibration: Annotated[Optional[Path], typer.Option(help="Per-domain policies from `calibrate`: each prompt gets its category's.")] = None,
    config: Annotated[Optional[Path], typer.Option(help="Run what a run folder's run.json describes, again (other flags but --out are refused).")] = None,
    out: Annotated[Path, typer.Option(help="Folder that receives the run folder.")] = Path("results"),
):
    """Decode prompts with the speculative decoder and the autoregressive baseline; write a run folder.

    Example: dspark-bench run --task code --limit 10 --threshold 0.3 --threshold 0.5 --gamma-max 6
    Example: dspark-bench run --config results/20250101-120000-run-abc123/run.json
    """
    from dspark_bench.harness import run as lib  # the library loads torch: kept off --help

    flags = {name: value for name, value in locals().items() if name not in ("config", "out", "lib")}
    with cli_errors():
        with reporting("decoding") as (progress, say):
            if config is not None:
                refuse_other_flags(flags)
                folder, table = lib.rerun_from(config, out, progress, say)
            else:
                folder, table = lib.execute(config_from_flags(flags), out, progress, say)
        print_summary(folder, table)


def config_from_flags(flags: dict):
    """The RunConfig the flags describe: repeatable policy flags become the grid's lists."""
    from dspark_bench.harness.run import RunConfig  # the library loads torch: kept off --help

    values = {k: v for k, v in flags.items() if k not in ("prompts", "calibration", "batch_size")}
    values["batch_sizes"] = tuple(flags["batch_size"] or (1,))
    values["dataset"] = flags["dataset"] or flags["prompts"]
    if flags["dataset"] and flags["prompts"]:
        raise DsparkError("pass exactly one of --task, --dataset or --prompts (got --dataset and --prompts)")
    values["goodput_model"] = str(flags["goodput_model"]) if flags["goodput_model"] else ""
    grid = ("metric", "schedule", "threshold", "gamma_max", "min_draft_len", "semantics", "draft_mode", "drafter")
    if flags["calibration"] is not None and any(flags[name] for name in grid):
        raise DsparkError("--calibration chooses the policy; drop --metric/--schedule/--threshold/--gamma-max/"
                          "--min-draft-len/--semantics/--draft-mode/--drafter")
    for name in grid:
        if flags[name]:
            values[name] = tuple(flags[name])
        else:
            values.pop(name)
    return RunConfig(**values, calibration=str(flags["calibration"]) if flags["calibration"] else None)


def refuse_other_flags(flags: dict) -> None:
    """--config runs the file's config as it was: a flag that would change it is an error."""
    defaults = {name: param.default for name, param in _signature().parameters.items()}
    changed = [name for name, value in flags.items() if value not in (None, [], defaults.get(name))]
    if changed:
        raise DsparkError(f"--config runs the run.json's own config; drop {', '.join('--' + c.replace('_', '-') for c in changed)}")


def _signature():
    import inspect

    return inspect.signature(run)


def print_summary(folder: Path, table) -> None:
    from dspark_bench.metrics import summarize  # the library loads torch: kept off --help
    from dspark_bench.results import read_run  # the library loads torch: kept off --help

    info, samples = read_run(folder)
    models = info["models"]
    title = f"{info['prompts']['count']} prompts · {models['device']} · {models['dtype']}"
    title += " · EOS ignored" if info["settings"].get("ignore_eos") else ""
    title += " · speculative side: HF assisted generation" if info["settings"].get("engine") == "hf" else ""
    if "batch_size" in table and (table["batch_size"] > 1).any():
        title += f" · B>1: padded layout, {info['settings'].get('batching', 'refill')}ed batches"
    out_console.print(summary_table(table, title))
    if samples["category"].nunique() > 1:
        out_console.print(summary_table(summarize(samples, by=["category"]), "by category"))
    out_console.print(f"run folder: {folder}")

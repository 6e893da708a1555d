"""The `dspark-bench` command line: thin wrappers over the library.

Each command parses flags, builds a config, calls one library function and prints. Library
errors (DsparkError) become one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from dspark_bench.commands.options import (
    Target, Draft, Device, Dtype, Metrics, Schedules, Thresholds, GammaMaxes, MinDraftLens, ThresholdStart,
    ThresholdEnd, TopK, Temperature, TopP, MaxNewTokens, Seed, Task, Dataset, PromptsFile, Split, PromptField,
    CategoryField, Turns, ChatTemplate, Limit, SpecDevice, SpecDtype, Engine, IgnoreEos,
)
from dspark_bench.config import DecodeConfig
from dspark_bench.errors import DsparkError

app = typer.Typer(help="Find, measure and prove the best speculative-decoding policy.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
tasks_app = typer.Typer(help="Inspect the built-in tasks and validate task files.", no_args_is_help=True)
models_app = typer.Typer(help="The offline reference model pair.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")
app.add_typer(models_app, name="models")

def _console(stderr: bool = False) -> Console:
    # Tables of metrics are wide: off a terminal (CI logs, pipes) do not wrap them at 80 columns.
    probe = Console(stderr=stderr)
    return Console(stderr=stderr, width=None if probe.is_terminal else 200)


out_console = _console()
err_console = _console(stderr=True)


def quiet_libraries() -> None:
    """Our own progress bars are enough; silence transformers' and datasets' chatter."""
    import datasets
    import optuna
    import transformers

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()


@contextlib.contextmanager
def cli_errors():
    """Turn library errors into one clean line and a non-zero exit."""
    try:
        yield
    except DsparkError as err:
        err_console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err_console.print("interrupted", highlight=False)
        raise typer.Exit(130) from None


def progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), console=err_console, transient=False,
    )


def stage_progress(bar: Progress, job):
    """The library's progress callback (stage, done, total) drawn on one bar."""

    def update(stage: str, done: int, total: int) -> None:
        bar.update(job, description=stage, completed=done, total=total)

    return update




def decode_configs(metrics, schedules, thresholds, gamma_maxes, min_draft_lens, **fixed) -> list[DecodeConfig]:
    """Every combination of the repeatable policy flags, as validated configs."""
    grid = itertools.product(metrics or ["top1"], schedules or ["threshold"], thresholds or [0.5],
                             gamma_maxes or [5], min_draft_lens or [1])
    return [
        DecodeConfig(metric=m, schedule=s, threshold=t, gamma_max=g, min_draft_len=n, **fixed)
        for m, s, t, g, n in grid
    ]


def resolve_prompts(task, dataset, prompts_file, split, prompt_field, category_field, limit):
    """(prompts, description of their source, the task's default max_new_tokens or None)."""
    from dspark_bench.tasks import get_task, load_dataset_prompts, load_task

    chosen = [name for name, value in (("--task", task), ("--dataset", dataset), ("--prompts", prompts_file)) if value]
    if len(chosen) != 1:
        raise DsparkError("pass exactly one of --task, --dataset or --prompts" + (f" (got {', '.join(chosen)})" if chosen else ""))
    if task:
        spec = get_task(task)
        return load_task(task, limit), {"task": spec.name, "task_version": spec.version, "domain": spec.domain}, spec.max_new_tokens
    source = dataset or prompts_file
    prompts = load_dataset_prompts(source, split, prompt_field, category_field, limit)
    return prompts, {"dataset": source, "split": split}, None


# Sampling's extra columns, short enough to keep the table on one line per configuration.
SHORT_HEADERS = {"baseline_mean_new_tokens": "baseline mean len", "spec_mean_new_tokens": "spec mean len",
                 "baseline_tokens_per_s": "baseline tok/s", "spec_tokens_per_s": "spec tok/s"}


def summary_table(table, title: str) -> Table:
    view = Table(title=title, title_justify="left")
    columns = ["config_label", "prompts", "avg_draft_len", "acceptance_rate", "block_acceptance_rate",
               "accepted_per_round", "tokens_per_round", "speedup"]
    if "identical_to_baseline" in table and table["identical_to_baseline"].notna().any():
        columns.append("identical_to_baseline")  # greedy: outputs must equal the target's own
    elif "spec_mean_new_tokens" in table:
        # Sampling: each side's mean sample length and tokens/s, so differing lengths show at once.
        columns += ["baseline_mean_new_tokens", "spec_mean_new_tokens", "baseline_tokens_per_s", "spec_tokens_per_s"]
    extra = [c for c in ("category",) if c in table]
    for name in extra + columns:
        header = SHORT_HEADERS.get(name, name.replace("_", " "))
        view.add_column(header, justify="left" if name in ("config_label", "category") else "right")
    for row in table.to_dict(orient="records"):
        cells = [str(row[c]) for c in extra]
        for name in columns:
            value = row.get(name)
            if name == "speedup" and value is not None:
                cells.append(f"{value:.2f}× [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]")
            elif isinstance(value, float):
                cells.append(f"{value:.3f}")
            else:
                cells.append("" if value is None else str(value))
        view.add_row(*cells)
    return view


@app.command()
def run(
    target: Target = None, draft: Draft = None, task: Task = None, dataset: Dataset = None,
    prompts: PromptsFile = None, split: Split = "train", prompt_field: PromptField = None,
    category_field: CategoryField = None, limit: Limit = None, turns: Turns = "first",
    chat_template: ChatTemplate = "auto",
    metric: Metrics = None, schedule: Schedules = None, threshold: Thresholds = None,
    gamma_max: GammaMaxes = None, min_draft_len: MinDraftLens = None,
    threshold_start: ThresholdStart = 0.3, threshold_end: ThresholdEnd = 0.8, topk: TopK = 5,
    temperature: Temperature = 0.0, top_p: TopP = 1.0, max_new_tokens: MaxNewTokens = None, seed: Seed = 0,
    repeats: Annotated[int, typer.Option(help="Timed baseline/speculative pairs per prompt (medians kept); the side that runs first alternates.")] = 1,
    trace: Annotated[bool, typer.Option(help="Also write rounds.parquet, the per-round trace.")] = False,
    ignore_eos: IgnoreEos = False,
    device: Device = "auto", dtype: Dtype = "auto",
    calibration: Annotated[Optional[Path], typer.Option(help="Per-domain policies from `calibrate`: each prompt gets its category's.")] = None,
    out: Annotated[Path, typer.Option(help="Folder that receives the run folder.")] = Path("results"),
):
    """Decode prompts with the speculative decoder and the autoregressive baseline; write a run folder.

    Example: dspark-bench run --task code --limit 10 --threshold 0.3 --threshold 0.5 --gamma-max 6
    """
    from dspark_bench.models import load_pair
    from dspark_bench.results import check_writable
    from dspark_bench.runner import RunnerSettings, planned_samples, run_to_folder

    with cli_errors():
        if turns not in ("first", "all"):
            raise DsparkError(f"--turns must be first or all (got {turns!r})")
        if repeats < 1:
            raise DsparkError(f"--repeats must be at least 1 (got {repeats})")
        check_writable(out)
        prompt_list, source, task_tokens = resolve_prompts(task, dataset, prompts, split, prompt_field, category_field, limit)
        configs = decode_configs(
            metric, schedule, threshold, gamma_max, min_draft_len, threshold_start=threshold_start,
            threshold_end=threshold_end, topk=topk, temperature=temperature, top_p=top_p, seed=seed,
            max_new_tokens=max_new_tokens if max_new_tokens is not None else (task_tokens or 128),
        )
        assignment = None
        if calibration is not None:
            if metric or schedule or threshold or gamma_max or min_draft_len:
                raise DsparkError("--calibration chooses the policy; drop --metric/--schedule/--threshold/--gamma-max/--min-draft-len")
            configs, assignment = calibrated_configs(calibration, prompt_list, configs[0])
        pair = load_pair(target, draft, device, dtype)
        if calibration is not None:
            from dspark_bench.calibrate import load_calibration

            load_calibration(calibration).check_models(pair.describe())
        settings = RunnerSettings(repeats=repeats, trace=trace, chat_template=chat_template, turns=turns,
                                  ignore_eos=ignore_eos)
        samples = planned_samples(prompt_list, configs, settings, assignment)
        with progress_bar() as bar:
            job = bar.add_task("decoding", total=samples)
            folder, table = run_to_folder(pair, prompt_list, configs, out, settings, source,
                                          progress=lambda: bar.advance(job), assignment=assignment,
                                          say=bar.console.print)
        title = f"{len(prompt_list)} prompts · {pair.device} · {pair.dtype}" + (" · EOS ignored" if ignore_eos else "")
        out_console.print(summary_table(table, title))
        if len({p.category for p in prompt_list}) > 1:
            from dspark_bench.metrics import summarize
            from dspark_bench.results import read_run

            _, samples = read_run(folder)
            out_console.print(summary_table(summarize(samples, by=["category"]), "by category"))
        out_console.print(f"run folder: {folder}")


def calibrated_configs(path: Path, prompts, base: DecodeConfig) -> tuple[list[DecodeConfig], list[int]]:
    """The distinct calibrated policies, and for each prompt the index of its own."""
    from dspark_bench.calibrate import load_calibration

    per_prompt = load_calibration(path).configs_for(prompts, base=base)
    configs = list(dict.fromkeys(per_prompt))
    return configs, [configs.index(c) for c in per_prompt]


def render_rounds(tokenizer, result, markers: bool = False) -> Text:
    """Accepted draft tokens green, rejected ones red and struck through, the target's own bold.

    With `markers` (no colour: a pipe or a log), rejected tokens read [-x-] and the target's {x}.
    """
    text = Text()
    for r in result.rounds:
        for i, token in enumerate(r.draft_tokens):
            piece = tokenizer.decode([token])
            if i < r.accepted:
                text.append(piece, style="green")
            else:
                text.append(f"[-{piece}-]" if markers else piece, style="red strike")
        if r.target_token >= 0:
            piece = tokenizer.decode([r.target_token])
            text.append(f"{{{piece}}}" if markers else piece, style="bold cyan")
    return text


@app.command()
def decode(
    text: Annotated[str, typer.Argument(help="The prompt.")],
    target: Target = None, draft: Draft = None, chat_template: ChatTemplate = "auto",
    metric: Annotated[str, typer.Option(help="top1 | entropy | topk_mass | margin")] = "top1",
    schedule: Annotated[str, typer.Option(help="threshold | ramp | cumulative | fixed")] = "threshold",
    threshold: Annotated[float, typer.Option(help="Stop drafting below this confidence.")] = 0.5,
    gamma_max: Annotated[int, typer.Option(help="Most draft tokens per round.")] = 5,
    min_draft_len: Annotated[int, typer.Option(help="Fewest draft tokens per round.")] = 1,
    threshold_start: ThresholdStart = 0.3, threshold_end: ThresholdEnd = 0.8, topk: TopK = 5,
    temperature: Temperature = 0.0, top_p: TopP = 1.0, max_new_tokens: MaxNewTokens = None, seed: Seed = 0,
    device: Device = "auto", dtype: Dtype = "auto",
    calibration: Annotated[Optional[Path], typer.Option(help="Take the policy from a calibration file.")] = None,
    domain: Annotated[Optional[str], typer.Option(help="With --calibration: the prompt's domain (default: the global policy).")] = None,
):
    """Generate once and show every round: accepted (green), rejected (red), target's token (bold).

    Example: dspark-bench decode "def fibonacci(n):" --threshold 0.4
    """
    from dspark_bench.engine import speculative_decode
    from dspark_bench.models import load_pair
    from dspark_bench.prompts import encode
    from dspark_bench.runner import sample_row

    with cli_errors():
        config = DecodeConfig(metric=metric, schedule=schedule, threshold=threshold, gamma_max=gamma_max,
                              min_draft_len=min_draft_len, threshold_start=threshold_start,
                              threshold_end=threshold_end, topk=topk, temperature=temperature, top_p=top_p,
                              max_new_tokens=128 if max_new_tokens is None else max_new_tokens, seed=seed)
        if calibration is not None:
            from dspark_bench.calibrate import load_calibration

            config = load_calibration(calibration).policy_for(domain or "", strict=domain is not None, base=config)
            out_console.print(f"policy: {config.label()}", highlight=False)
        pair = load_pair(target, draft, device, dtype)
        ids = encode(pair.tokenizer, text, chat_template)
        result = speculative_decode(pair.target, pair.draft, ids, config, pair.eos_ids)
        markers = not out_console.is_terminal or out_console.no_color
        out_console.print(Text(text, style="dim") + render_rounds(pair.tokenizer, result, markers))
        if markers:
            out_console.print("(plain draft tokens were accepted, [-x-] rejected, {x} is the target's own token)")
        row = sample_row(result, config)
        metrics = {k: row[k] for k in ("rounds", "new_tokens", "avg_draft_len", "acceptance_rate",
                                       "block_acceptance_rate", "accepted_per_round", "tokens_per_round")}
        out_console.print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))
        stops = {k.removeprefix("stop_"): row[k] for k in row if k.startswith("stop_") and row[k]}
        out_console.print("stop reasons: " + ", ".join(f"{k} {v}" for k, v in stops.items()))


@tasks_app.command("ls")
def tasks_ls():
    """List the built-in tasks. Example: dspark-bench tasks ls"""
    from dspark_bench.tasks import registry

    with cli_errors():
        view = Table(title="built-in tasks", title_justify="left")
        for column in ("name", "domain", "prompts", "max new tokens", "version", "source"):
            view.add_column(column)
        for spec in registry().values():
            view.add_row(spec.name, spec.domain, str(spec.count), str(spec.max_new_tokens), str(spec.version), spec.source)
        out_console.print(view)


@tasks_app.command("show")
def tasks_show(name: str, n: Annotated[int, typer.Option(help="How many prompts to show.")] = 3):
    """Show a task's settings and a few of its prompts. Example: dspark-bench tasks show code --n 2"""
    from dspark_bench.prompts import prompts_fingerprint
    from dspark_bench.tasks import get_task, load_task

    with cli_errors():
        spec = get_task(name)
        prompts = load_task(name)
        out_console.print(f"[bold]{spec.name}[/] v{spec.version} · domain {spec.domain} · {len(prompts)} prompts · "
                          f"fingerprint {prompts_fingerprint(prompts)}\n{spec.description}", highlight=False)
        for prompt in prompts[:n]:
            out_console.rule(f"{prompt.id} [{prompt.category}]")
            out_console.print(Text(prompt.text))


@tasks_app.command("validate")
def tasks_validate(path: Path):
    """Check a task file. Example: dspark-bench tasks validate my_task.yaml"""
    from dspark_bench.tasks import validate_task_file

    with cli_errors():
        spec = validate_task_file(path)
        out_console.print(f"ok: task {spec.name!r} (domain {spec.domain}, source {spec.source})", highlight=False)


@models_app.command("info")
def models_info():
    """What the shipped reference pair is. Example: dspark-bench models info"""
    from dspark_bench.reference import info

    with cli_errors():
        report = info()
        view = Table(title="reference pair", title_justify="left")
        for column in ("model", "layers × hidden", "params", "train min", "tokens seen",
                       "val loss code", "val loss prose", "val loss structured"):
            view.add_column(column, justify="left" if column == "model" else "right")
        for name, model in report["models"].items():
            loss = model["val_loss"]
            view.add_row(name, f"{model['layers']} × {model['hidden']}", f"{model['params'] / 1e6:.1f} M",
                         f"{model['train_minutes']:.0f}", f"{model['tokens_seen'] / 1e6:.2f} M",
                         f"{loss['code']:.3f}", f"{loss['prose']:.3f}", f"{loss['structured']:.3f}")
        out_console.print(view)
        agreement = ", ".join(f"{d} {v:.3f}" for d, v in report["agreement_top1"].items())
        out_console.print(f"draft/target top-1 agreement on held-out text: {agreement}")
        out_console.print("corpus fingerprints: " + ", ".join(f"{k} {v}" for k, v in report["corpus"]["fingerprints"].items()))
        policies = report.get("policy", {})
        if policies:
            view = Table(title="best policy per task (measured with `dspark-bench run`)", title_justify="left")
            for column in ("task", "policy", "tokens_per_round", "acceptance_rate", "speedup", "command"):
                view.add_column(column)
            for task, row in policies.items():
                view.add_row(task, row["policy"], f"{row['tokens_per_round']:.3f}", f"{row['acceptance_rate']:.3f}",
                             f"{row['speedup']:.2f}× [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]",
                             row["command"])
            out_console.print(view)
        versions = report.get("versions", {})
        out_console.print("built with " + ", ".join(f"{k} {v}" for k, v in versions.items()))


@models_app.command("build")
def models_build(
    out: Annotated[Path, typer.Option(help="Build folder (checkpoints; an interrupted build resumes).")] = Path("build/reference"),
    minutes: Annotated[float, typer.Option(help="Training time budget for target + draft.")] = 100.0,
):
    """Rebuild the reference pair from the local install's text. Example: dspark-bench models build --minutes 100"""
    from dspark_bench.reference import build

    with cli_errors():
        build(out=out, minutes=minutes)


@app.command()
def sweep(
    spec: Annotated[Optional[Path], typer.Option(help="Sweep specification (YAML), e.g. sweeps/code.yaml.")] = None,
    task: Task = None, dataset: Dataset = None, limit: Limit = None,
    target: Target = None, draft: Draft = None, device: SpecDevice = None, dtype: SpecDtype = None,
    method: Annotated[Optional[str], typer.Option(help="grid (Optuna's GridSampler) | optuna (TPE).")] = None,
    engine: Engine = None,
    trials: Annotated[Optional[int], typer.Option(help="Optuna budget (grid: the whole grid).")] = None,
    objective: Annotated[Optional[str], typer.Option(help="speedup | tokens_per_round | ...; two, comma-separated, for a Pareto front.")] = None,
    storage: Annotated[Optional[str], typer.Option(help="Optuna storage URL (sqlite:///, postgresql://, journal:///path) (default: SQLite in the run folder).")] = None,
    study: Annotated[Optional[str], typer.Option(help="Study name, shared by workers on one storage.")] = None,
    workers: Annotated[int, typer.Option(help="Local worker processes on the same study.")] = 1,
    resume: Annotated[Optional[Path], typer.Option(help="Continue this sweep's run folder where it stopped.")] = None,
    confirm_top: Annotated[Optional[int], typer.Option(help="Replay: confirm this many best policies with timed runs.")] = None,
    repeats: Annotated[Optional[int], typer.Option(help="Timed pairs per prompt and trial.")] = None,
    max_new_tokens: MaxNewTokens = None, temperature: Annotated[Optional[float], typer.Option(help="0 = greedy.")] = None,
    ignore_eos: IgnoreEos = False,
    metric: Metrics = None, schedule: Schedules = None, threshold: Thresholds = None,
    gamma_max: GammaMaxes = None, min_draft_len: MinDraftLens = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override any spec field: key=value (YAML value), e.g. space.threshold=[0.2,0.4].")] = None,
    out: Annotated[Path, typer.Option(help="Folder that receives the run folder.")] = Path("results"),
    worker_only: Annotated[bool, typer.Option(hidden=True)] = False,
):
    """Search the policy's knobs over a task: replay (exact, greedy), grid or Optuna; resumable.

    Example: dspark-bench sweep --task code --spec sweeps/code.yaml --limit 10
    """
    import yaml

    from dspark_bench import sweep as sweeps

    with cli_errors():
        if resume is not None:
            with progress_bar() as bar:
                job = bar.add_task("trials", total=None)
                table = sweeps.continue_sweep(resume, workers=workers, worker_only=worker_only,
                                              progress=stage_progress(bar, job), storage=storage)
            if table is not None:
                _print_best(table, resume, sweeps.result_title(resume))
            return
        overrides = sweeps.flag_overrides(
            dict(task=task, dataset=dataset, limit=limit, target=target, draft=draft, device=device, dtype=dtype,
                 method=method, engine=engine, trials=trials, objective=objective, confirm_top=confirm_top,
                 repeats=repeats, max_new_tokens=max_new_tokens, temperature=temperature,
                 ignore_eos=ignore_eos or None),
            dict(metric=metric, schedule=schedule, threshold=threshold, gamma_max=gamma_max,
                 min_draft_len=min_draft_len))
        if task is not None or dataset is not None:
            overrides.update(task=task, dataset=dataset)
        for item in set_ or []:
            key, sep, value = item.partition("=")
            if not sep:
                raise DsparkError(f"--set takes key=value (got {item!r})")
            try:
                overrides[key.strip()] = yaml.safe_load(value)
            except yaml.YAMLError as err:
                raise DsparkError(f"--set {key.strip()}: not a valid YAML value ({str(err).splitlines()[0]})") from None
        sweep_spec, origin = sweeps.resolve_spec(spec, overrides)
        out_console.print(origin, highlight=False)
        with progress_bar() as bar:
            job = bar.add_task("sweep", total=None)
            folder, table = sweeps.run_sweep(sweep_spec, out, storage, study, workers,
                                             progress=stage_progress(bar, job), say=bar.console.print)
        _print_best(table, folder, sweeps.result_title(folder))


def _print_best(table, folder, title: str = "best configurations") -> None:
    columns = [c for c in ("config_label", "predicted_speedup", "speedup", "speedup_low", "speedup_high",
                           "tokens_per_round", "acceptance_rate", "avg_draft_len", "block_acceptance_rate",
                           "identical_to_baseline", "state") if c in table]
    view = Table(title=title, title_justify="left")
    for name in columns:
        view.add_column(name.replace("_", " "), justify="left" if name in ("config_label", "state") else "right")
    for row in table.head(10).to_dict(orient="records"):
        view.add_row(*[f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in columns])
    out_console.print(view)
    out_console.print(f"run folder: {folder}")


def _register_commands() -> None:
    # Commands that live in their own modules (they import this one for its helpers).
    from dspark_bench.commands.calibrate import calibrate
    from dspark_bench.commands.regress import regress
    from dspark_bench.commands.report import report

    app.command()(report)
    app.command()(regress)
    app.command()(calibrate)


_register_commands()


@app.callback()
def _setup() -> None:
    quiet_libraries()


def main() -> None:
    app()


if __name__ == "__main__":
    main()

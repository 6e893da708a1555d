"""What every command shares: the consoles, clean one-line errors, progress bars, tables."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from dspark_bench.errors import DsparkError
from dspark_bench.sections.base import BEFORE_TABLE, UNDER_HEADLINE, UNDER_TABLE, Line, Rows, cell
from dspark_bench.sections.engine_verdict import EngineVerdict


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
def cli_errors(status: int = 1):
    """Turn library errors into one clean line and a non-zero exit (`status`)."""
    try:
        yield
    except DsparkError as err:
        err_console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(status) from None
    except KeyboardInterrupt:
        err_console.print("interrupted", highlight=False)
        raise typer.Exit(130) from None


def progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), console=err_console, transient=False,
    )


@contextlib.contextmanager
def reporting(description: str):
    """(progress, say) for a library call: `progress(stage, done, total)` drives one bar and
    `say(line)` prints above it. The bar starts at the first call, so a command that fails its
    checks before any work prints its one error line and nothing else."""
    state: dict = {}

    def started() -> Progress:
        if not state:
            state["bar"] = progress_bar()
            state["bar"].start()
            state["job"] = state["bar"].add_task(description, total=None)
        return state["bar"]

    def progress(stage: str, done: int, total: int) -> None:
        started().update(state["job"], description=stage, completed=done, total=total)

    def say(*args, **kwargs) -> None:
        started().console.print(*args, **kwargs)

    try:
        yield progress, say
    finally:
        if state:
            state["bar"].stop()


# Sampling's extra columns, short enough to keep the table on one line per configuration.
SHORT_HEADERS = {"baseline_mean_new_tokens": "baseline mean len", "spec_mean_new_tokens": "spec mean len",
                 "baseline_tokens_per_s": "baseline tok/s", "spec_tokens_per_s": "spec tok/s",
                 "spec_latency_per_token_s": "spec s/token/request"}


def run_table(table, title: str) -> Table:
    """A run's policies in 100 columns, labels on one line: policy · speedup [95 % CI] · tokens per
    round · acceptance · draft length · whether the output is the target's own (the rest: --wide,
    and the run folder's files)."""
    extra = ["category"] if "category" in table else []
    view = compact_table(title, (*extra, "policy", "speedup [95 % CI]", "tok/rnd", "accept", "draft", "= target"))
    for row in table.to_dict(orient="records"):
        view.add_row(*[str(row[c]) for c in extra], str(row["config_label"]), measured_cell(row),
                     cell(row.get("tokens_per_round"), 2), cell(row.get("acceptance_rate"), 2),
                     cell(row.get("avg_draft_len"), 2), same_output(row))
    return view


def same_output(row: dict) -> str:
    """Greedy: "yes" where every output equals the target's own, else the share that does (of the
    positions where the run measured them, reduced precision; else of the outputs); sampling:
    empty (outputs are samples)."""
    identical = row.get("identical_to_baseline")
    if identical is None or identical != identical:
        return ""
    if identical >= 1:
        return "yes"
    share = row.get("identical_share")
    return f"{identical if share is None or share != share else share:.0%}"


def summary_table(table, title: str) -> Table:
    view = Table(title=title, title_justify="left")
    columns = ["config_label", "prompts", "avg_draft_len", "acceptance_rate", "block_acceptance_rate",
               "accepted_per_round", "tokens_per_round", "speedup"]
    if "identical_to_baseline" in table and table["identical_to_baseline"].notna().any():
        columns.append("identical_to_baseline")  # greedy: outputs must equal the target's own
        if "identical_share" in table and (table["identical_to_baseline"] < 1).any():
            columns.append("identical_share")  # reduced precision: how much still matches
    elif "spec_mean_new_tokens" in table:
        # Sampling: each side's mean sample length and tokens/s, so differing lengths show at once.
        columns += ["baseline_mean_new_tokens", "spec_mean_new_tokens", "baseline_tokens_per_s", "spec_tokens_per_s"]
    if "batch_size" in table and (table["batch_size"] > 1).any() and "spec_tokens_per_s" not in columns:
        # Batched runs: throughput of each side, and what a request waits per token.
        columns += ["baseline_tokens_per_s", "spec_tokens_per_s", "spec_latency_per_token_s"]
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


def measured_by(prices: dict) -> str:
    """Who measured a sweep's prices (summary.json's "prices"): "ours" (our decoder) or an engine's
    name; sweeps written before the key was "measured_by" called it "engine"."""
    return prices.get("measured_by", prices.get("engine", "ours"))


def print_best(result, wide: bool = False) -> None:
    """A finished sweep's best policies (a tuning SweepResult): a table that fits 100 columns,
    policy labels on one line (`wide`: every column the sweep has), then its analyses, headline
    and health."""
    from dspark_bench.sections import registry  # the sections' libraries: loaded when a sweep has finished
    from dspark_bench.sections.analyses import Analyses  # as the registry
    from dspark_bench.sections.sampling import Sampling  # as the registry

    summary, folder, title = result.summary, result.folder, result.title()
    if summary.get("predictions_trusted") is False:
        title += " · predicted speedups untrustworthy (the cost table never passed its timing checks)"
    if summary.get("prices") and measured_by(summary["prices"]) != "ours":  # whose costs every prediction used
        title += " · measured on our decoder, which confirms"
    print_shown(registry.console(result.sections, BEFORE_TABLE))
    view = wide_table(result.table, title) if wide else narrow_table(result.table, title, summary)
    out_console.print(view)
    print_shown(registry.console(result.sections, UNDER_TABLE))
    print_headline(summary)
    print_shown(registry.console(result.sections, UNDER_HEADLINE))
    print_health(summary)
    out_console.print(f"run folder: {folder}")
    studied = registry.find(result.sections, Analyses) or registry.find(result.sections, Sampling)
    if summary.get("evaluation") == "replay" and studied is None:
        out_console.print(f"more: dspark-bench analyze {folder} (what any stopping rule could win here, how well "
                          f"each signal predicts acceptance); dspark-bench report {folder}", style="dim",
                          highlight=False, soft_wrap=True)


def narrow_table(table, title: str, summary: dict) -> Table:
    """policy · predicted · measured [95 % CI] · tokens per round · acceptance · draft length:
    under 100 columns, the labels unwrapped (no rules between columns, one space apart; headers
    of one line, which rich measures right). Whose prices predicted is the title's last words."""
    prices = summary.get("prices") or {}
    whose = "our decoder" if measured_by(prices) == "ours" else prices["label"]
    rows = table.head(10).to_dict(orient="records")
    view = compact_table(f"{title} · predicted on {whose}'s prices",
                         ("policy", "predicted", "measured [95 % CI]", "tok/rnd", "accept", "draft"))
    for row in rows:
        view.add_row(str(row["config_label"]), cell(row.get("predicted_speedup")), measured_cell(row),
                     cell(row.get("tokens_per_round"), 2), cell(row.get("acceptance_rate"), 2),
                     cell(row.get("avg_draft_len"), 2))
    return view


def compact_table(title: str, headers) -> Table:
    """A table for 100 columns: no rules between columns (the box's own space between them), no
    edges, the policy (and a category) left-aligned and the policy label never wrapped."""
    from rich import box

    view = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, padding=0)
    for header in headers:
        view.add_column(header, justify="left" if header in ("policy", "category") else "right",
                        no_wrap=header == "policy")
    return view


def measured_cell(row: dict) -> str:
    """A confirmed policy's measured speedup and its 95 % interval; empty where it was not run."""
    measured = cell(row.get("speedup"))
    if measured and row.get("speedup_low") is not None and row["speedup_low"] == row["speedup_low"]:
        measured += f" [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]"
    return measured

def wide_table(table, title: str) -> Table:
    """Every column the sweep's table has (`--wide`)."""
    columns = [c for c in ("config_label", "predicted_speedup", "predicted_speedup_ours", "speedup", "speedup_low",
                           "speedup_high", "tokens_per_round", "acceptance_rate", "avg_draft_len",
                           "block_acceptance_rate", "identical_to_baseline", "same_as", "state")
               if c in table and table[c].notna().any()]
    view = Table(title=title, title_justify="left")
    for name in columns:
        view.add_column(name.replace("_", " "), justify="left" if name in ("config_label", "state") else "right")
    for row in table.head(10).to_dict(orient="records"):
        view.add_row(*[cell(row[c]) for c in columns])
    return view


def print_headline(summary: dict) -> None:
    """The paired verdict of the best scheduled policy against the best fixed γ (and what a
    precision target's passes did): a run's or a sweep's first answer."""
    verdict = EngineVerdict.from_json(summary)
    if summary.get("headline"):
        mine = "on our decoder, " if verdict else ""
        out_console.print(f"{mine}scheduled vs best fixed γ, paired on the same prompts: "
                          f"{summary['headline']['sentence']}", style="dim" if verdict else "bold", highlight=False,
                          soft_wrap=True)
    if summary.get("precision"):
        out_console.print(summary["precision"]["sentence"], highlight=False, soft_wrap=True)


def print_verdicts(summary: dict) -> None:
    """Each policy against the best fixed γ at its batch size, paired on the same prompts."""
    rows = [[v["candidate"], v["reference"], f"{v['ratio']:.3f} [{v['low']:.3f}, {v['high']:.3f}]", v["verdict"],
             f"±{v['half_width']:.1%}"] for v in summary.get("verdicts", [])]
    title = ("paired on the same prompts: the reference's seconds per token over the policy's (> 1: the policy "
             "is faster), 95 % interval")
    if rows:
        print_small_table(title, ("policy", "against", "ratio", "verdict", "detectable"), rows,
                          left=("policy", "against", "verdict"))
    print_headline(summary)


def print_shown(shown: list[Rows | Line]) -> None:
    """A section's console rows (sections/base.py): its tables and its lines, in order."""
    for item in shown:
        if isinstance(item, Rows):
            print_small_table(item.title, item.columns, item.rows, item.left)
        else:
            out_console.print(item.text, style=item.style, highlight=False, soft_wrap=True)


def print_small_table(title: str, columns: tuple[str, ...], rows: list[list[str]], left: tuple[str, ...] = ()) -> None:
    """A titled table of pre-formatted cells (numbers right-aligned); nothing when there are no rows."""
    if not rows:
        return
    view = Table(title=title, title_justify="left")
    for name in columns:
        view.add_column(name, justify="left" if name in left else "right")
    for row in rows:
        view.add_row(*row)
    out_console.print(view)


def read_summary(folder) -> dict:
    """A finished run folder's summary.json ({} when there is none yet)."""
    path = Path(folder) / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


HEALTH_STYLE = {"ok": "dim", "noisy": "yellow", "unreliable": "bold red"}


def print_health(summary: dict) -> None:
    """The line under a table saying whether its timings can be trusted (summary's timing_health)."""
    health = summary.get("timing_health")
    if health:
        out_console.print(health["headline"], style=HEALTH_STYLE[health["verdict"]], highlight=False, soft_wrap=True)

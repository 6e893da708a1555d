"""`dspark-bench tasks ls | show NAME | validate FILE`: the built-in tasks and task files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from dspark_bench.cli.console import cli_errors, out_console

tasks_app = typer.Typer(help="Inspect the built-in tasks and validate task files.", no_args_is_help=True)


@tasks_app.command("ls")
def tasks_ls():
    """List the built-in tasks. Example: dspark-bench tasks ls"""
    from dspark_bench.tasks import registry  # loaded when the command runs, not for --help

    with cli_errors():
        view = Table(title="built-in tasks", title_justify="left")
        for column in ("name", "domain", "prompts", "max new tokens", "version", "pair", "source"):
            view.add_column(column)
        for spec in registry().values():  # pair: the shipped reference pair it loads when no model is named
            view.add_row(spec.name, spec.domain, str(spec.count), str(spec.max_new_tokens), str(spec.version),
                         spec.pair, spec.source)
        out_console.print(view)


@tasks_app.command("show")
def tasks_show(name: str, n: Annotated[int, typer.Option(help="How many prompts to show.")] = 3):
    """Show a task's settings and a few of its prompts. Example: dspark-bench tasks show code --n 2"""
    from dspark_bench.tasks import get_task, load_task  # loaded when the command runs, not for --help
    from dspark_bench.tasks.prompts import prompts_fingerprint  # loaded when the command runs, not for --help

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
    from dspark_bench.tasks import validate_task_file  # loaded when the command runs, not for --help

    with cli_errors():
        spec = validate_task_file(path)
        out_console.print(f"ok: task {spec.name!r} (domain {spec.domain}, source {spec.source})", highlight=False)

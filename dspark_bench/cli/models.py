"""`dspark-bench models info | build`: the offline reference pair."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dspark_bench.cli.console import cli_errors, out_console

models_app = typer.Typer(help="The offline reference model pair.", no_args_is_help=True)


@models_app.command("info")
def models_info():
    """What the shipped reference pair is. Example: dspark-bench models info"""
    from dspark_bench.reference import info

    with cli_errors():
        report = info()
        for line in describe_reference(report):
            out_console.print(line)


def describe_reference(report: dict) -> list:
    """What `models info` prints: the models, agreement, corpus, measured policies, versions."""
    view = Table(title="reference pair", title_justify="left")
    for column in ("model", "layers × hidden", "params", "train min", "tokens seen",
                   "val loss code", "val loss prose", "val loss structured"):
        view.add_column(column, justify="left" if column == "model" else "right")
    for name, model in report["models"].items():
        loss = model["val_loss"]
        view.add_row(name, f"{model['layers']} × {model['hidden']}", f"{model['params'] / 1e6:.1f} M",
                     f"{model['train_minutes']:.0f}", f"{model['tokens_seen'] / 1e6:.2f} M",
                     f"{loss['code']:.3f}", f"{loss['prose']:.3f}", f"{loss['structured']:.3f}")
    lines = [view, "draft/target top-1 agreement on held-out text: "
             + ", ".join(f"{d} {v:.3f}" for d, v in report["agreement_top1"].items()),
             "corpus fingerprints: " + ", ".join(f"{k} {v}" for k, v in report["corpus"]["fingerprints"].items())]
    policies = report.get("policy", {})
    if policies:
        view = Table(title="best policy per task (measured with `dspark-bench run`)", title_justify="left")
        for column in ("task", "policy", "tokens_per_round", "acceptance_rate", "speedup", "command"):
            view.add_column(column)
        for task, row in policies.items():
            view.add_row(task, row["policy"], f"{row['tokens_per_round']:.3f}", f"{row['acceptance_rate']:.3f}",
                         f"{row['speedup']:.2f}× [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]",
                         row["command"])
        lines.append(view)
    lines.append("built with " + ", ".join(f"{k} {v}" for k, v in report.get("versions", {}).items()))
    return lines


@models_app.command("build")
def models_build(
    out: Annotated[Path, typer.Option(help="Build folder (checkpoints; an interrupted build resumes).")] = Path("build/reference"),
    minutes: Annotated[float, typer.Option(help="Training time budget for target + draft.")] = 100.0,
):
    """Rebuild the reference pair from the local install's text. Example: dspark-bench models build --minutes 100"""
    from dspark_bench.reference import build

    with cli_errors():
        build(out=out, minutes=minutes)

"""`dspark-bench models info | build`: the offline reference pair."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from dspark_bench.cli.console import cli_errors, out_console
from dspark_bench.cli.declared import fields_of, with_options
from dspark_bench.cli.options import command_options
from dspark_bench.errors import DsparkError
from dspark_bench.harness.workload import Workload

models_app = typer.Typer(help="The offline reference model pair.", no_args_is_help=True)


@models_app.command("info")
def models_info():
    """What the shipped reference pair is. Example: dspark-bench models info"""
    from dspark_bench.reference import info  # loaded when the command runs, not for --help

    with cli_errors():
        report = info()
        for line in describe_reference(report):
            out_console.print(line)
        from dspark_bench.reference.long import long_pair_paths  # loaded when the command runs, not for --help

        long_report = long_pair_paths()[0].parent / "reference.json"
        if long_report.is_file():  # the long-context pair, where it is built (docs/depth.md)
            import json

            for line in describe_long(json.loads(long_report.read_text())):
                out_console.print(line)
        from dspark_bench.reference import default_heads_path  # loaded when the command runs, not for --help

        shipped_heads = default_heads_path() / "heads.json"
        if shipped_heads.is_file():  # the heads drafter's heads on the shipped target
            import json

            out_console.print(describe_heads(json.loads(shipped_heads.read_text())))


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
@command_options("out", defaults={"out": None}, helps={
    "out": "Build folder (checkpoints; an interrupted build resumes). Default: build/reference, or build/heads "
           "with --heads."})
@with_options(None, fields_of(Workload, ("target",)),
              helps={"target": "With --heads: the target to train them on (default: the shipped one)."})
def models_build(
    *, out: Path | None,
    minutes: Annotated[Optional[float], typer.Option(help="Training time budget: target + draft (default 100), "
                                                          "or the heads (default 20).")] = None,
    heads: Annotated[bool, typer.Option("--heads", help="Train multi-token heads on the frozen target "
                                                        "(the heads drafter) instead of the pair.")] = False,
    long: Annotated[bool, typer.Option("--long", help="Build the long-context pair (4,096 tokens) from the shipped "
                                                      "one instead (default 40 minutes; docs/depth.md).")] = False,
    count: Annotated[int, typer.Option(help="With --heads: how many heads (the longest segment they propose).")] = 4,
    target: str | None,
    export_to: Annotated[Optional[Path], typer.Option(help="With --heads: where the heads go (default: beside the "
                                                           "shipped target; pass --heads PATH to run/sweep).")] = None,
):
    """Rebuild the reference pair, or train its target's heads, from the local install's text.

    Example: dspark-bench models build --minutes 100
    Example: dspark-bench models build --heads --minutes 20
    Example: dspark-bench models build --long --minutes 40
    """
    with cli_errors():
        if long:
            if heads or target is not None or export_to is not None:
                raise DsparkError("--long builds the long-context pair from the shipped one: it takes --minutes and "
                                  "--out only")
            from dspark_bench.reference.long import build_long  # loaded when the command runs, not for --help

            report = build_long(out or Path("build/long"), 40.0 if minutes is None else minutes)
            if "interrupted" in report:
                raise DsparkError(f"the long pair's build stopped in its {report['interrupted']} stage; run the same "
                                  "command again to resume it")
            for line in describe_long(report):
                out_console.print(line)
            return
        if heads:
            from dspark_bench.harness.train_heads import build_heads  # loaded when the command runs, not for --help

            if count < 1:
                raise DsparkError(f"--count must be at least 1 (got {count})")
            if target is not None and export_to is None:
                raise DsparkError("heads for another target need --export-to "
                                  "(the shipped heads belong to the shipped target)")
            info = build_heads(out or Path("build/heads"), 20.0 if minutes is None else minutes, count, target,
                               export_to)
            out_console.print(describe_heads(info))
            return
        if target is not None or export_to is not None:
            raise DsparkError("--target and --export-to go with --heads")
        from dspark_bench.reference import build  # loaded when the command runs, not for --help

        build(out=out or Path("build/reference"), minutes=100.0 if minutes is None else minutes)


def describe_long(report: dict) -> list:
    """The long-context pair's held-out loss (and draft/target agreement) per depth bucket, beside
    the 256-token pair's on the same windows."""
    lines = []
    for domain, models in report["heldout_by_depth"].items():
        view = Table(title=f"long-context pair, held-out {domain}: loss by depth (agreement: the draft's top-1 "
                           "equals the target's)", title_justify="left")
        view.add_column("model")
        for bucket in report["depth_buckets"]:
            view.add_column(bucket, justify="right")
        for name, numbers in models.items():
            view.add_row(name, *(f"{numbers['loss'][b]:.3f}" for b in report["depth_buckets"]))
            if "agreement_top1" in numbers:
                view.add_row(f"{name.replace('target', 'pair')}: agreement",
                             *(f"{numbers['agreement_top1'][b]:.3f}" for b in report["depth_buckets"]))
        lines.append(view)
    return lines


def describe_heads(info: dict) -> Table:
    """Held-out top-1 accuracy per head and domain (column 0: the target's own next token)."""
    view = Table(title=f"heads: {info['steps']} steps, {info['tokens_seen']:,} tokens, "
                       f"{info['train_minutes']:.1f} min, loss {info['loss']:.3f}", title_justify="left")
    view.add_column("held-out top-1")
    for column in info["heldout_top1_columns"]:
        view.add_column(column, justify="right")
    for domain, values in info["heldout_top1"].items():
        view.add_row(domain, *(f"{v:.3f}" for v in values))
    for domain, values in info.get("heldout_agreement", {}).items():  # what greedy verification accepts
        view.add_row(f"{domain}: agrees with the target's top-1", "—", *(f"{v:.3f}" for v in values))
    return view

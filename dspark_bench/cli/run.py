"""`dspark-bench run`: decode prompts with the speculative decoder and the baseline, interleaved."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from dspark_bench.cli.console import (
    cli_errors,
    out_console,
    print_health,
    print_shown,
    print_small_table,
    print_verdicts,
    read_summary,
    reporting,
    run_table,
    summary_table,
)
from dspark_bench.cli.declared import fields_of, knob_fields, with_options
from dspark_bench.cli.options import command_options
from dspark_bench.config import KNOBS
from dspark_bench.errors import DsparkError
from dspark_bench.harness.workload import WORKLOAD_FIELDS, Served, Workload, served

# What a run decodes beside its workload: every knob that is not the workload's, several values
# of each that repeats (a grid axis).
GRID_KNOBS = knob_fields(without=WORKLOAD_FIELDS)
# The repeated knobs a calibration chooses itself (each domain's policy, at each batch size of the run)
CHOSEN = tuple(name for name, f in KNOBS.items() if f.metadata.get("repeats") and name != "batch_size")


@with_options("workload", fields_of(Workload))
@with_options("load", fields_of(Served))
@with_options("knobs", GRID_KNOBS, many=True, unset="declared")
@command_options("decoder", "calibration", "config", "llama_server", "port", "arrival_rate", "out", "wide")
def run(
    ctx: typer.Context, *, decoder: str, calibration: Path | None, config: Path | None, llama_server: Path | None,
    port: int | None, arrival_rate: list[float] | None, out: Path, wide: bool, workload: dict | None = None,
    load: dict | None = None, knobs: dict | None = None,
):
    """Decode prompts with the speculative decoder and the autoregressive baseline; write a run folder.

    Example: dspark-bench run --task code --limit 10 --threshold 0.3 --threshold 0.5 --gamma-max 6
    Example: dspark-bench run --config results/20250101-120000-run-abc123/run.json
    Example: dspark-bench run --task code --limit 24 --batch-size 8 --gamma-max 3 --schedule fixed --arrival-rate 4
    """
    with cli_errors():
        load = {**load, "arrival_rates": tuple(arrival_rate or ())}
        # The workload first, each field as declared (harness.workload loads without torch): a flag
        # out of bounds is refused in seconds, before harness.run's libraries load.
        if config is None:
            Workload(**workload).check_workload()
            Served(**load).check_load()
        from dspark_bench.harness import run as lib  # loaded when the command runs, not for --help

        grid = grid_of(knobs)
        if decoder == "llamacpp" and "semantics" not in grid and calibration is None:
            grid["semantics"] = ("llamacpp",)  # what llama.cpp can run: its own rule (decoding/rules.py)
        if calibration is not None and set(grid) & set(CHOSEN):
            raise DsparkError("--calibration chooses the policy; drop "
                              f"{'/'.join('--' + n.replace('_', '-') for n in CHOSEN)}")
        with reporting("decoding") as (progress, say):
            if config is not None:
                refuse_other_flags(ctx)
                from dspark_bench.harness.served_run import execute_served  # loaded when the command runs

                folder, table = lib.rerun_from(config, out, progress, say, serve_load=execute_served)
            else:
                run_config = lib.RunConfig(**workload, **load, grid=grid, decoder=decoder,
                                           calibration=str(calibration) if calibration else None)
                folder, table = execute(run_config, out, progress, say, llama_server, port)
        if (folder / "load.parquet").is_file():
            print_served(folder)
        else:
            print_summary(folder, table, wide)


def grid_of(knobs: dict) -> dict:
    """The knobs given on the command line as a grid (knob -> values); those left off are left out."""
    grid = {}
    for name, value in knobs.items():
        values = value if isinstance(value, list) else [] if value is None or value is False else [value]
        if values:
            grid[name] = tuple(values)
    return grid


def execute(run_config, out: Path, progress, say, llama_server: Path | None, port: int | None):
    """Our decoder's run, under its load where it has one, or (--decoder llamacpp) llama-server's
    beside ours and replay."""
    if served(run_config):
        from dspark_bench.harness.served_run import execute_served  # loaded when the command runs, not for --help

        return execute_served(run_config, out, progress, say)
    if run_config.decoder == "llamacpp":
        from dspark_bench.engines import llamacpp_run  # loaded when the command runs, not for --help

        folder, table, _ = llamacpp_run.execute_llamacpp(run_config, out, progress, say, llama_server, port)
        return folder, table
    from dspark_bench.harness import run as lib  # loaded when the command runs, not for --help

    return lib.execute(run_config, out, progress, say)


def refuse_other_flags(ctx: typer.Context) -> None:
    """--config runs the file's config as it was: a flag that would change it is an error."""
    flags = {p.name: p.opts[0] for p in ctx.command.params}
    # (Typer vendors click: by name)
    given = [flags[name] for name in ctx.params if name not in ("config", "out")
             and getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"]
    if given:
        raise DsparkError(f"--config runs the run.json's own config; drop {', '.join(given)}")


def print_summary(folder: Path, table, wide: bool = False) -> None:
    from dspark_bench.metrics import summarize  # loaded when the command runs, not for --help
    from dspark_bench.results import read_run  # loaded when the command runs, not for --help

    info, samples = read_run(folder)
    models = info["models"]
    title = f"{info['prompts']['count']} prompts · {models['device']} · {models['dtype']}"
    title += " · EOS ignored" if info["settings"].get("ignore_eos") else ""
    title += (" · speculative side: HF assisted generation"
              if info["settings"].get("decoder", info["settings"].get("engine")) == "hf" else "")
    if "batch_size" in table and (table["batch_size"] > 1).any():
        title += f" · B>1: padded layout, {info['settings'].get('batching', 'refill')}ed batches"
    first = summary_table if wide else run_table
    out_console.print(first(table, title))
    if samples["category"].nunique() > 1:
        out_console.print(first(summarize(samples, by=["category"]), "by category"))
    summary = read_summary(folder)
    print_depths(summary)
    print_verdicts(summary)
    print_health(summary)
    print_llamacpp(folder)
    print_priced(folder)
    out_console.print(f"run folder: {folder}")


def print_served(folder: Path) -> None:
    """A run under load: each load and server measured beside replay's prediction."""
    from dspark_bench.sections.served import ServedRun  # loaded when the command runs, not for --help

    print_shown(ServedRun.from_json(read_summary(folder)).console())
    out_console.print(f"run folder: {folder}")


def print_depths(summary: dict) -> None:
    """One line where the run's rounds started at more than one depth bucket (summary.json's by_depth)."""
    from dspark_bench.depth import DEPTH_LABELS  # loaded when the command runs, not for --help

    depths = {row["depth"] for row in summary.get("by_depth") or []}
    if len(depths) > 1:
        out_console.print(f"rounds span context depths {', '.join(sorted(depths, key=DEPTH_LABELS.index))}: "
                          "metrics per depth in summary.json's by_depth (and `dspark-bench report`)",
                          highlight=False, soft_wrap=True)


def print_priced(folder: Path) -> None:
    """`--decoder hf`: each policy's measured speedup beside replay's, priced on HF's own costs and on ours."""
    from dspark_bench.results import read_json  # loaded when the command runs, not for --help

    if not (folder / "priced.json").is_file():
        return
    info = read_json(folder / "priced.json", "priced predictions")
    table = Table(title=f"{info['engine']}: measured vs replay priced on its own costs and on our decoder's")
    for column in ("policy", "measured [95% CI]", f"predicted, {info['engine']} prices", "error",
                   "predicted, our prices", "error "):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for row in info["rows"]:
        table.add_row(row["policy"], f"{row['speedup']:.3f} [{row['speedup_low']:.3f}, {row['speedup_high']:.3f}]",
                      f"{row['predicted_engine']:.3f}", f"{row['error_engine']:+.1%}", f"{row['predicted_ours']:.3f}",
                      f"{row['error_ours']:+.1%}")
    out_console.print(table)
    fitted = info.get("fitted_on") or {}
    out_console.print(f"{info['engine']}'s prices: {info['prices']}; "
                      f"fitted on {' and '.join(fitted.get('policies', ['?']))} over "
                      f"{len(fitted.get('prompts', []))} prompts the run does not decode", highlight=False,
                      soft_wrap=True, markup=False)


def print_llamacpp(folder: Path) -> None:
    """A llama.cpp run: each policy measured in llama.cpp beside replay's predictions priced on
    llama.cpp's costs and on ours; with one policy, its decoders side by side and per prompt."""
    from dspark_bench.results import read_json  # loaded when the command runs, not for --help

    if not (folder / "llamacpp.json").is_file():
        return
    info = read_json(folder / "llamacpp.json", "llama.cpp result")
    prices = info["prices"]
    fitted = prices.get("fitted_on") or {}
    table = Table(title=f"llama.cpp b{info['build']['build_number']}: measured (generation phase) vs replay priced on "
                        f"{prices['label']}'s costs and on ours ({info['prompts']} prompts, greedy; "
                        f"{info['tokenized_identically']}/{info['prompts']} tokenized identically by llama.cpp)")
    for column in ("policy", "llama.cpp measured [95% CI]", "predicted, llama.cpp prices", "error",
                   "predicted, our prices", "error ", "acceptance (replay)", "= target"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for row in info["summary"]:
        table.add_row(row["policy"], f"{row['llamacpp_speedup']:.3f} [{row['llamacpp_speedup_low']:.3f}, "
                      f"{row['llamacpp_speedup_high']:.3f}]", f"{row['predicted_llamacpp']:.3f}",
                      f"{row['error_llamacpp']:+.1%}", f"{row['predicted_ours']:.3f}", f"{row['error_ours']:+.1%}",
                      f"{row['acceptance_rate']:.3f} ({row['replay_acceptance_rate']:.3f})", row["identical"])
    out_console.print(table)
    out_console.print(f"llama.cpp's prices: {prices['llamacpp']}; its server costs fitted on "
                      f"{' and '.join(fitted.get('policies', ['?']))} "
                      f"over prompts {', '.join(map(str, fitted.get('prompts', [])))} (none of them above)",
                      highlight=False, soft_wrap=True, markup=False)
    judged = prices.get("timing_health") or {}
    if judged.get("verdict", "ok") != "ok":  # the engine's own costs were measured on a busy machine
        out_console.print(f"llama.cpp's prices: {judged['headline']}", style="yellow", highlight=False, soft_wrap=True)
    if info["gguf"].get("given"):
        out_console.print("llama.cpp decoded your GGUF files as they are; our side, their de-quantized copy: the "
                          "'= target' column and the acceptance beside replay's say how far the two part",
                          highlight=False, soft_wrap=True)
    print_llamacpp_buckets(info["summary"])
    if len(info["policies"]) == 1:
        print_llamacpp_decoders(info)
        print_llamacpp_prompts(folder)
    for policy in info["policies"]:
        out_console.print(f"llama-server flags ({policy['policy']}): {' '.join(policy['flags'])}", highlight=False,
                          soft_wrap=True, markup=False)


def print_llamacpp_buckets(summary: list[dict]) -> None:
    """Where the prompts span depth buckets: each policy per prompt-length bucket, llama.cpp measured
    beside replay priced on llama.cpp's costs at each round's depth."""
    rows = [(row["policy"], part) for row in summary for part in row.get("by_bucket") or []]
    if rows:
        print_small_table("per prompt-length bucket: llama.cpp measured (generation phase) vs replay on its prices",
                          ("policy", "prompt tokens", "prompts", "measured [95% CI]", "predicted", "error"),
                          [[policy, part["bucket"], str(part["prompts"]),
                            f"{part['llamacpp_speedup']:.3f} [{part['llamacpp_speedup_low']:.3f}, "
                            f"{part['llamacpp_speedup_high']:.3f}]", f"{part['predicted_llamacpp']:.3f}",
                            f"{part['error_llamacpp']:+.1%}"] for policy, part in rows])


def print_llamacpp_decoders(info: dict) -> None:
    """One policy's decoders side by side: llama.cpp, ours, replay."""
    table = Table(title="llama.cpp beside our decoder and replay (llama.cpp: generation phase)")
    for column in ("decoder", "speedup [95% CI]", "acceptance", "tokens/round", "avg draft len", "= target"):
        table.add_column(column, justify="left" if column == "decoder" else "right")
    number = lambda v, f=".3f": "—" if v is None or v != v else format(v, f)  # noqa: E731 (NaN: not measured)
    for row in info["policies"][0]["table"]:
        interval = "—" if row["speedup"] != row["speedup"] else (
            f"{row['speedup']:.3f} [{row['speedup_low']:.3f}, {row['speedup_high']:.3f}]")
        table.add_row(row["decoder"], interval, number(row["acceptance_rate"]), number(row["tokens_per_round"]),
                      number(row["avg_draft_len"], ".2f"), row["identical"] or "—")
    out_console.print(table)


def print_llamacpp_prompts(folder: Path) -> None:
    """Per prompt: what llama.cpp drafted and accepted beside replay's prediction under its rule."""
    import pandas as pd  # loaded when the command runs, not for --help

    rows = pd.read_parquet(folder / "llamacpp.parquet")
    table = Table(title="per prompt: llama.cpp measured vs replay predicted (llama.cpp's rule)")
    for column in ("prompt", "drafted", "accepted", "acceptance", "replay drafted", "replay accepted",
                   "replay acceptance", "= target"):
        table.add_column(column, justify="left" if column == "prompt" else "right")
    for row in rows.itertuples():
        table.add_row(str(row.prompt_id), str(row.drafted_total), str(row.accepted_total), f"{row.acceptance_rate:.3f}",
                      str(row.replay_drafted), str(row.replay_accepted), f"{row.replay_acceptance_rate:.3f}",
                      "yes" if row.identical_to_target else "no")
    out_console.print(table)

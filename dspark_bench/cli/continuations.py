"""`dspark-bench continuations write | prompts`: the target's greedy continuations as the serving
engine makes them, for `sweep --continuations FILE` to record from."""

from __future__ import annotations

from pathlib import Path

import typer

from dspark_bench.cli.console import cli_errors, reporting
from dspark_bench.cli.declared import fields_of, with_options
from dspark_bench.cli.options import REQUIRED, command_options
from dspark_bench.harness.workload import Workload

# The workload settings each command reads: the prompts as they are encoded, and (write) how
# the target decodes them.
PROMPTS = ("task", "dataset", "split", "prompt_field", "category_field", "limit", "target", "draft", "chat_template")
DECODED = (*PROMPTS, "device", "dtype", "max_new_tokens", "ignore_eos", "threads")

continuations_app = typer.Typer(
    help="The target's continuations from the engine that serves it, for `sweep --continuations`.\n\n"
         "Example: dspark-bench continuations write --task code --limit 20 --decoder llamacpp --out c.jsonl",
    no_args_is_help=True)


@continuations_app.command("write")
@with_options("workload", fields_of(Workload, DECODED))
@command_options("out", "decoder", "llama_server", defaults={"out": REQUIRED, "decoder": "llamacpp"}, helps={
    "out": "The continuations file to write (JSON Lines).",
    "decoder": "Who decodes the target: llamacpp (a plain llama-server on its GGUF file) | ours (our decoder)."})
def write(*, out: Path, decoder: str, llama_server: Path | None, workload: dict | None = None):
    """Write the target's greedy continuation of every prompt, decoded by the engine that serves it.

    Example: dspark-bench continuations write --task code --limit 20 --out continuations.jsonl
    Example: dspark-bench continuations write --task code --target t.gguf --draft d.gguf --out c.jsonl
    """
    from dspark_bench.engines.continuations import write_continuations  # loaded when the command runs

    with cli_errors(), reporting("continuations") as (progress, say):
        server = str(llama_server) if llama_server else None
        path = write_continuations(Workload(**workload), decoder, out, progress, say, server)
        say(f"wrote {path}: record from it with `dspark-bench sweep --continuations {path}` (same prompts and flags)")


@continuations_app.command("prompts")
@with_options("workload", fields_of(Workload, PROMPTS))
@command_options("out", defaults={"out": REQUIRED},
                 helps={"out": "The prompts file to write (JSON Lines: id, prompt_token_ids)."})
def prompts(*, out: Path, workload: dict | None = None):
    """Write the prompts as this tool encodes them, for vLLM or SGLang to continue elsewhere.

    Example: dspark-bench continuations prompts --task code --limit 20 --out prompts.jsonl
    """
    from dspark_bench.engines.continuations import write_prompts  # loaded when the command runs

    with cli_errors(), reporting("prompts") as (_, say):
        path = write_prompts(Workload(**workload), out)
        say(f"wrote {path}: continue each prompt_token_ids greedily in your engine, then write the continuations "
            "file (docs/sweeps-and-replay.md#records-from-your-engines-continuations)")

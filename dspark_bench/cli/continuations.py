"""`dspark-bench continuations write | prompts`: the target's greedy continuations as the serving
engine makes them, for `sweep --continuations FILE` to record from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dspark_bench.cli.console import cli_errors, reporting
from dspark_bench.cli.options import (
    CategoryField,
    ChatTemplate,
    Dataset,
    Device,
    Draft,
    Dtype,
    IgnoreEos,
    Limit,
    MaxNewTokens,
    PromptField,
    Split,
    Target,
    Task,
    Threads,
)

continuations_app = typer.Typer(
    help="The target's continuations from the engine that serves it, for `sweep --continuations`.\n\n"
         "Example: dspark-bench continuations write --task code --limit 20 --engine llamacpp --out c.jsonl",
    no_args_is_help=True)


def workload(**fields):
    from dspark_bench.harness.workload import Workload  # loaded when the command runs, not for --help

    return Workload(**fields)


@continuations_app.command("write")
def write(
    out: Annotated[Path, typer.Option(help="The continuations file to write (JSON Lines).")],
    engine: Annotated[str, typer.Option(help="Who decodes the target: llamacpp (a plain llama-server on its GGUF file) | ours.")] = "llamacpp",
    task: Task = None, dataset: Dataset = None, split: Split = "train", prompt_field: PromptField = None,
    category_field: CategoryField = None, limit: Limit = None, target: Target = None, draft: Draft = None,
    device: Device = "auto", dtype: Dtype = "auto", max_new_tokens: MaxNewTokens = None, ignore_eos: IgnoreEos = False,
    chat_template: ChatTemplate = "auto", threads: Threads = None,
    llama_server: Annotated[Optional[Path], typer.Option(help="--engine llamacpp: the llama-server binary (default: tools/build-llama-server.sh's build, then PATH).")] = None,
):
    """Write the target's greedy continuation of every prompt, decoded by the engine that serves it.

    Example: dspark-bench continuations write --task code --limit 20 --out continuations.jsonl
    Example: dspark-bench continuations write --task code --engine llamacpp --target target.gguf --draft draft.gguf --out c.jsonl
    """
    from dspark_bench.engines.continuations import write_continuations  # loaded when the command runs

    with cli_errors(), reporting("continuations") as (progress, say):
        spec = workload(task=task, dataset=dataset, split=split, prompt_field=prompt_field,
                        category_field=category_field, limit=limit, target=target, draft=draft, device=device,
                        dtype=dtype, max_new_tokens=max_new_tokens, ignore_eos=ignore_eos,
                        chat_template=chat_template, threads=threads)
        path = write_continuations(spec, engine, out, progress, say, str(llama_server) if llama_server else None)
        say(f"wrote {path}: record from it with `dspark-bench sweep --continuations {path}` (same prompts and flags)")


@continuations_app.command("prompts")
def prompts(
    out: Annotated[Path, typer.Option(help="The prompts file to write (JSON Lines: id, prompt_token_ids).")],
    task: Task = None, dataset: Dataset = None, split: Split = "train", prompt_field: PromptField = None,
    category_field: CategoryField = None, limit: Limit = None, target: Target = None, draft: Draft = None,
    chat_template: ChatTemplate = "auto",
):
    """Write the prompts as this tool encodes them, for vLLM or SGLang to continue elsewhere.

    Example: dspark-bench continuations prompts --task code --limit 20 --out prompts.jsonl
    """
    from dspark_bench.engines.continuations import write_prompts  # loaded when the command runs

    with cli_errors(), reporting("prompts") as (_, say):
        path = write_prompts(workload(task=task, dataset=dataset, split=split, prompt_field=prompt_field,
                                      category_field=category_field, limit=limit, target=target, draft=draft,
                                      chat_template=chat_template), out)
        say(f"wrote {path}: continue each prompt_token_ids greedily in your engine, then write the continuations "
            "file (docs/sweeps-and-replay.md#records-from-your-engines-continuations)")

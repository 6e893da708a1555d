"""`dspark-bench decode "text"`: one generation with every round visible."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from dspark_bench.cli.console import cli_errors, out_console, render_rounds
from dspark_bench.cli.declared import fields_of, knob_fields, with_options
from dspark_bench.cli.options import command_options
from dspark_bench.config import DEFAULT_MAX_NEW_TOKENS, KNOBS, DecodeConfig
from dspark_bench.harness.workload import Workload
from dspark_bench.knobs import check_needs

# One generation: one value of each knob (batching aside: one prompt), and the models it runs on.
MODELS = ("target", "draft", "heads", "device", "dtype", "eager", "chat_template")


@with_options("models", fields_of(Workload, MODELS))
@with_options("knobs", knob_fields(without=("batch_size", "batch_quorum", "compiled")))  # one request, not warmed
@command_options("calibration", "domain", helps={"calibration": "Take the policy from a calibration file."})
def decode(
    text: Annotated[str, typer.Argument(help="The prompt.")], *, calibration: Path | None, domain: str | None,
    models: dict | None = None, knobs: dict | None = None,
):
    """Generate once and show every round: accepted (green), rejected (red), target's token (bold).

    Example: dspark-bench decode "def fibonacci(n):" --threshold 0.4
    """
    from dspark_bench.harness.run import decode_once  # loaded when the command runs, not for --help

    with cli_errors():
        tokens = knobs["max_new_tokens"]
        config = DecodeConfig.of(**{**knobs, "max_new_tokens": DEFAULT_MAX_NEW_TOKENS if tokens is None else tokens})
        if calibration is None:  # a knob given that this one policy would not read is refused, as run refuses it
            check_needs(KNOBS, {k: [v] for k, v in knobs.items() if v is not None}, None, [config])
        pair, config, result = decode_once(text, config, models["target"], models["draft"], models["device"],
                                           models["dtype"], models["chat_template"], calibration, domain,
                                           models["heads"], models["eager"])
        if calibration is not None:
            out_console.print(f"policy: {config.label()}", highlight=False)
        if config.verification.compiled:  # captured by default on CUDA (decoding/capture.py)
            from dspark_bench.decoding.capture import mode_of  # torch: loaded when the command runs

            mode = mode_of(config, pair.device)
            out_console.print(f"passes: {mode}" + (" (--eager: eager passes)" if mode == "cuda-graphs" else ""),
                              highlight=False)
        show_rounds(text, pair.tokenizer, result, config)


def show_rounds(text: str, tokenizer, result, config: DecodeConfig) -> None:
    """The prompt and every round, then the generation's policy metrics and stop reasons."""
    from dspark_bench.harness.samples import sample_row  # loaded when the command runs, not for --help

    markers = not out_console.is_terminal or out_console.no_color
    out_console.print(Text(text, style="dim") + render_rounds(tokenizer, result, markers))
    if markers:
        out_console.print("(plain draft tokens were accepted, [-x-] rejected, {x} is the target's own token)")
    row = sample_row(result, config)
    metrics = {k: row[k] for k in ("rounds", "new_tokens", "avg_draft_len", "acceptance_rate",
                                   "block_acceptance_rate", "accepted_per_round", "tokens_per_round")}
    out_console.print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))
    stops = {k.removeprefix("stop_"): row[k] for k in row if k.startswith("stop_") and row[k]}
    out_console.print("stop reasons: " + ", ".join(f"{k} {v}" for k, v in stops.items()))

"""`dspark-bench decode "text"`: one generation with every round visible."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from dspark_bench.cli.console import cli_errors, out_console, render_rounds
from dspark_bench.cli.options import (
    ChatTemplate,
    Device,
    Draft,
    Dtype,
    HeadsPath,
    MaxNewTokens,
    NgramMax,
    NgramMin,
    Seed,
    Target,
    Temperature,
    ThresholdEnd,
    SignalModel,
    ThresholdStart,
    TopK,
    TopP,
)
from dspark_bench.config import DEFAULT_MAX_NEW_TOKENS, DEFAULTS, DecodeConfig


def decode(
    text: Annotated[str, typer.Argument(help="The prompt.")],
    target: Target = None, draft: Draft = None, chat_template: ChatTemplate = "auto",
    metric: Annotated[str, typer.Option(help="top1 | entropy | topk_mass | margin | gini | learned (--signal-model)")] = DEFAULTS.stopping.metric,
    signal_model: SignalModel = None,
    schedule: Annotated[str, typer.Option(help="threshold | ramp | cumulative | fixed")] = DEFAULTS.stopping.schedule,
    threshold: Annotated[float, typer.Option(help="Stop drafting below this confidence.")] = DEFAULTS.stopping.threshold,
    gamma_max: Annotated[int, typer.Option(help="Most draft tokens per round.")] = DEFAULTS.stopping.gamma_max,
    min_draft_len: Annotated[int, typer.Option(help="Fewest draft tokens per round.")] = DEFAULTS.stopping.min_draft_len,
    threshold_start: ThresholdStart = DEFAULTS.stopping.threshold_start,
    threshold_end: ThresholdEnd = DEFAULTS.stopping.threshold_end,
    topk: TopK = DEFAULTS.stopping.topk,
    temperature: Temperature = DEFAULTS.verification.temperature, top_p: TopP = DEFAULTS.verification.top_p,
    max_new_tokens: MaxNewTokens = None,
    seed: Seed = DEFAULTS.verification.seed,
    device: Device = "auto", dtype: Dtype = "auto",
    drafter: Annotated[str, typer.Option(help="model | heads (--heads) | lookup")] = DEFAULTS.drafting.drafter,
    ngram_min: NgramMin = DEFAULTS.drafting.ngram_min, ngram_max: NgramMax = DEFAULTS.drafting.ngram_max,
    heads: HeadsPath = None,
    calibration: Annotated[Optional[Path], typer.Option(help="Take the policy from a calibration file.")] = None,
    domain: Annotated[Optional[str], typer.Option(help="With --calibration: the prompt's domain (default: the global policy).")] = None,
):
    """Generate once and show every round: accepted (green), rejected (red), target's token (bold).

    Example: dspark-bench decode "def fibonacci(n):" --threshold 0.4
    """
    from dspark_bench.harness.run import decode_once  # loaded when the command runs, not for --help

    with cli_errors():
        config = DecodeConfig.of(metric=metric, schedule=schedule, threshold=threshold, gamma_max=gamma_max,
                              min_draft_len=min_draft_len, threshold_start=threshold_start,
                              threshold_end=threshold_end, topk=topk, temperature=temperature, top_p=top_p,
                              max_new_tokens=DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens,
                              seed=seed, drafter=drafter, ngram_min=ngram_min, ngram_max=ngram_max,
                              signal_model=str(signal_model) if signal_model else "")
        pair, config, result = decode_once(text, config, target, draft, device, dtype, chat_template,
                                           calibration, domain, heads)
        if calibration is not None:
            out_console.print(f"policy: {config.label()}", highlight=False)
        show_rounds(text, pair.tokenizer, result, config)


def show_rounds(text: str, tokenizer, result, config: DecodeConfig) -> None:
    """The prompt and every round, then the generation's policy metrics and stop reasons."""
    from dspark_bench.harness.runner import sample_row  # loaded when the command runs, not for --help

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

"""The command-line options several commands share, as typed annotations (Typer's style).

Every command that takes prompts takes the same prompt flags (PROMPT_FLAGS' annotations)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

# Options shared by the commands that decode.
Target = Annotated[Optional[str], typer.Option(help="Target model: Hugging Face name or local path (default: reference pair).")]
Draft = Annotated[Optional[str], typer.Option(help="Draft model sharing the target's vocabulary (default: reference pair).")]
Device = Annotated[str, typer.Option(help="auto | cpu | cuda | mps")]
Dtype = Annotated[str, typer.Option(help="auto (fp32 on CPU, bf16 on CUDA) | float32 | bfloat16 | float16")]
Metrics = Annotated[list[str], typer.Option("--metric", help="Confidence metric: top1 | entropy | topk_mass | margin | gini | learned (--signal-model) (repeatable).")]
Schedules = Annotated[list[str], typer.Option("--schedule", help="threshold | ramp | cumulative | fixed | goodput | budget (repeatable; goodput and budget need --goodput-model; budget decides for the whole batch, see --budget-layout).")]
DraftModes = Annotated[list[str], typer.Option("--draft-mode", help="Where the rule cuts a draft: early-stop (the draft loop stops; one host sync per draft step) | verify-side (draft gamma_max, cut on the device; one sync per round). Repeatable: both run side by side. Batch size 1.")]
Compile = Annotated[bool, typer.Option("--compile", help="Static KV cache and torch.compile'd draft/verify steps (CUDA graphs on a GPU), both sides. Batch size 1; pays on a GPU, not on a CPU (see README).")]
Drafters = Annotated[list[str], typer.Option("--drafter", help="What drafts: model (the draft model) | heads (multi-token heads on the target; --heads) | lookup (prompt lookup: n-gram matching, no model). Repeatable: side by side.")]
NgramMin = Annotated[int, typer.Option("--ngram-min", help="Lookup drafter: the shortest n-gram matched.")]
NgramMax = Annotated[int, typer.Option("--ngram-max", help="Lookup drafter: the longest n-gram matched (tried first).")]
HeadsPath = Annotated[Optional[str], typer.Option("--heads", help="Heads drafter: a folder from `dspark-bench models build --heads` (default: the shipped target's heads).")]
SemanticsOption = Annotated[list[str], typer.Option("--semantics", help="Whose rule: dspark (drops the failing token) | hf (keeps it) | llamacpp (drops it; --min-draft-len discards shorter drafts) (repeatable).")]
SignalModel = Annotated[Optional[Path], typer.Option("--signal-model", help="--metric learned: the fitted signal, a replay sweep's folder (or its learned_signal.json).")]
BudgetLayout = Annotated[str, typer.Option("--budget-layout", help="--schedule budget: price each pass as the padded layout does (its longest row; what this engine runs) or the packed one (its total tokens; vLLM, SGLang, TensorRT-LLM).")]
GoodputModel = Annotated[Optional[Path], typer.Option("--goodput-model", help="The goodput schedule's acceptance fit and step costs: a replay sweep's folder (or its goodput_model.json).")]
Thresholds = Annotated[list[float], typer.Option("--threshold", help="Stop drafting below this confidence (repeatable).")]
GammaMaxes = Annotated[list[int], typer.Option("--gamma-max", help="Most draft tokens per round (repeatable).")]
MinDraftLens = Annotated[list[int], typer.Option("--min-draft-len", help="Fewest draft tokens per round (repeatable).")]
ThresholdStart = Annotated[float, typer.Option(help="Ramp schedule: threshold at draft position 1.")]
ThresholdEnd = Annotated[float, typer.Option(help="Ramp schedule: threshold at position gamma_max.")]
TopK = Annotated[int, typer.Option(help="k of the topk_mass metric.")]
Temperature = Annotated[float, typer.Option(help="0 = greedy verification; > 0 = lossless rejection sampling.")]
TopP = Annotated[float, typer.Option(help="Nucleus filter, applied to target and draft alike.")]
MaxNewTokens = Annotated[Optional[int], typer.Option(help="Tokens to generate per prompt (default: the task's, else 128).")]
Seed = Annotated[int, typer.Option(help="Sampling seed.")]
Task = Annotated[Optional[str], typer.Option(help="Built-in task (see `dspark-bench tasks ls`); several comma-separated (code,humaneval) run side by side, each its own category.")]
Dataset = Annotated[Optional[str], typer.Option(help="Your prompts: JSONL/JSON/CSV/Parquet/text file, or a hub id.")]
Split = Annotated[str, typer.Option(help="Dataset split (hub datasets).")]
PromptField = Annotated[Optional[str], typer.Option(help="Column holding the prompt (default: guessed).")]
CategoryField = Annotated[Optional[str], typer.Option(help="Column holding the category (default: guessed).")]
Turns = Annotated[str, typer.Option(help="Multi-turn prompts: first | all (each turn on the model's own answer).")]
ChatTemplate = Annotated[str, typer.Option(help="auto (use the tokenizer's chat template if any) | none")]
IgnoreEos = Annotated[bool, typer.Option(help="Timing only: both sides generate exactly max_new_tokens (EOS does not end a sequence).")]
BatchSizes = Annotated[list[int], typer.Option("--batch-size", help="Requests decoded together (repeatable; default 1). B > 1: the batched engine, padded layout, both sides on the same batches.")]
Batching = Annotated[str, typer.Option(help="B > 1: refill (a finished row's place goes to the next prompt, as continuous batching does) | drain (each batch empties first).")]
Threads = Annotated[Optional[int], typer.Option(help="torch's CPU threads (default: torch's own); on a busy machine, fewer than the cores (e.g. 1) keep torch from fighting the other process.")]
Limit = Annotated[Optional[int], typer.Option(help="Use only the first N prompts.")]

# The same knobs for commands that override a sweep spec: unset means "the spec's".
SpecDevice = Annotated[Optional[str], typer.Option("--device", help="auto | cpu | cuda | mps (default: the spec's)")]
SpecDtype = Annotated[Optional[str], typer.Option("--dtype", help="auto | float32 | bfloat16 | float16 (default: the spec's)")]
SpecSplit = Annotated[Optional[str], typer.Option("--split", help="Dataset split (hub datasets) (default: the spec's).")]
Evaluation = Annotated[Optional[str], typer.Option(help="How policies are evaluated: replay (greedy: record once, simulate all, confirm the best) | real (a timed run each) | auto.")]
Precision = Annotated[Optional[float], typer.Option(help="Repeat the headline comparison (best scheduled policy vs best fixed γ, paired on the same prompts) until its 95 % interval is within ± this (e.g. 0.03), or --precision-budget runs out (default: one pass).")]
PrecisionBudget = Annotated[Optional[float], typer.Option("--precision-budget", help="Seconds of further passes --precision may spend (default 600).")]
Repeats = Annotated[int, typer.Option(help="Timed baseline/speculative pairs per prompt (medians kept); the side that runs first alternates.")]

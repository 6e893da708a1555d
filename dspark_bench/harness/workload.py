"""The workload: what is decoded and how it is timed, shared by a run and a sweep.

A run (`harness.run.RunConfig`) and a sweep spec (`tuning.spec.SweepSpec`) both extend this one
frozen dataclass, so a field (and the flag or spec key that sets it) means the same thing in
both: the models, the prompts, how tokens are verified, how long each sequence is, and how the
runner times them. What a run or a sweep adds on top is the policies (a grid, or a search space).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from dspark_bench.config import DEFAULT_MAX_NEW_TOKENS, DEFAULTS
from dspark_bench.errors import DsparkError
from dspark_bench.harness.runner import RunnerSettings


@dataclass(frozen=True)
class Workload:
    # --- models
    target: str | None = None  # Hugging Face name, local folder or GGUF file; None: the shipped reference pair
    draft: str | None = None  # a draft sharing the target's vocabulary
    heads: str | None = None  # the heads drafter's heads (None: the shipped target's)
    device: str = "auto"  # auto | cpu | cuda | mps
    dtype: str = "auto"  # auto (fp32 on CPU, bf16 on CUDA) | float32 | bfloat16 | float16
    # --- prompts: exactly one of task and dataset
    task: str | None = None  # a built-in task (tasks ls)
    dataset: str | None = None  # a prompts file (JSONL, JSON, CSV, Parquet, text) or a hub id
    split: str = "train"  # the dataset's split (hub datasets)
    prompt_field: str | None = None  # column holding the prompt (None: guessed)
    category_field: str | None = None  # column holding the category (None: guessed)
    limit: int | None = None  # the first N prompts only (None: all)
    turns: str = "first"  # multi-turn prompts: "first" turn, or "all" on the model's own answers
    chat_template: str = "auto"  # auto: the tokenizer's chat template where it has one | none
    # --- verification and lengths
    temperature: float = DEFAULTS.verification.temperature  # 0: greedy; > 0: lossless rejection sampling
    top_p: float = DEFAULTS.verification.top_p  # nucleus filter, target and draft alike
    topk: int = DEFAULTS.stopping.topk  # k of the topk_mass metric
    max_new_tokens: int | None = None  # None: the task's own, else DEFAULT_MAX_NEW_TOKENS
    seed: int = DEFAULTS.verification.seed  # seeds each decode's sampling generator
    ignore_eos: bool = False  # timing only: every sequence exactly max_new_tokens long
    # --- timing
    repeats: int = 1  # timed baseline/speculative pairs per prompt and policy (medians kept)
    warmup: int = 1  # untimed decodes of each kind before timing starts
    trace: bool = False  # also write rounds.parquet
    # B > 1: rows that finish are replaced from the waiting prompts ("refill", continuous
    # batching), or the batch empties before the next starts ("drain")
    batching: str = "refill"
    # The headline comparison (the best scheduled policy against the best fixed γ, paired on the
    # same prompts) timed again, pass after pass, until its 95 % interval is within ±precision
    # (0: one pass), or until precision_budget_s seconds of further passes are spent.
    precision: float = 0.0
    precision_budget_s: float = 600.0
    # torch's CPU threads for the job (None: torch's own choice). On a machine another process keeps
    # busy, fewer threads than cores stop torch's threads fighting it (timing health says when).
    threads: int | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def tokens(self, task_tokens: int | None) -> int:
        """Tokens per prompt: the workload's own, else the task's, else the default."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        return task_tokens or DEFAULT_MAX_NEW_TOKENS

    def check_workload(self) -> None:
        """Refuse settings no decode can run with (a run and a sweep alike), before anything loads."""
        if self.turns not in ("first", "all"):
            raise DsparkError(f"--turns must be first or all (got {self.turns!r})")
        if self.chat_template not in ("auto", "none"):
            raise DsparkError(f"--chat-template must be auto or none (got {self.chat_template!r})")
        if self.repeats < 1:
            raise DsparkError(f"--repeats must be at least 1 (got {self.repeats})")
        for name in ("precision", "precision_budget_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < float("inf"):
                raise DsparkError(f"--{name.replace('_s', '').replace('_', '-')} must be a number >= 0 (got {value!r})")
        if not self.precision_budget_s > 0:  # a budget of nothing would let --precision run no pass and say it ran
            raise DsparkError(f"--precision-budget must be a positive number of seconds (got {self.precision_budget_s:g})")
        if self.precision >= 1:
            raise DsparkError(f"--precision is a relative half-width, e.g. 0.03 for ±3 % (got {self.precision:g})")
        if self.batching not in ("refill", "drain"):
            raise DsparkError(f"--batching must be refill or drain (got {self.batching!r})")

    def use_threads(self) -> None:
        """Set torch's CPU threads as the workload asks, before any model loads."""
        if self.threads is None:
            return
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 1:
            raise DsparkError(f"--threads must be a whole number of at least 1 (got {self.threads!r})")
        torch.set_num_threads(self.threads)

    def runner_settings(self, decoder: str = "ours") -> RunnerSettings:
        """How every timed or recorded decode of this workload runs."""
        return RunnerSettings(repeats=self.repeats, warmup=self.warmup, trace=self.trace,
                              chat_template=self.chat_template, turns=self.turns, ignore_eos=self.ignore_eos,
                              batching=self.batching, decoder=decoder)


WORKLOAD_FIELDS = tuple(f.name for f in dataclasses.fields(Workload))

"""A stopping policy as the decoders run it: when does the drafter stop proposing tokens in a round?
(The schedules themselves, one object each, are dspark_bench/schedules.py; this is their arithmetic.)

The rule is asked about draft position i (1-based) after the token at i was proposed with
confidence c_i. `keeps` says whether that token passes. Under our semantics the token that fails
the rule is DROPPED (the seed's example: confidences 0.9, 0.85, 0.65 at threshold 0.7 give a
draft of length 2), positions <= min_draft_len are always kept, and position gamma_max is the last.

The engines people deploy mean other things by the same knobs (config.stopping.semantics), and each is
replayed and run exactly:
  "hf"        HF assisted generation KEEPS the failing token, then stops (0.9, 0.85, 0.65 → 3);
  "llamacpp"  llama.cpp drops it, keeps no position unconditionally, and DISCARDS a draft shorter
              than min_draft_len (--spec-draft-n-min): that step decodes normally; and its top1 is
              llama.cpp's own, the top-1 of the draft's 10 likeliest tokens renormalised
              (confidence.signal_of).
The goodput schedule (goodput.py) decides after each token whether to draft the next one, so
its last token stays too, as under "hf"; so does the budget schedule (budget.py), which decides
for a whole batch at once and is goodput's rule for one row. The depth schedule runs, each round,
the policy of the round's context-depth bucket (`at_depth`): a threshold rule, or its entry's own family.
"""

from __future__ import annotations

import functools

import torch

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.decoding import controllers
from dspark_bench.decoding.as_numpy import running
from dspark_bench.decoding.budget import row_rule
from dspark_bench.depth import depth_bucket


def at_depth(config: DecodeConfig, depth: int) -> DecodeConfig:
    """The policy a round starting at this context depth (tokens before it: prompt and output so
    far) runs: under the depth schedule its bucket's policy (`bucket_policies`), under
    any other schedule `config` itself."""
    if not schedules.of(config).by_depth:
        return config
    return bucket_policies(config)[int(depth_bucket(depth))]


def round_policies(config: DecodeConfig) -> tuple[DecodeConfig, ...]:
    """Every policy `round_start` may give a round of `config`, each once."""
    if schedules.of(config).controlled:
        return tuple(dict.fromkeys(controllers.round_policy(config, k) for k in controllers.lengths(config)))
    return tuple(dict.fromkeys(bucket_policies(config))) if schedules.of(config).by_depth else (config,)


def round_start(config: DecodeConfig, depth: int, controller, budget: int, rows: int = 1) -> tuple[DecodeConfig, int]:
    """The policy a round starting at this context depth runs and what it may draft at most: under
    an engine's controller (controllers.py) the fixed length it picks now for a step of `rows` rows,
    within `budget`; else `at_depth`'s policy and `budget`."""
    if controller is None:
        return at_depth(config, depth), budget
    steps = controller.steps(rows)
    return controllers.round_policy(config, steps), controllers.round_budget(steps, budget)


@functools.lru_cache(maxsize=64)
def bucket_policies(config: DecodeConfig) -> tuple[DecodeConfig, ...]:
    """A depth policy's policy in each depth bucket (depth.DEPTH_LABELS): the threshold rule at the
    bucket's threshold and γ_max, or the family its entry names (depth.DepthEntry); every other knob
    the policy's own."""
    return tuple(config.replace(**{"schedule": schedules.THRESHOLD, **entry.knobs(), "depth_policy": ""})
                 for entry in schedules.entries_of(config))


def threshold_at(config: DecodeConfig, position: int) -> float:
    """The confidence a token at this draft position must reach to be kept (the schedule's)."""
    return schedules.of(config).threshold_at(config.stopping, position)


def keeps_failing(config: DecodeConfig) -> bool:
    """Whether the token that fails the rule stays in the draft (which then stops)."""
    return config.stopping.semantics == "hf" or schedules.of(config).cost_aware


def forced(config: DecodeConfig) -> int:
    """Draft positions kept whatever their confidence (none under llama.cpp's rule)."""
    return 0 if config.stopping.semantics == "llamacpp" else config.stopping.min_draft_len


def discards_below(config: DecodeConfig) -> int:
    """A draft shorter than this is thrown away before verification (llama.cpp's --spec-draft-n-min)."""
    return config.stopping.min_draft_len if config.stopping.semantics == "llamacpp" else 0


def keeps(config: DecodeConfig, position: int, confidence: float, cumulative: float) -> bool:
    """Whether the token proposed at `position` stays in the draft.

    `cumulative` is the product of the confidences at positions 1..position: the "cumulative"
    schedule stops when that estimate of the whole block surviving drops below the threshold.
    """
    if position <= forced(config):
        return True
    signal = cumulative if schedules.of(config).cumulative else confidence
    return signal >= threshold_at(config, position)


class DeviceRule:
    """`proposal.Proposal`'s rule as tensor operations, for verify-side truncation: the draft runs
    to its limit without stopping and `kept` cuts it on the device — a failing token dropped or
    kept (keeps_failing), EOS ending the draft, forced positions, llama.cpp's discard — in float64
    as the host compares Python floats. Its constants are copied to the device once per decode:
    on CUDA a copy from the host waits for the work queued before it."""

    def __init__(self, config: DecodeConfig, device: torch.device):
        self.config = config
        gamma = config.stopping.gamma_max
        thresholds = [threshold_at(config, k) for k in range(1, gamma + 1)]
        self.thresholds = torch.tensor(thresholds, dtype=torch.float64, device=device)
        self.position = torch.arange(1, gamma + 1, device=device)
        self.goodput = None
        if schedules.of(config).cost_aware:  # budget alone is goodput's rule (budget.py)
            self.goodput = row_rule(config).on_device(device, gamma)

    def kept(self, scores: torch.Tensor, tokens: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
        """How many of a full draft's n tokens the rule keeps (0-d); `scores` [n], `tokens` [n]."""
        config, n = self.config, scores.shape[0]
        if self.goodput is not None:
            passes = self.goodput.continues(scores)
        else:
            signal = scores.double()
            if schedules.of(config).cumulative:
                signal = running(signal, torch.mul)
            passes = signal >= self.thresholds[:n]
        passes = passes | (self.position[:n] <= forced(config))
        leading = passes.long().cumprod(dim=0).sum()  # tokens before the first that fails
        kept = leading + 1 if keeps_failing(config) else leading
        before_eos = (~torch.isin(tokens, eos)).long().cumprod(dim=0).sum()  # tokens before the first EOS
        kept = torch.minimum(kept, before_eos + 1).clamp(max=n)
        return torch.where(kept < discards_below(config), 0, kept)


# Which serving engines can run a policy exactly (export writes the nearest one where not; `run
# --decoder hf` refuses one HF cannot run): the engine rules above, seen from each engine.
def expressible(config: DecodeConfig, fmt: str) -> list[str]:
    """Why `fmt` cannot run `config` exactly (empty: it can)."""
    why, schedule = [], schedules.of(config)
    # No engine keys its draft policy by the context's depth (vLLM's per-length schedule is an open
    # RFC, #54801; llama.cpp, HF, SGLang and TensorRT-LLM run one policy at every depth).
    what = "a policy per context depth" if schedule.by_depth else f"a {schedule.name} schedule"
    if config.stopping.batch_quorum > 0:
        why.append("a batch quorum")
    if fmt in schedules.FIXED_ENGINES:
        if fmt not in schedule.engines:
            why.append(f"{what} (it drafts a fixed length)")
        return why
    if schedule.baseline:
        return why
    if fmt not in schedule.engines:
        why.append(f"{what} (it has one threshold)")
    if config.stopping.metric != "top1":
        why.append(f"the {config.stopping.metric} metric (its threshold is on the top-1 probability)")
    if fmt == "hf":
        if config.stopping.semantics != "hf":
            why.append("our rule (HF keeps the token that fails the threshold)")
        if config.stopping.min_draft_len > 0:
            why.append("a minimum draft length")
    elif config.stopping.semantics != "llamacpp":
        why.append("our rule (llama.cpp drops a failing token and discards drafts below --spec-draft-n-min)")
    return why

"""Frozen configuration: the policy being tuned and how tokens are verified.

CLI flags, sweep files and Optuna trials only override fields of these dataclasses;
unknown keys are errors, and every result stores the config it ran with (`to_dict`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field

from dspark_bench.errors import DsparkError

METRICS = ("top1", "entropy", "topk_mass", "margin")
# A signal fitted on a replay record from the raw ones (decoding/learned_signal.py): a metric that
# needs `signal_model`, drafting with the draft model.
LEARNED = "learned"
SCHEDULES = ("threshold", "ramp", "cumulative", "fixed", "goodput", "budget")
# The schedules that decide with a goodput model (decoding/goodput.py, decoding/budget.py).
COST_AWARE = ("goodput", "budget")
# The batch layouts the budget schedule prices a pass in (decoding/budget.py, replay/cost.py).
LAYOUTS = ("padded", "packed")
# How an engine applies the rule (schedule.py): ours drops the token that fails it and always
# keeps the first min_draft_len; HF assisted generation keeps the failing token; llama.cpp drops
# it, and discards a draft shorter than min_draft_len (that step decodes normally).
SEMANTICS = ("dspark", "hf", "llamacpp")
# Where the rule cuts a draft (drafters.draft_block): the draft loop stops as the rule says, the
# host reading each confidence; or the draft runs to gamma_max and the verify keeps the rule's
# prefix, decided on the device with one host read per round. Greedy: the same tokens and rounds.
DRAFT_MODES = ("early-stop", "verify-side")
# What proposes a round's tokens (drafters.py): a second causal LM stepped token by token; k
# heads on the target's last hidden state proposing a segment at once (heads.py); or prompt
# lookup, the continuation of the context's last n-gram where it occurred before.
DRAFTERS = ("model", "heads", "lookup")


DEFAULT_MAX_NEW_TOKENS = 128  # tokens per prompt when neither the flags nor the task say

# Field metadata marking a policy knob (one a sweep may search); the lists below derive from it.
POLICY = {"policy": True, "searched": True}


@dataclass(frozen=True)
class DecodeConfig:
    """One speculative-decoding policy plus its verification settings."""

    # The policy: the knobs a sweep searches and a calibration file stores (POLICY_FIELDS).
    metric: str = field(default="top1", metadata=POLICY)  # confidence signal (confidence.METRICS)
    schedule: str = field(default="threshold", metadata=POLICY)  # stopping rule (schedule.SCHEDULES)
    threshold: float = field(default=0.5, metadata=POLICY)  # stop when confidence < threshold
    threshold_start: float = field(default=0.3, metadata=POLICY)  # "ramp": threshold at position 1 ...
    threshold_end: float = field(default=0.8, metadata=POLICY)  # ... rising linearly to this at gamma_max
    gamma_max: int = field(default=5, metadata=POLICY)  # never draft more than this many tokens per round
    min_draft_len: int = field(default=1, metadata=POLICY)  # always draft at least this many
    topk: int = field(default=5, metadata={"policy": True, "searched": False})  # k of "topk_mass"
    # Batch size B > 1, padded layout: once fewer than this share of a round's rows are still
    # drafting (and every row has drafted the positions its rule always keeps: min_draft_len,
    # none under llama.cpp's), the round's draft stops for all of them, so a
    # batch stops paying for the longest drafts of a confident few. 0: each row stops on its own.
    batch_quorum: float = field(default=0.0, metadata=POLICY)
    semantics: str = field(default="dspark", metadata=POLICY)  # the engine whose rule variant applies
    # "goodput": the fitted acceptance curves and step costs it decides with (goodput.py): a
    # sweep folder's goodput_model.json. The schedule has no threshold; this is its data.
    goodput_model: str = field(default="", metadata={"policy": True, "searched": False})
    # "budget": the layout it prices a pass in (LAYOUTS) — padded, as the batched engine runs, or
    # packed, as vLLM, SGLang and TensorRT-LLM run (then predicted only). One row: the same rule.
    budget_layout: str = field(default="padded", metadata={"policy": True, "searched": False})
    # metric "learned": the fitted signal it reads (learned_signal.py): a sweep folder's learned_signal.json.
    signal_model: str = field(default="", metadata={"policy": True, "searched": False})
    drafter: str = field(default="model", metadata=POLICY)  # DRAFTERS: what proposes the tokens
    # "lookup": match the context's last n-gram, the longest of ngram_max..ngram_min that occurred before.
    ngram_min: int = field(default=1, metadata=POLICY)
    ngram_max: int = field(default=3, metadata=POLICY)
    # Verification and generation: what every policy of a run shares.
    draft_mode: str = "early-stop"  # DRAFT_MODES: where the rule cuts the draft
    compiled: bool = False  # static KV cache + torch.compile'd steps, both sides (decoding/cached_lm.py); batch size 1
    temperature: float = 0.0  # 0 = greedy verification; > 0 = rejection sampling
    top_p: float = 1.0  # nucleus filter, applied identically to target and draft
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    seed: int = 0  # seeds the sampling generator of each decode
    # Requests decoded together. Not a policy knob (a request's rounds do not depend on it under
    # greedy verification) but a sweep may search it: what a step costs, and so which policy
    # wins, does.
    batch_size: int = field(default=1, metadata={"policy": False, "searched": True})

    def __post_init__(self) -> None:
        validate(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> "DecodeConfig":
        return from_dict({**self.to_dict(), **changes})

    def drafter_key(self) -> tuple[str, int, int]:
        """What proposes the tokens, with its own knobs: one replay record per key."""
        return self.drafter, self.ngram_min, self.ngram_max

    def label(self) -> str:
        """Short human name of the policy, for tables and legends."""
        return self.drafter_prefix() + self.policy_label()

    def drafter_prefix(self) -> str:
        if self.drafter == "lookup":
            return f"lookup n{self.ngram_min}-{self.ngram_max} · "
        return "heads · " if self.drafter == "heads" else ""

    def policy_label(self) -> str:
        if self.schedule == "fixed":
            return f"fixed γ={self.gamma_max}" + self.batch_suffix()
        if self.schedule == "goodput":
            return f"{self.metric} goodput γ≤{self.gamma_max} min{self.min_draft_len}" + self.batch_suffix()
        if self.schedule == "budget":
            layout = " · packed" if self.budget_layout == "packed" else ""
            return f"{self.metric} budget γ≤{self.gamma_max} min{self.min_draft_len}{layout}" + self.batch_suffix()
        if self.schedule == "ramp":
            knob = f"{self.threshold_start:g}→{self.threshold_end:g}"
        else:
            knob = f"{self.threshold:g}"
        return f"{self.metric} {self.schedule} {knob} γ≤{self.gamma_max} min{self.min_draft_len}" + self.batch_suffix()

    def batch_suffix(self) -> str:
        engine = {"dspark": "", "hf": " · HF rule", "llamacpp": " · llama.cpp rule"}[self.semantics]
        quorum = f" quorum {self.batch_quorum:g}" if self.batch_quorum > 0 else ""
        mode = " · verify-side" if self.draft_mode == "verify-side" else ""
        mode += " · compiled" if self.compiled else ""
        return engine + quorum + mode + (f" · B={self.batch_size}" if self.batch_size > 1 else "")


# Every list of knobs derives from the declaration above: a policy's fields (as a calibration
# file stores them) and the ones a sweep's search space may name.
POLICY_FIELDS = tuple(f.name for f in dataclasses.fields(DecodeConfig) if f.metadata.get("policy"))
SEARCHABLE_FIELDS = tuple(f.name for f in dataclasses.fields(DecodeConfig) if f.metadata.get("searched"))


def with_defaults(values: dict) -> dict:
    """A stored config with every field it lacks at its default: a run made before a field
    existed (batch_size, say) ran with that default."""
    defaults = {f.name: f.default for f in dataclasses.fields(DecodeConfig)}
    return {**defaults, **values}


def from_dict(values: dict) -> DecodeConfig:
    """Build a DecodeConfig from a mapping, refusing keys it does not know."""
    known = {f.name for f in dataclasses.fields(DecodeConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise DsparkError(f"unknown decode setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return DecodeConfig(**values)


def _check_unit(name: str, value: float, metric: str) -> None:
    # Every metric is normalised to [0, 1] with 1 = most confident (see confidence.py),
    # so one range check covers all of them.
    if not 0.0 <= value <= 1.0:
        raise DsparkError(f"{name} {value:g} is outside the {metric} metric's range [0, 1]")


def _check_types(config: DecodeConfig) -> None:
    for name in ("gamma_max", "min_draft_len", "topk", "max_new_tokens", "seed", "batch_size", "ngram_min",
                 "ngram_max"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise DsparkError(f"{name} must be an integer (got {value!r})")
    for name in ("threshold", "threshold_start", "threshold_end", "temperature", "top_p", "batch_quorum"):
        value = getattr(config, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise DsparkError(f"{name} must be a finite number (got {value!r})")


def check_drafter(config: DecodeConfig) -> None:
    if config.drafter not in DRAFTERS:
        raise DsparkError(f"unknown drafter {config.drafter!r}; choose one of {', '.join(DRAFTERS)}")
    if not 1 <= config.ngram_min <= config.ngram_max:
        raise DsparkError(f"lookup needs 1 <= ngram_min <= ngram_max (got {config.ngram_min} and {config.ngram_max})")
    if config.drafter == "model":
        return
    if config.batch_size > 1:
        raise DsparkError(f"the {config.drafter} drafter runs at batch size 1 only (the batched engine drafts with a model)")
    if config.compiled:
        raise DsparkError(f"--compile works with the model drafter only, not {config.drafter}")
    if config.schedule in COST_AWARE:
        raise DsparkError(f"the {config.schedule} schedule decides with the draft model's acceptance fit and step cost, not the "
                          f"{config.drafter} drafter's: use another schedule")
    if config.drafter == "lookup" and config.draft_mode == "verify-side":
        raise DsparkError("the lookup drafter proposes on the host: its draft mode is early-stop")


def check_learned(config: DecodeConfig) -> None:
    if not isinstance(config.signal_model, str):
        raise DsparkError(f"signal_model must be a path (got {config.signal_model!r})")
    if config.metric != LEARNED:
        return
    if not config.signal_model:
        raise DsparkError("the learned metric needs its fitted signal: a replay sweep's folder, which holds "
                          "learned_signal.json (run/decode --signal-model); a replay sweep adds learned policies itself")
    if config.drafter != "model":
        raise DsparkError(f"the learned signal is fitted on the draft model's record, not the {config.drafter} drafter's")


def check_budget(config: DecodeConfig) -> None:
    if config.budget_layout not in LAYOUTS:
        raise DsparkError(f"unknown budget layout {config.budget_layout!r}; choose one of {', '.join(LAYOUTS)}")
    if config.schedule != "budget":
        return
    if config.batch_quorum > 0:
        raise DsparkError("the budget schedule decides for the whole batch itself: drop the batch quorum")
    if config.semantics != "dspark":
        raise DsparkError("the budget schedule keeps its last token as goodput does: it has no engine rule variant "
                          "(drop --semantics)")


def validate(config: DecodeConfig) -> None:
    _check_types(config)
    if config.metric not in (*METRICS, LEARNED):
        raise DsparkError(f"unknown confidence metric {config.metric!r}; choose one of {', '.join((*METRICS, LEARNED))}")
    check_learned(config)
    if config.schedule not in SCHEDULES:
        raise DsparkError(f"unknown schedule {config.schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if config.semantics not in SEMANTICS:
        raise DsparkError(f"unknown rule semantics {config.semantics!r}; choose one of {', '.join(SEMANTICS)}")
    if config.draft_mode not in DRAFT_MODES:
        raise DsparkError(f"unknown draft mode {config.draft_mode!r}; choose one of {', '.join(DRAFT_MODES)}")
    if config.draft_mode == "verify-side" and config.batch_size > 1:
        raise DsparkError("the verify-side draft mode runs at batch size 1 only (batched decoding drafts early-stop)")
    check_drafter(config)
    if not isinstance(config.compiled, bool):
        raise DsparkError(f"compiled must be true or false (got {config.compiled!r})")
    if config.compiled and config.batch_size > 1:
        raise DsparkError("compiled decoding runs at batch size 1 only (the batched cache is not static)")
    if config.schedule in COST_AWARE and not config.goodput_model:
        raise DsparkError(f"the {config.schedule} schedule needs a goodput model: pass --goodput-model with a replay "
                          "sweep's folder (it writes goodput_model.json)")
    if not isinstance(config.goodput_model, str):
        raise DsparkError(f"goodput_model must be a path (got {config.goodput_model!r})")
    check_budget(config)
    if config.gamma_max < 1:
        raise DsparkError(f"gamma_max must be at least 1 (got {config.gamma_max})")
    if config.min_draft_len < 0:
        raise DsparkError(f"min_draft_len must be at least 0 (got {config.min_draft_len})")
    if config.min_draft_len > config.gamma_max:
        raise DsparkError(f"min_draft_len ({config.min_draft_len}) must not exceed gamma_max ({config.gamma_max})")
    for name in ("threshold", "threshold_start", "threshold_end"):
        _check_unit(name, getattr(config, name), config.metric)
    if not 0.0 <= config.batch_quorum <= 1.0:
        raise DsparkError(f"batch_quorum {config.batch_quorum:g} is a share of the batch's rows: it must be in [0, 1]")
    if config.topk < 1:
        raise DsparkError(f"topk must be at least 1 (got {config.topk})")
    if config.temperature < 0:
        raise DsparkError(f"temperature must be >= 0 (got {config.temperature:g})")
    if not 0.0 < config.top_p <= 1.0:
        raise DsparkError(f"top_p must be in (0, 1] (got {config.top_p:g})")
    if config.batch_size < 1:
        raise DsparkError(f"batch_size must be at least 1 (got {config.batch_size})")
    if config.max_new_tokens < 1:
        raise DsparkError(f"max_new_tokens must be at least 1 (got {config.max_new_tokens})")


# The policy every field defaults to: the one place the defaults are written (flags, run configs
# and sweep specs that leave a knob unset take it from here).
DEFAULTS = DecodeConfig()


def expand(space: dict, base: DecodeConfig = DEFAULTS, strict: bool = True) -> list[DecodeConfig]:
    """Every policy of a search space (DecodeConfig field -> values) on top of `base`, in the
    space's own order (the last field varies fastest), without duplicates. The one expansion
    that run's grid, sweeps, calibration and export all use.

    Knobs that mean nothing to a policy are set to one value, so that policies that decode alike
    are one policy: the n-gram knobs outside lookup; under goodput the threshold (it has none),
    the rule (HF's keeps its last token, as ours does under goodput) and the goodput model only
    goodput reads. `strict`: a combination DecodeConfig refuses is an error (run: the flags
    asked for it); otherwise combinations that break a constraint between knobs
    (min_draft_len > gamma_max, ngram_min > ngram_max, heads or lookup at batch size > 1, the
    budget schedule with an engine rule or a quorum) are
    left out (a search space crosses every value with every other), and any other is an error.
    """
    names = list(space)
    first_threshold = space["threshold"][0] if space.get("threshold") else base.threshold
    out = []
    for combo in itertools.product(*(space[n] for n in names)):
        params = {**base.to_dict(), **dict(zip(names, combo))}
        if not strict and not _knobs_agree(params):
            continue
        if params["drafter"] != "lookup":
            params.update(ngram_min=DEFAULTS.ngram_min, ngram_max=DEFAULTS.ngram_max)
        if params["schedule"] in COST_AWARE:
            params.update(threshold=first_threshold, semantics="dspark" if params["semantics"] == "hf" else params["semantics"])
        else:
            params["goodput_model"] = ""
        if params["schedule"] != "budget" or params["batch_size"] == 1:
            params["budget_layout"] = "padded"  # one row: both layouts are one rule
        if params["metric"] != LEARNED:
            params["signal_model"] = ""  # only the learned metric reads it
        try:
            out.append(from_dict(params))
        except DsparkError as err:
            raise (err if strict else DsparkError(f"search space: {err}")) from None
    return list(dict.fromkeys(out))


def _knobs_agree(params: dict) -> bool:
    """The constraints between knobs that a search space's cross product can break."""
    return (params["min_draft_len"] <= params["gamma_max"] and params["ngram_min"] <= params["ngram_max"]
            and (params["drafter"] == "model" or params["batch_size"] == 1)
            and (params["metric"] != LEARNED or params["drafter"] == "model")
            and (params["schedule"] != "budget" or (params["semantics"] != "llamacpp" and params["batch_quorum"] == 0)))

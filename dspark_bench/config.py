"""Frozen configuration, one dataclass per concern: the stopping policy being tuned, the drafter
with its own knobs, how tokens are verified, how requests are batched; DecodeConfig composes them.

CLI flags, sweep files and Optuna trials only override their knobs, named flat (`threshold`,
`drafter`, `batch_size`: FIELDS says whose each is); unknown keys are errors, and every result
stores the config it ran with (`to_dict`, flat, so run.json and result tables keep one shape).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from dspark_bench import schedules
from dspark_bench.depth import DEPTH_POLICY_HELP
from dspark_bench.errors import DsparkError
from dspark_bench.knobs import Needs, check_declared, knob

# The confidence metrics a policy may read (decoding/confidence.py): gini is Σ p², the complement of
# the Gini impurity. The default search spaces (tuning/spec.py) name theirs and leave gini out.
METRICS = ("top1", "entropy", "topk_mass", "margin", "gini")
# A signal fitted on a replay record from the raw ones (decoding/learned_signal.py): a metric that
# needs `signal_model`, drafting with the draft model.
LEARNED = "learned"
SCHEDULES = tuple(schedules.SCHEDULES)  # the stopping rules, one object each (schedules.py)
# The batch layouts the budget schedule prices a pass in (decoding/budget.py, replay/cost.py, measure/cost_model.py).
LAYOUTS = ("padded", "packed")
# How an engine applies the rule (decoding/rules.py): ours drops the token that fails it and always
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


def read_by_schedule(name: str) -> Needs:
    """A knob only the schedules that read it use (Schedule.reads)."""
    readers = [s.name for s in schedules.SCHEDULES.values() if name in s.reads]
    return Needs(f"a schedule that reads it ({' or '.join(readers)})", lambda w, c: name in schedules.of(c).reads)


def controller_knob(name: str, default, help: str, needs: Needs | None = None, **limits):
    """An engine controller's knob: searched (several values: a grid axis), needing its schedule (or `needs`)."""
    return knob(default, help, searched=True, repeats=True, needs=needs or read_by_schedule(name), **limits)


GATED = Needs("trtllm-schedule with its gate on (--acceptance-rate-window-size above 0)", lambda w, c: (
    "acceptance_rate_threshold" in schedules.of(c).reads and c.stopping.acceptance_rate_window_size > 0))


SAMPLED = Needs("a temperature above 0 (greedy verification samples nothing)", lambda w, c: not c.greedy)
BATCHED = Needs("a batch size above 1", lambda w, c: c.batching.batch_size > 1)


@dataclass(frozen=True)
class StoppingPolicy:
    """The stopping policy: the confidence the draft reads and when its round stops."""

    metric: str = knob("top1", "Confidence signal the draft reads (learned: --signal-model).",
                       choices=(*METRICS, LEARNED), searched=True, repeats=True, noun="confidence metric")
    schedule: str = knob("threshold", "Stopping rule (goodput, budget, vllm-adaptive: --goodput-model; budget decides "
                         "for the whole batch).", choices=schedules.SCHEDULES, searched=True, repeats=True)
    # Every metric is normalised to [0, 1], 1 the most confident (confidence.py): one range for all.
    threshold: float = knob(0.5, "Stop drafting below this confidence.", at_least=0, at_most=1, searched=True,
                            repeats=True, needs=read_by_schedule("threshold"))
    threshold_start: float = knob(0.3, "Ramp schedule: the threshold at draft position 1 ...", at_least=0, at_most=1,
                                  searched=True, needs=read_by_schedule("threshold_start"))
    threshold_end: float = knob(0.8, "... rising linearly to this at gamma_max.", at_least=0, at_most=1,
                                searched=True, needs=read_by_schedule("threshold_end"))
    gamma_max: int = knob(5, "Most draft tokens per round.", at_least=1, searched=True, repeats=True)
    min_draft_len: int = knob(1, "Fewest draft tokens per round (llama.cpp's rule: a shorter draft is discarded).",
                              at_least=0, searched=True, repeats=True)
    depth_policy: str = knob("", DEPTH_POLICY_HELP, repeats=True, check=schedules.check_depth_policy,
                             needs=read_by_schedule("depth_policy"))
    # The learned signal reads topk_mass among its raw signals (decoding/learned_signal.py).
    topk: int = knob(5, "k of the topk_mass metric.", at_least=1, needs=Needs(
        "the topk_mass or learned metric", lambda w, c: bool(schedules.round_metrics(c) & {"topk_mass", LEARNED})))
    # B > 1, padded: once fewer than this share of a round's rows still draft (each past what its rule always
    # keeps), every row's draft stops, so a batch stops paying for a confident few's longest drafts.
    batch_quorum: float = knob(0.0, "B > 1: stop every row's draft once fewer than this share of the rows still "
                               "draft (0: each row on its own).", at_least=0, at_most=1, searched=True, needs=BATCHED)
    # How an engine applies the rule (decoding/rules.py): SEMANTICS.
    semantics: str = knob("dspark", "Whose rule: dspark (drops the failing token) | hf (keeps it) | llamacpp (drops "
                          "it; a draft shorter than --min-draft-len is discarded).", choices=SEMANTICS, searched=True,
                          repeats=True, noun="rule semantics")
    # The fitted files two schedules and one metric decide with: "goodput"/"budget" read goodput_model.json
    # (goodput.py; they have no threshold, this is their data); "learned" its learned_signal.json.
    goodput_model: str = knob("", "The goodput and budget schedules' acceptance fit and step costs (vllm-adaptive's "
                              "costs): a replay sweep's folder (or its goodput_model.json).", path=True, needs=Needs(
                                  "goodput, budget or vllm-adaptive", lambda w, c: schedules.rounds_read_costs(c)))
    # "budget": the layout it prices a pass in (LAYOUTS) — padded, as the batched decoder runs, or
    # packed, as vLLM, SGLang and TensorRT-LLM run (then predicted only). One row: the same rule.
    budget_layout: str = knob("padded", "Budget schedule: price each pass as the padded layout does (its longest "
                              "row; what this decoder runs) or the packed one (its total tokens; vLLM, SGLang, "
                              "TensorRT-LLM).", choices=LAYOUTS, noun="budget layout",
                              needs=Needs("the budget schedule at a batch size above 1",
                                          lambda w, c: schedules.of(c).whole_batch and c.batching.batch_size > 1))
    signal_model: str = knob("", "Metric learned: the fitted signal, a replay sweep's folder (or its "
                             "learned_signal.json).", path=True,
                             needs=Needs("the learned metric", lambda w, c: LEARNED in schedules.round_metrics(c)))
    # An engine controller's knobs (decoding/controllers.py), by its own names (SGLang's: its slot for B = 1).
    candidate_steps: str = controller_knob("candidate_steps", "1,3,5,7", schedules.CANDIDATE_STEPS_HELP,
                                           check=lambda p: schedules.candidate_steps(p.candidate_steps))
    ema_alpha: float = controller_knob("ema_alpha", 0.2, "sglang-adaptive: the weight of the latest step's mean "
                                       "accepted drafts in the EMA.", above=0, at_most=1)
    update_interval: int = controller_knob("update_interval", 5, "sglang-adaptive: steps between draft-length "
                                           "decisions.", at_least=1)
    warmup_batches: int = controller_knob("warmup_batches", 10, "sglang-adaptive: steps before the first decision.",
                                          at_least=0)
    up_hysteresis: float = controller_knob("up_hysteresis", 0.0, "sglang-adaptive: added to the EMA a step up must "
                                           "exceed (k - 0.5 + this).")
    down_hysteresis: float = controller_knob("down_hysteresis", -0.25, "sglang-adaptive: added to the EMA a step "
                                             "down must reach (k' - 0.5 + this).")
    ceiling_coeff: float = controller_knob("ceiling_coeff", 0.0, "sglang-adaptive: caps a length kept or lowered at "
                                           "ceil(EMA × this) (0: off).", at_least=0)
    draft_len_schedule: str = controller_knob("draft_len_schedule", "", schedules.DRAFT_LEN_SCHEDULE_HELP,
                                              check=lambda p: schedules.draft_len_schedule(p.draft_len_schedule))
    acceptance_rate_window_size: int = controller_knob("acceptance_rate_window_size", 0, "trtllm-schedule: steps "
                                                       "whose acceptance the gate averages (0: no gate).", at_least=0)
    acceptance_rate_threshold: float = controller_knob("acceptance_rate_threshold", 0.0, "trtllm-schedule: below "
                                                       "this mean acceptance the gate switches drafting off for good.",
                                                       at_least=0, at_most=1, needs=GATED)
    num_speculative_tokens_per_batch_size: str = controller_knob(
        "num_speculative_tokens_per_batch_size", "", schedules.SPECULATIVE_TOKENS_HELP,
        check=lambda p: schedules.speculative_tokens_table(p.num_speculative_tokens_per_batch_size))

    def __post_init__(self) -> None:
        check_declared(self)
        check_stopping(self)


LOOKUP = Needs("the lookup drafter", lambda w, c: c.drafting.drafter == "lookup")


@dataclass(frozen=True)
class Drafting:
    """What proposes a round's tokens, with its own knobs: its identity, one replay record each."""

    drafter: str = knob("model", "What drafts: model (the draft model) | heads (multi-token heads on the target; "
                        "--heads) | lookup (prompt lookup: n-gram matching, no model).", choices=DRAFTERS,
                        searched=True, repeats=True)
    # "lookup": match the context's last n-gram, the longest of ngram_max..ngram_min that occurred before.
    ngram_min: int = knob(1, "Lookup drafter: the shortest n-gram matched.", searched=True, needs=LOOKUP)
    ngram_max: int = knob(3, "Lookup drafter: the longest n-gram matched (tried first).", searched=True, needs=LOOKUP)

    def __post_init__(self) -> None:
        check_declared(self)
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise DsparkError(f"lookup needs 1 <= ngram_min <= ngram_max (got {self.ngram_min} and {self.ngram_max})")

    def prefix(self) -> str:
        """The drafter in a policy's label (the draft model, the default, goes unnamed)."""
        if self.drafter == "lookup":
            return f"lookup n{self.ngram_min}-{self.ngram_max} · "
        return "heads · " if self.drafter == "heads" else ""


@dataclass(frozen=True)
class Verification:
    """How drafted tokens are checked and how much is generated: what every policy of a run shares."""

    draft_mode: str = knob("early-stop", "Where the rule cuts a draft: early-stop (the draft loop stops; one host "
                           "sync per draft step) | verify-side (draft gamma_max, cut on the device; one sync per "
                           "round). Batch size 1.", choices=DRAFT_MODES, policy=False, repeats=True, noun="draft mode")
    compiled: bool = knob(False, "Static KV cache and torch.compile'd draft/verify steps (CUDA graphs on a GPU), both "
                          "sides; batched on a static cache of B slots. Pays on a GPU, not on a CPU (see README).",
                          policy=False, flag="--compile")
    temperature: float = knob(0.0, "0 = greedy verification; > 0 = lossless rejection sampling.", at_least=0.0,
                              policy=False)
    top_p: float = knob(1.0, "Nucleus filter, applied to target and draft alike.", above=0.0, at_most=1.0,
                        policy=False, needs=SAMPLED)
    max_new_tokens: int = knob(DEFAULT_MAX_NEW_TOKENS, "Tokens to generate per prompt (default: the task's, else "
                               f"{DEFAULT_MAX_NEW_TOKENS}).", at_least=1, policy=False)
    seed: int = knob(0, "Sampling seed (seeds each decode's generator).", policy=False)

    def __post_init__(self) -> None:
        check_declared(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Batching:
    """Requests decoded together (how a batch's round stops, batch_quorum and the budget schedule's
    layout, is the stopping policy's)."""

    # Not a policy knob (a request's rounds do not depend on it under greedy verification) but a
    # sweep may search it: what a step costs, and so which policy wins, does.
    batch_size: int = knob(1, "Requests decoded together. B > 1: the batched decoder, padded layout, both sides on "
                           "the same batches.", at_least=1, policy=False, searched=True, repeats=True)

    def __post_init__(self) -> None:
        check_declared(self)


@dataclass(frozen=True)
class DecodeConfig:
    """One run's configuration: the stopping policy, the drafter, verification and batching, each
    its own frozen config. Stored flat (`to_dict`: knob -> value, as flags, sweep specs, run.json and
    result tables name the knobs); `of(**knobs)` builds one from flat knobs."""

    stopping: StoppingPolicy = field(default_factory=StoppingPolicy)
    drafting: Drafting = field(default_factory=Drafting)
    verification: Verification = field(default_factory=Verification)
    batching: Batching = field(default_factory=Batching)

    def __post_init__(self) -> None:
        check_combination(self)

    @classmethod
    def of(cls, **knobs) -> "DecodeConfig":
        return from_dict(knobs)

    @property
    def greedy(self) -> bool:
        return self.verification.greedy

    def to_dict(self) -> dict:
        """Flat knob -> value, every knob (FIELDS)."""
        parts = {part: getattr(self, part) for part in PARTS}
        return {name: getattr(parts[part], name) for name, part in FIELDS.items()}

    def replace(self, **changes) -> "DecodeConfig":
        return from_dict({**self.to_dict(), **changes})

    def label(self) -> str:
        """Short human name of the policy, for tables and legends."""
        return self.drafting.prefix() + self.policy_label()

    def policy_label(self) -> str:
        return schedules.of(self).label(self.stopping) + self.batch_suffix()

    def batch_suffix(self) -> str:
        engine = {"dspark": "", "hf": " · HF rule", "llamacpp": " · llama.cpp rule"}[self.stopping.semantics]
        quorum = f" quorum {self.stopping.batch_quorum:g}" if self.stopping.batch_quorum > 0 else ""
        mode = " · verify-side" if self.verification.draft_mode == "verify-side" else ""
        mode += " · compiled" if self.verification.compiled else ""
        size = self.batching.batch_size
        return engine + quorum + mode + (f" · B={size}" if size > 1 else "")


# The parts a DecodeConfig composes, and which part each flat knob belongs to (knob names are
# unique across parts). Every list of knobs derives from these declarations: a policy's fields
# (as a calibration file stores them) and the ones a sweep's search space may name.
PARTS = {f.name: f.default_factory for f in dataclasses.fields(DecodeConfig)}
FIELDS = {f.name: part for part, cls in PARTS.items() for f in dataclasses.fields(cls)}
_FIELD_SPECS = [f for cls in PARTS.values() for f in dataclasses.fields(cls)]
KNOBS = {f.name: f for f in _FIELD_SPECS}  # every knob's declaration (knob()), by its flat name
POLICY_FIELDS = tuple(f.name for f in _FIELD_SPECS if f.metadata.get("policy"))
SEARCHABLE_FIELDS = tuple(f.name for f in _FIELD_SPECS if f.metadata.get("searched"))


def same_as(name: str, of=None, **changes):
    """A field elsewhere (a workload's) that is this knob: its declaration, `changes` aside. `of`:
    the dataclass that declares it, where that is not DecodeConfig (a sweep's `limit` is the
    workload's, with a default of its own)."""
    declared = KNOBS[name] if of is None else {f.name: f for f in dataclasses.fields(of)}[name]
    return field(default=changes.get("default", declared.default), metadata=declared.metadata)


def with_defaults(values: dict) -> dict:
    """A stored config with every knob it lacks at its default: a run made before a knob
    existed (batch_size, say) ran with that default."""
    return {**DecodeConfig().to_dict(), **values}


def from_dict(values: dict) -> DecodeConfig:
    """Build a DecodeConfig from flat knobs (any left out at their defaults), refusing knobs it does not
    know, with those its schedule fixes (Schedule.implied, reading every knob: the depth schedule's gamma_max)."""
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise DsparkError(f"unknown decode setting(s) {', '.join(unknown)}; known: {', '.join(sorted(FIELDS))}")
    values = {**values, **schedules.named(values.get("schedule", "")).implied({**DEFAULTS.to_dict(), **values})}
    split = {part: {} for part in PARTS}
    for name, value in values.items():
        split[FIELDS[name]][name] = value
    return DecodeConfig(**{part: PARTS[part](**knobs) for part, knobs in split.items()})


def check_stopping(policy: StoppingPolicy) -> None:
    """The stopping policy's constraints between its knobs (each knob's own range: check_declared)."""
    if policy.metric == LEARNED and not policy.signal_model:
        raise DsparkError("the learned metric needs its fitted signal: a replay sweep's folder, which holds "
                          "learned_signal.json (run/decode --signal-model); a replay sweep adds learned "
                          "policies itself")
    schedule = schedules.of(policy)
    if schedule.cost_aware and not policy.goodput_model:  # vllm-adaptive's: its controller's (a sweep gives it its own)
        raise DsparkError(f"the {policy.schedule} schedule needs a goodput model: pass --goodput-model with a replay "
                          "sweep's folder (it writes goodput_model.json)")
    if schedule.whole_batch and policy.batch_quorum > 0:
        raise DsparkError("the budget schedule decides for the whole batch itself: drop the batch quorum")
    if schedule.whole_batch and policy.semantics != "dspark":
        raise DsparkError("the budget schedule keeps its last token as goodput does: it has no engine rule variant "
                          "(drop --semantics)")
    if schedule.controlled and policy.batch_quorum > 0:
        raise DsparkError(f"the {policy.schedule} controller sets the whole batch's draft length itself: drop the "
                          "batch quorum")
    if policy.min_draft_len > policy.gamma_max:
        raise DsparkError(f"min_draft_len ({policy.min_draft_len}) must not exceed gamma_max ({policy.gamma_max})")


def check_drafter(config: DecodeConfig) -> None:
    """What a drafter other than the draft model cannot be combined with."""
    drafter = config.drafting.drafter
    if drafter == "model":
        return
    if config.batching.batch_size > 1:
        raise DsparkError(f"the {drafter} drafter runs at batch size 1 only (the batched decoder drafts with a model)")
    if config.verification.compiled:
        raise DsparkError(f"--compile works with the model drafter only, not {drafter}")
    if schedules.of(config).reads_costs:
        raise DsparkError(f"the {config.stopping.schedule} schedule decides with the draft model's step costs, not "
                          f"the {drafter} drafter's: use another schedule")
    if config.stopping.metric == LEARNED:
        raise DsparkError(f"the learned signal is fitted on the draft model's record, not the {drafter} drafter's")
    if drafter == "lookup" and config.verification.draft_mode == "verify-side":
        raise DsparkError("the lookup drafter proposes on the host: its draft mode is early-stop")


def check_combination(config: DecodeConfig) -> None:
    """The constraints between parts (each part checked its own knobs when it was built)."""
    batched = config.batching.batch_size > 1
    if config.verification.draft_mode == "verify-side" and (batched or schedules.of(config).priced):
        raise DsparkError("the verify-side draft mode runs at batch size 1 only (batched decoding drafts early-stop)"
                          if batched else f"{config.stopping.schedule} trims drafts on the host: draft early-stop")
    if schedules.any_family(config) and (batched or config.drafting.drafter != "model"):
        raise DsparkError("a depth policy whose entries name their own family runs at batch size 1, on the draft model")
    check_drafter(config)


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
    goodput reads (and, as from_dict sets them, the knobs a schedule fixes). `strict`: a combination
    DecodeConfig refuses is an error (run: the flags asked for it); otherwise combinations that break
    a constraint between knobs (min_draft_len > gamma_max, ngram_min > ngram_max, heads or lookup at
    batch size > 1, the budget schedule with an engine rule or a quorum, a controller with a quorum) are
    left out (a search space crosses every value with every other), and any other is an error.
    """
    names = list(space)
    first_threshold = space["threshold"][0] if space.get("threshold") else base.stopping.threshold
    out = []
    for combo in itertools.product(*(space[n] for n in names)):
        params = {**base.to_dict(), **dict(zip(names, combo))}
        if not strict and not _knobs_agree(params):
            continue
        if params["drafter"] != "lookup":
            params.update(ngram_min=DEFAULTS.drafting.ngram_min, ngram_max=DEFAULTS.drafting.ngram_max)
        schedule = schedules.named(params["schedule"])
        if schedule.cost_aware or schedule.controlled:  # no threshold read (a controller: nor rule nor metric)
            params.update(threshold=first_threshold,
                          semantics="dspark" if params["semantics"] == "hf" else params["semantics"])
        if schedule.controlled:
            params["metric"] = DEFAULTS.stopping.metric
        if not schedule.reads_costs and not schedule.by_depth:  # a depth policy's entries may read it
            params["goodput_model"] = ""
        if not schedule.whole_batch or params["batch_size"] == 1:
            params["budget_layout"] = "padded"  # one row: both layouts are one rule
        if params["metric"] != LEARNED and not schedule.by_depth:
            params["signal_model"] = ""  # only the learned metric reads it (a depth policy's entries too)
        # only a controller reads its knobs (and a gate's threshold, only a gate: window > 0)
        params.update({name: KNOBS[name].default for name in schedules.controller_knobs() if name not in schedule.reads
                       or (name == "acceptance_rate_threshold" and not params["acceptance_rate_window_size"])})
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
            and (not schedules.named(params["schedule"]).whole_batch
                 or (params["semantics"] != "llamacpp" and params["batch_quorum"] == 0))
            and (not schedules.named(params["schedule"]).controlled or params["batch_quorum"] == 0))

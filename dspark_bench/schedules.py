"""The stopping rules (schedules), one object each: everything the tool needs to know of a
schedule lives here, so that no other module branches on a schedule's name.

A schedule says when the drafter stops proposing tokens in a round, from the confidence of each
token it proposed. What differs between them, and what every other part reads:

- the thresholds it reads (`reads`: a threshold, a ramp's start and end, none) and the one a
  token at a draft position must reach (`threshold_at`);
- whether it compares each token's confidence or the running product of them (`cumulative`:
  the estimate of the whole block surviving);
- whether it decides with a goodput model instead (`cost_aware`: goodput, budget; decoding/goodput.py),
  and then keeps the token where it stops, as it decides before drafting the next one;
- whether it decides for the whole batch at once (`whole_batch`: budget; decoding/budget.py);
- whether it keys its policy by the round's context depth (`by_depth`: depth; a policy per depth
  bucket of depth.py, a threshold rule or any family's, each round running its bucket's: decoding/rules.at_depth);
- whether it is the classic baseline, a fixed draft length (`baseline`), that every policy is
  compared to;
- whether an engine's own controller picks each round's draft length from what earlier rounds
  accepted (`controlled`: sglang-adaptive, trtllm-schedule, vllm-adaptive; its state carried across
  rounds and requests as the engine keeps it, decoding/controllers.py; its knobs are
  config.StoppingPolicy's last), and whether that controller prices each step with a goodput
  model's step costs (`priced`: vllm-adaptive, whose budget is an argmax over costs);
- which serving engines can run it (`engines`), and how a policy of it is labelled.

The rule's arithmetic lives where it runs (decoding/rules.py on the host and the device,
replay/simulate.py and replay/batched.py in replay), reading these properties; the equality
tests hold those forms equal. A new schedule is one entry in SCHEDULES (docs/architecture.md,
"Where a new piece goes", shows one).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dspark_bench.depth import DEPTH_LABELS, DEPTH_POLICY_EXAMPLE, depth_entries, depth_policy
from dspark_bench.errors import DsparkError

# The serving engines an exported policy may run in (engines/export.py's formats).
THRESHOLD_ENGINES = ("hf", "llamacpp")  # one threshold on the draft's top-1 probability
FIXED_ENGINES = ("vllm", "sglang", "trtllm")  # a fixed draft length (per batch size)


@dataclass(frozen=True)
class Schedule:
    name: str
    reads: tuple[str, ...] = ()  # the threshold knobs it reads (a controller: its own knobs)
    cumulative: bool = False  # compares the running product of the confidences
    cost_aware: bool = False  # decides with a goodput model (goodput_model), keeping its last token
    whole_batch: bool = False  # decides for every row of a batch at once
    baseline: bool = False  # a fixed draft length: drafts gamma_max every round
    by_depth: bool = False  # a policy per context-depth bucket (depth_policy), no threshold per position
    controlled: bool = False  # an engine's controller picks each round's length from earlier rounds' acceptance
    priced: bool = False  # its controller budgets each step with a goodput model's step costs (goodput_model)
    engines: tuple[str, ...] = ()  # serving engines that can run it exactly (given the rest of the policy)

    def threshold_at(self, policy, position: int) -> float:
        """The confidence a token at this draft position (1-based) must reach to be kept."""
        if self.baseline or self.controlled:  # a controller's round drafts its length whatever the confidence
            return 0.0
        if self.by_depth:
            raise DsparkError("a depth policy has a threshold per depth bucket, not per draft position: "
                              "replay.simulate walks it one policy at a time (a grid walks each bucket's threshold "
                              "policy: decoding.rules.at_depth)")
        if "threshold_start" in self.reads:  # a ramp from threshold_start at 1 to threshold_end at gamma_max
            if policy.gamma_max == 1:
                return policy.threshold_start
            frac = (position - 1) / (policy.gamma_max - 1)
            return policy.threshold_start + frac * (policy.threshold_end - policy.threshold_start)
        return policy.threshold

    def label(self, policy) -> str:
        """The policy's name in tables and legends (the stopping policy `policy`, its batch aside)."""
        if self.baseline:
            return f"fixed γ={policy.gamma_max}"
        if self.controlled:
            return f"{self.name} {controller_label(self, policy)}"
        if self.by_depth:  # each bucket's threshold/γ_max, shallowest first (the last holds deeper)
            entries = "·".join(depth_entries(policy.depth_policy))
            return f"{policy.metric} {self.name} {entries} min{policy.min_draft_len}"
        if self.cost_aware:
            packed = " · packed" if self.whole_batch and policy.budget_layout == "packed" else ""
            return f"{policy.metric} {self.name} γ≤{policy.gamma_max} min{policy.min_draft_len}{packed}"
        knob = (f"{policy.threshold_start:g}→{policy.threshold_end:g}" if "threshold_start" in self.reads
                else f"{policy.threshold:g}")
        return f"{policy.metric} {self.name} {knob} γ≤{policy.gamma_max} min{policy.min_draft_len}"

    def implied(self, knobs: dict) -> dict:
        """The knobs this schedule fixes, given a policy's flat knobs (config.from_dict: every policy
        built from knobs has them): off the depth schedule, no depth policy; on it, gamma_max is its
        largest γ_max (the decoder's caches and replay's records are sized by it), the threshold its
        shallowest bucket's (it reads none: one value), and the policy written as its label reads. A
        malformed depth policy is refused under any schedule."""
        if self.controlled:  # it drafts the lengths it picks, every token kept: our rule, no minimum
            return {"depth_policy": "", "min_draft_len": 0, "semantics": "dspark", **controller_implied(self, knobs)}
        text = knobs.get("depth_policy", "")
        buckets = depth_policy(text) if isinstance(text, str) else ()  # (not a string: the declared type's check)
        if not self.by_depth:
            return {"depth_policy": ""}
        if not buckets:
            return {}  # none given: the policy's own check says so
        return {"gamma_max": max(e.gamma_max for e in buckets), "threshold": buckets[0].threshold,
                "depth_policy": ",".join(depth_entries(text))}

    @property
    def reads_costs(self) -> bool:
        """It decides with a goodput model (goodput_model): its acceptance fit and step costs, or the costs alone."""
        return self.cost_aware or self.priced

    @property
    def one_threshold(self) -> bool:
        """It reads the `threshold` knob alone (a policy of it is drawn against that threshold)."""
        return self.reads == ("threshold",)


# The names other modules write policies with (a name read here, never spelt out there).
THRESHOLD, CUMULATIVE, GOODPUT, BUDGET, DEPTH = "threshold", "cumulative", "goodput", "budget", "depth"
SGLANG_ADAPTIVE, TRTLLM_SCHEDULE, VLLM_ADAPTIVE = "sglang-adaptive", "trtllm-schedule", "vllm-adaptive"
SCHEDULES = {s.name: s for s in (
    Schedule(THRESHOLD, reads=("threshold",), engines=THRESHOLD_ENGINES),
    Schedule("ramp", reads=("threshold_start", "threshold_end")),
    Schedule(CUMULATIVE, reads=("threshold",), cumulative=True),
    Schedule("fixed", baseline=True, engines=(*THRESHOLD_ENGINES, *FIXED_ENGINES)),
    Schedule(GOODPUT, cost_aware=True),
    Schedule(BUDGET, cost_aware=True, whole_batch=True),
    # In no default search space: a search builds depth policies from each bucket's best
    # (docs/policy-and-metrics.md, "The depth schedule").
    Schedule(DEPTH, reads=("depth_policy",), by_depth=True),
    # SGLang's --speculative-adaptive (sglang 0.5.23: docs/engine-controllers.md).
    # The engines' own controllers (decoding/controllers.py; docs/engine-controllers.md): what they read, their knobs.
    Schedule(SGLANG_ADAPTIVE, controlled=True, engines=("sglang",), reads=(
        "candidate_steps", "ema_alpha", "update_interval", "warmup_batches", "up_hysteresis", "down_hysteresis",
        "ceiling_coeff")),
    Schedule(TRTLLM_SCHEDULE, controlled=True, engines=("trtllm",), reads=(
        "draft_len_schedule", "acceptance_rate_window_size", "acceptance_rate_threshold")),
    Schedule(VLLM_ADAPTIVE, controlled=True, priced=True, engines=("vllm",),
             reads=("num_speculative_tokens_per_batch_size",)),
)}
BASELINE = next(name for name, s in SCHEDULES.items() if s.baseline)  # "fixed": what every policy is compared to


def of(policy) -> Schedule:
    """The schedule of a stopping policy (config.StoppingPolicy) or of a DecodeConfig."""
    return named(getattr(policy, "stopping", policy).schedule)


def named(name: str) -> Schedule:
    """The schedule called `name`; an unknown name is a schedule with no properties, for the
    config's own check to refuse in one line (knobs.check_declared)."""
    return (SCHEDULES.get(name) if isinstance(name, str) else None) or Schedule(name)


def where(table, **properties):
    """A boolean mask of a table's rows (a DataFrame with a "schedule" column) whose schedules have
    `properties`, e.g. where(table, baseline=True)."""
    chosen = set(names(**properties))
    return table["schedule"].isin(chosen)


def controller_knobs() -> tuple[str, ...]:
    """The engine controllers' knobs (each read by its controlled schedule alone), in declaration order."""
    return tuple(dict.fromkeys(name for s in SCHEDULES.values() if s.controlled for name in s.reads))


def names(**properties) -> tuple[str, ...]:
    """The schedules with `properties`, e.g. names(cost_aware=True)."""
    return tuple(name for name, s in SCHEDULES.items() if all(getattr(s, k) == v for k, v in properties.items()))


# --- the depth schedule's policy: one policy per context-depth bucket (depth.py reads its knob) -------

# What a depth policy's entry may run of its own: one rule a round, row by row (not a ramp, a budget
# over a batch, an engine's controller or another depth policy).
ENTRY_SCHEDULES = tuple(name for name, s in SCHEDULES.items()
                        if s.one_threshold or s.baseline or (s.cost_aware and not s.whole_batch))


def entries_of(policy) -> tuple:
    """The depth policy's entries of a stopping policy (or DecodeConfig), one per depth bucket; none
    off the depth schedule."""
    stop = getattr(policy, "stopping", policy)
    return depth_policy(stop.depth_policy) if of(stop).by_depth else ()


def round_metrics(policy) -> set[str]:
    """The metrics a policy's rounds read: its own, or under the depth schedule each bucket's."""
    stop = getattr(policy, "stopping", policy)
    return {e.metric if e.own else stop.metric for e in entries_of(stop)} or {stop.metric}


def rounds_read_costs(policy) -> bool:
    """Whether any of a policy's rounds decides with a goodput model (Schedule.reads_costs)."""
    return of(policy).reads_costs or any(named(e.schedule).reads_costs for e in entries_of(policy) if e.own)


def any_family(policy) -> bool:
    """Whether a depth policy runs, in some bucket, a policy that names its own family."""
    return any(e.own for e in entries_of(policy))


def check_depth_policy(policy) -> None:
    """The depth_policy knob, checked with its stopping policy (knobs.check_declared's hook): well
    formed under any schedule; under the depth schedule given, with gamma_max its largest γ_max,
    min_draft_len within its smallest plain entry's, and each entry of its own family a policy that
    stands with the depth policy's other knobs (its signal or goodput model given)."""
    buckets = depth_policy(policy.depth_policy)
    if not of(policy).by_depth:
        return
    if not buckets:
        raise DsparkError(f"the depth schedule needs --depth-policy: a policy per depth bucket "
                          f"({', '.join(DEPTH_LABELS)}), e.g. {DEPTH_POLICY_EXAMPLE}")
    gammas = [e.gamma_max for e in buckets]
    if policy.gamma_max != max(gammas):
        raise DsparkError(f"gamma_max ({policy.gamma_max}) must be the depth policy's largest gamma_max, "
                          f"{max(gammas)} ({policy.depth_policy})")
    plain = [e.gamma_max for e in buckets if not e.own]
    if plain and policy.min_draft_len > min(plain):
        raise DsparkError(f"min_draft_len ({policy.min_draft_len}) must not exceed the depth policy's smallest "
                          f"gamma_max, {min(plain)} ({policy.depth_policy})")
    for entry in dict.fromkeys(e for e in buckets if e.own):
        if entry.schedule not in ENTRY_SCHEDULES:
            raise DsparkError(f"depth_policy entry {entry.text()!r}: a bucket runs one of "
                              f"{', '.join(ENTRY_SCHEDULES)}, not {entry.schedule!r}")
        try:  # the bucket's policy, checked as any policy is (its metric, its signal or goodput model)
            dataclasses.replace(policy, depth_policy="", **entry.knobs())
        except DsparkError as err:
            raise DsparkError(f"depth_policy entry {entry.text()!r}: {err}") from None


# --- an engine controller's candidate draft lengths ---------------------------------------------------

CANDIDATE_STEPS_HELP = ("sglang-adaptive: the draft lengths its controller picks from, comma-separated "
                        "(SGLang's candidate_steps; 0 drafts nothing, a plain step), e.g. 1,3,5,7.")


def candidate_steps(text, check: bool = True) -> tuple[int, ...]:
    """A controller's candidate draft lengths from its knob ("1,3,5,7"), sorted and each once, as
    SGLang's AdaptiveStepSlot keeps them. `check`: refuse an empty list, a negative length or a
    word that is not a whole number in one line (unchecked: implied's reading, () for what does not parse)."""
    steps = []
    for entry in (text.split(",") if isinstance(text, str) and text.strip() else []):
        try:
            steps.append(int(entry))
        except ValueError:
            if not check:
                return ()  # the knob's own check refuses it
            raise DsparkError(f"candidate_steps entry {entry.strip()!r} is not a whole number (e.g. 1,3,5,7)") from None
    if check and not steps:
        raise DsparkError("candidate_steps is empty: give the draft lengths the controller picks from, e.g. 1,3,5,7")
    if check and min(steps) < 0:
        raise DsparkError(f"candidate_steps {text!r} has a negative draft length; each must be 0 or more")
    return tuple(sorted(set(steps)))


DRAFT_LEN_SCHEDULE_HELP = ("trtllm-schedule: batch size:draft length pairs, comma-separated (TensorRT-LLM's "
                           "draft_len_schedule: each length up to its batch size, 0 above the last; the first is "
                           "the longest), e.g. 4:4,8:2,32:1; empty: gamma_max at every batch size.")


def draft_len_schedule(text, check: bool = True) -> tuple[tuple[int, int], ...]:
    """TensorRT-LLM's draft_len_schedule from its knob ("4:4,8:2,32:1"): (batch size, draft length)
    pairs by batch size. `check`: refuse what TensorRT-LLM's validator refuses (a batch size below 1,
    a negative length, a length above the first key's) in one line; unchecked, () for what does not parse."""
    pairs = []
    for entry in (text.split(",") if isinstance(text, str) and text.strip() else []):
        size, _, length = entry.partition(":")
        try:
            pairs.append((int(size), int(length)))
        except ValueError:
            if not check:
                return ()
            raise DsparkError(f"draft_len_schedule entry {entry.strip()!r} is not batch_size:draft_length "
                              "(e.g. 4:4,8:2,32:1)") from None
    pairs = sorted(dict(pairs).items())
    if check and any(size < 1 or length < 0 for size, length in pairs):
        raise DsparkError(f"draft_len_schedule {text!r}: batch sizes must be at least 1 and lengths at least 0")
    if check and pairs and max(length for _, length in pairs) != pairs[0][1]:
        raise DsparkError(f"draft_len_schedule {text!r}: its smallest batch size's length must be the longest "
                          "(TensorRT-LLM's max_draft_len)")
    return tuple(pairs)


SPECULATIVE_TOKENS_HELP = ("vllm-adaptive: first-last:K batch-size ranges, comma-separated (vLLM's "
                           "num_speculative_tokens_per_batch_size; inclusive, from 1; a gap or batch sizes above "
                           "the last keep the K before; each K at most gamma_max), e.g. 1-8:5,9-32:3; empty: "
                           "gamma_max at every batch size.")


def speculative_tokens_table(text, check: bool = True) -> tuple[tuple[int, int, int], ...]:
    """vLLM's num_speculative_tokens_per_batch_size from its knob ("1-8:5,9-32:3"): (first, last, K)
    batch-size ranges. `check`: refuse what vLLM's validator refuses (vllm/v1/spec_decode/dynamic/
    utils.py `validate_and_normalize_dynamic_sd_schedule`: a bound below 1, first > last, a negative K,
    overlapping ranges, a first range not starting at 1) in one line; unchecked, () for what does not parse."""
    ranges = []
    for entry in (text.split(",") if isinstance(text, str) and text.strip() else []):
        sizes, _, length = entry.partition(":")
        first, _, last = sizes.partition("-")
        try:
            ranges.append((int(first), int(last or first), int(length)))
        except ValueError:
            if not check:
                return ()
            raise DsparkError(f"num_speculative_tokens_per_batch_size entry {entry.strip()!r} is not first-last:K "
                              "(e.g. 1-8:5,9-32:3)") from None
    ranges.sort()
    if not check:
        return tuple(ranges)
    if any(first < 1 or first > last or k < 0 for first, last, k in ranges):
        raise DsparkError(f"num_speculative_tokens_per_batch_size {text!r}: each range needs 1 <= first <= last "
                          "and K at least 0")
    if any(after[0] <= before[1] for before, after in zip(ranges, ranges[1:])) or (ranges and ranges[0][0] != 1):
        raise DsparkError(f"num_speculative_tokens_per_batch_size {text!r}: the ranges must start at 1 and not "
                          "overlap")
    return tuple(ranges)


def table_length(table: tuple[tuple[int, int, int], ...], rows: int, most: int) -> int:
    """vLLM's draft length for a step of `rows` scheduled requests (build_dynamic_sd_schedule_lookup):
    the K of the range holding `rows`, else of the last range below it, at most `most`; no table, `most`."""
    below = [k for first, _, k in table if first <= rows]
    return min(below[-1], most) if below else most


def controller_implied(schedule: Schedule, knobs: dict) -> dict:
    """What a controller's knobs fix: gamma_max, the longest length it may pick (the decoder's caches
    and replay's records are sized by it), and its lengths written as it keeps them."""
    if schedule.name == VLLM_ADAPTIVE:  # gamma_max is vLLM's num_speculative_tokens, the table's cap (as it clamps)
        try:
            ranges = speculative_tokens_table(knobs.get("num_speculative_tokens_per_batch_size", ""))
        except DsparkError:
            return {}  # the knob's own check refuses it
        most = knobs["gamma_max"]  # (from_dict gives every knob)
        capped = [(a, b, min(k, most)) for a, b, k in ranges] if isinstance(most, int) else ranges
        written = "" if all(k == most for _, _, k in capped) else ",".join(f"{a}-{b}:{k}" for a, b, k in capped)
        return {"num_speculative_tokens_per_batch_size": written}  # every batch size at K: no table
    if schedule.name == SGLANG_ADAPTIVE:
        steps = candidate_steps(knobs.get("candidate_steps", ""), check=False)
        written = {"candidate_steps": ",".join(map(str, steps))} if steps else {}  # as SGLang keeps them
        return {"gamma_max": max(max(steps, default=1), 1), **written}
    pairs = draft_len_schedule(knobs.get("draft_len_schedule", ""), check=False)
    written = {"draft_len_schedule": ",".join(f"{size}:{length}" for size, length in pairs)} if pairs else {}
    return {"gamma_max": max(pairs[0][1], 1), **written} if pairs else {}


def controller_label(schedule: Schedule, policy) -> str:
    """A controller's knobs as its policy's label writes them."""
    if schedule.name == VLLM_ADAPTIVE:
        ranges = speculative_tokens_table(policy.num_speculative_tokens_per_batch_size, check=False)
        return f"K={policy.gamma_max}" + "".join(f" {a}-{b}:{min(k, policy.gamma_max)}" for a, b, k in ranges)
    if schedule.name == SGLANG_ADAPTIVE:
        steps = "/".join(str(k) for k in candidate_steps(policy.candidate_steps, check=False))
        return (f"{steps} α{policy.ema_alpha:g} every{policy.update_interval} warm{policy.warmup_batches} "
                f"↑{policy.up_hysteresis:g} ↓{policy.down_hysteresis:g} ceil{policy.ceiling_coeff:g}")
    pairs = draft_len_schedule(policy.draft_len_schedule, check=False)
    lengths = "·".join(f"{size}:{length}" for size, length in pairs) if pairs else f"γ={policy.gamma_max}"
    gate = (f" gate {policy.acceptance_rate_window_size}@{policy.acceptance_rate_threshold:g}"
            if policy.acceptance_rate_window_size > 0 else "")
    return lengths + gate

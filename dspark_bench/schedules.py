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
- whether it is the classic baseline, a fixed draft length (`baseline`), that every policy is
  compared to;
- which serving engines can run it (`engines`), and how a policy of it is labelled.

The rule's arithmetic lives where it runs (decoding/schedule.py on the host and the device,
replay/simulate.py and replay/batched.py in replay), reading these properties; the equality
tests hold those forms equal. A new schedule is one entry in SCHEDULES (docs/architecture.md,
"Where a new piece goes", shows one).
"""

from __future__ import annotations

from dataclasses import dataclass

# The serving engines an exported policy may run in (engines/export.py's formats).
THRESHOLD_ENGINES = ("hf", "llamacpp")  # one threshold on the draft's top-1 probability
FIXED_ENGINES = ("vllm", "sglang", "trtllm")  # a fixed draft length (per batch size)


@dataclass(frozen=True)
class Schedule:
    name: str
    reads: tuple[str, ...] = ()  # the threshold knobs it reads
    cumulative: bool = False  # compares the running product of the confidences
    cost_aware: bool = False  # decides with a goodput model (goodput_model), keeping its last token
    whole_batch: bool = False  # decides for every row of a batch at once
    baseline: bool = False  # a fixed draft length: drafts gamma_max every round
    engines: tuple[str, ...] = ()  # serving engines that can run it exactly (given the rest of the policy)

    def threshold_at(self, policy, position: int) -> float:
        """The confidence a token at this draft position (1-based) must reach to be kept."""
        if self.baseline:
            return 0.0
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
        if self.cost_aware:
            packed = " · packed" if self.whole_batch and policy.budget_layout == "packed" else ""
            return f"{policy.metric} {self.name} γ≤{policy.gamma_max} min{policy.min_draft_len}{packed}"
        knob = (f"{policy.threshold_start:g}→{policy.threshold_end:g}" if "threshold_start" in self.reads
                else f"{policy.threshold:g}")
        return f"{policy.metric} {self.name} {knob} γ≤{policy.gamma_max} min{policy.min_draft_len}"

    @property
    def one_threshold(self) -> bool:
        """It reads the `threshold` knob alone (a policy of it is drawn against that threshold)."""
        return self.reads == ("threshold",)


# The names other modules write policies with (a name read here, never spelt out there).
THRESHOLD, CUMULATIVE, GOODPUT, BUDGET = "threshold", "cumulative", "goodput", "budget"
SCHEDULES = {s.name: s for s in (
    Schedule(THRESHOLD, reads=("threshold",), engines=THRESHOLD_ENGINES),
    Schedule("ramp", reads=("threshold_start", "threshold_end")),
    Schedule(CUMULATIVE, reads=("threshold",), cumulative=True),
    Schedule("fixed", baseline=True, engines=(*THRESHOLD_ENGINES, *FIXED_ENGINES)),
    Schedule(GOODPUT, cost_aware=True),
    Schedule(BUDGET, cost_aware=True, whole_batch=True),
)}
BASELINE = next(name for name, s in SCHEDULES.items() if s.baseline)  # "fixed": what every policy is compared to


def of(policy) -> Schedule:
    """The schedule of a stopping policy (config.StoppingPolicy) or of a DecodeConfig."""
    return named(getattr(policy, "stopping", policy).schedule)


def named(name: str) -> Schedule:
    """The schedule called `name`; an unknown name is a schedule with no properties, for the
    config's own check to refuse in one line (config.check_declared)."""
    return SCHEDULES.get(name) or Schedule(name)


def where(table, **properties):
    """A boolean mask of a table's rows (a DataFrame with a "schedule" column) whose schedules have
    `properties`, e.g. where(table, baseline=True)."""
    chosen = set(names(**properties))
    return table["schedule"].isin(chosen)


def names(**properties) -> tuple[str, ...]:
    """The schedules with `properties`, e.g. names(cost_aware=True)."""
    return tuple(name for name, s in SCHEDULES.items() if all(getattr(s, k) == v for k, v in properties.items()))

"""The engines' own draft-length controllers: each picks the next round's draft length from what
earlier rounds accepted, keeping its state across rounds and requests as its serving engine keeps it
(schedules with `controlled`; docs/engine-controllers.md).

A controller is asked `steps(rows)` before a round (the draft length every row of a step of `rows`
rows drafts; 0: a plain step, nothing drafted) and told `observe(accepted, drafted)` after it, with
each row's accepted and drafted tokens. The decoders (speculative.py, batched.py) and every replay walk hold
one controller per policy for a whole run, so that its state runs on from one request to the next
as in a server; each round then runs `round_policy`, a fixed draft length (every token kept).

Pure Python: replay runs the same objects on its records.
"""

from __future__ import annotations

import bisect
import functools
import math

from dspark_bench import schedules
from dspark_bench.config import KNOBS, DecodeConfig


class AdaptiveSteps:
    """SGLang's adaptive step slot, as sglang 0.5.23 runs it (sglang/srt/speculative/
    adaptive_spec_params.py, `AdaptiveStepSlot`, read at the 0.5.23 release): an EMA of the mean
    accepted drafts per request; after `warmup_batches` steps, every `update_interval` steps, the
    length moves down the sorted candidates while the EMA is at or below the next lower one's
    k' - 0.5 (0.5 for a 0 candidate) + down_hysteresis, else up while it is above k - 0.5 +
    up_hysteresis; `ceiling_coeff` > 0 caps a length kept or lowered at ceil(EMA × coeff). At 0
    (no drafting) the EMA stands still and the next decision probes the next candidate up.

    A policy is one slot, for every batch size it serves (an export writes one slot per batch size
    swept: engines/files.py). It starts at the middle candidate: what SGLang sets
    --speculative-num-steps to under --speculative-adaptive when it is not given
    (_init_adaptive_speculative_params)."""

    def __init__(self, policy):
        self.candidates = schedules.candidate_steps(policy.candidate_steps)
        self.alpha, self.interval = policy.ema_alpha, policy.update_interval
        self.warmup, self.ceiling_coeff = policy.warmup_batches, policy.ceiling_coeff
        self.up, self.down = policy.up_hysteresis, policy.down_hysteresis
        self.current = self.candidates[len(self.candidates) // 2]
        self.ema = float(self.current - 1)  # SGLang's neutral start: one below the current length
        self.batches = 0

    # SGLang 0.5.23's DEFAULT_ADAPTIVE_CONFIG: a slot per batch size (a step's rows served by the largest
    # at or below them); every other knob at its declared default (ema 0.2, every 5 steps after 10).
    SHIPPED = {1: {"candidate_steps": "1,3,5,7", "down_hysteresis": -0.25}, 8: {"candidate_steps": "0,1,3"},
               32: {"candidate_steps": "0,1"}, 64: {"candidate_steps": "0"}}

    @classmethod
    def shipped(cls, batch_size: int) -> dict:
        """The knobs of the slot SGLang's default config serves `batch_size` rows with (_find_closest_bs)."""
        slot = max([size for size in cls.SHIPPED if size <= batch_size], default=min(cls.SHIPPED))
        return {name: KNOBS[name].default for name in schedules.named(schedules.SGLANG_ADAPTIVE).reads} | {
            "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0.0, **cls.SHIPPED[slot]}

    @staticmethod
    def lengths(policy) -> tuple[int, ...]:
        """Every length it may pick."""
        return schedules.candidate_steps(policy.candidate_steps)

    def steps(self, rows: int = 1) -> int:
        return self.current

    def observe(self, accepted: list[int], drafted: list[int]) -> None:
        """A verified step's accepted draft tokens per row (SGLang's num_correct_drafts_per_req)."""
        if not accepted:
            return
        if self.current > 0:
            self.ema = (1 - self.alpha) * self.ema + self.alpha * (sum(accepted) / len(accepted))
        self.batches += 1
        if self.batches > self.warmup and (self.batches - self.warmup) % self.interval == 0:
            self.current = self.decide()

    def decide(self) -> int:
        at = self.candidates.index(self.current)
        if self.current == 0:  # probe the next length up after a step without drafting
            target = self.candidates[min(at + 1, len(self.candidates) - 1)]
            if target > 0 and self.ema < 0:  # never drafted: start from that length's neutral EMA
                self.ema = float(target - 1)
            return target
        start = at
        while at > 0 and self.ema <= (0.5 if self.candidates[at - 1] == 0
                                      else self.candidates[at - 1] - 0.5) + self.down:
            at -= 1
        if at == start:
            while at < len(self.candidates) - 1 and self.ema > self.candidates[at] - 0.5 + self.up:
                at += 1
        if self.ceiling_coeff > 0 and self.candidates[at] <= self.current:  # caps a length kept or lowered
            ceiling = max(1, math.ceil(self.ema * self.ceiling_coeff))
            while at > 0 and self.candidates[at] > ceiling:
                at -= 1
        return self.candidates[at]


class ScheduleAndGate:
    """TensorRT-LLM's draft_len_schedule and acceptance-rate gate, as its PyTorch executor runs them
    (tensorrt_llm/_torch/speculative/utils.py `get_draft_len_for_batch_size`, the one-model path;
    tensorrt_llm/_torch/pyexecutor/py_executor.py `_update_batch_acceptance_rate` and
    speculation_gate.py `SpeculationGate`; docs/engine-controllers.md cites the commit).

    The schedule gives each step the length of the smallest batch-size key at or above its rows (0
    above the largest key: no drafting); no schedule, gamma_max. The gate keeps the ratio Σ accepted /
    Σ drafted of each step that drafted, and once it holds `window` of them, whenever their mean falls
    strictly below `threshold`, switches drafting off for good (every later step plain)."""

    def __init__(self, policy):
        self.schedule = schedules.draft_len_schedule(policy.draft_len_schedule)
        self.most = policy.gamma_max
        self.window, self.threshold = policy.acceptance_rate_window_size, policy.acceptance_rate_threshold
        self.rates: list[float] = []
        self.total, self.off = 0.0, False  # a running sum, as the gate keeps it (bit for bit at the threshold)
        self.recorded = 0

    @staticmethod
    def shipped(batch_size: int) -> dict:
        """As it ships: no schedule and no gate (max_draft_len every step: a fixed length)."""
        return {"draft_len_schedule": "", "acceptance_rate_window_size": 0, "acceptance_rate_threshold": 0.0}

    @staticmethod
    def lengths(policy) -> tuple[int, ...]:
        """Every length it may pick: the schedule's, 0 (above its last batch size, or gated off), else gamma_max."""
        pairs = schedules.draft_len_schedule(policy.draft_len_schedule)
        return tuple(sorted({0, *(length for _, length in pairs)} if pairs else {0, policy.gamma_max}))

    def steps(self, rows: int = 1) -> int:
        if self.off:
            return 0
        return schedule_length(self.schedule, rows) if self.schedule else self.most

    def observe(self, accepted: list[int], drafted: list[int]) -> None:
        if self.off or self.window <= 0 or sum(drafted) <= 0:  # a step that drafted nothing is no sample
            return
        rate = sum(a for a, d in zip(accepted, drafted) if d > 0) / sum(drafted)
        self.rates.append(rate)
        self.total += rate
        if len(self.rates) > self.window:
            self.total -= self.rates.pop(0)
        self.recorded += 1
        if self.recorded >= self.window and self.total / len(self.rates) < self.threshold:
            self.off = True


def schedule_length(schedule: tuple[tuple[int, int], ...], rows: int) -> int:
    """TensorRT-LLM's length for a step of `rows` rows from its (batch size, length) pairs, ascending:
    the smallest batch size at or above `rows` (bisect_left), 0 above the largest."""
    at = bisect.bisect_left([size for size, _ in schedule], rows)
    return schedule[at][1] if at < len(schedule) else 0


CONTROLLERS = {schedules.SGLANG_ADAPTIVE: AdaptiveSteps, schedules.TRTLLM_SCHEDULE: ScheduleAndGate}


def lengths(config: DecodeConfig) -> tuple[int, ...]:
    """Every draft length `config`'s controller may pick, ascending."""
    return CONTROLLERS[config.stopping.schedule].lengths(config.stopping)


def shipped(config: DecodeConfig) -> DecodeConfig:
    """`config`'s controller at its engine's defaults, at `config`'s batch size (its other knobs kept)."""
    return config.replace(**CONTROLLERS[config.stopping.schedule].shipped(config.batching.batch_size))


def start(config: DecodeConfig):
    """A fresh controller for `config`'s schedule (its state at an engine's start), None for a
    schedule without one."""
    controller = CONTROLLERS.get(config.stopping.schedule)
    return controller(config.stopping) if controller else None


@functools.lru_cache(maxsize=256)
def round_policy(config: DecodeConfig, steps: int) -> DecodeConfig:
    """The policy of a round the controller gave `steps`: a fixed draft length, every token kept
    (a 0-step round runs γ=1 with no room to draft: `round_budget`)."""
    return config.replace(schedule=schedules.BASELINE, gamma_max=max(steps, 1),
                          **{name: KNOBS[name].default for name in schedules.controller_knobs()})


def round_budget(steps: int, budget: int) -> int:
    """What a controlled round may draft: its steps, within the request's remaining budget."""
    return min(steps, budget)


"""The engines' own draft-length controllers: each picks the next round's draft length from what
earlier rounds accepted, keeping its state across rounds and requests as its serving engine keeps it
(schedules with `controlled`; docs/engine-controllers.md).

A controller is asked `steps(rows)` before a round (the draft length every row of a step of `rows`
rows drafts; 0: a plain step, nothing drafted), then `admit(keys, confidences)` once the rows have
drafted (how many of each row's tokens the target verifies: all, but under vLLM's adaptive
verification, which trims them), and told `observe(accepted, drafted)` after the pass, with each
row's accepted and verified tokens. The decoders (speculative.py, batched.py) and every replay walk hold
one controller per policy for a whole run, so that its state runs on from one request to the next
as in a server; each round then runs `round_policy`, a fixed draft length (every token kept).

Pure Python: replay runs the same objects on its records.
"""

from __future__ import annotations

import bisect
import functools
import math

import numpy as np

from dspark_bench import schedules
from dspark_bench.config import KNOBS, DecodeConfig
from dspark_bench.decoding import budget, goodput
from dspark_bench.errors import DsparkError


class Controller:
    """What every controller answers beside `steps` and `observe`."""

    def admit(self, keys: list, confidences: list[list[float]]) -> list[int]:
        """How many of each row's drafted tokens (`confidences`: its signal per token; `keys`: its request)
        the target verifies: every one."""
        return [len(row) for row in confidences]


class AdaptiveSteps(Controller):
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

    def __init__(self, config: DecodeConfig):
        policy = config.stopping
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


class ScheduleAndGate(Controller):
    """TensorRT-LLM's draft_len_schedule and acceptance-rate gate, as its PyTorch executor runs them
    (tensorrt_llm/_torch/speculative/utils.py `get_draft_len_for_batch_size`, the one-model path;
    tensorrt_llm/_torch/pyexecutor/py_executor.py `_update_batch_acceptance_rate` and
    speculation_gate.py `SpeculationGate`; docs/engine-controllers.md cites the commit).

    The schedule gives each step the length of the smallest batch-size key at or above its rows (0
    above the largest key: no drafting); no schedule, gamma_max. The gate keeps the ratio Σ accepted /
    Σ drafted of each step that drafted, and once it holds `window` of them, whenever their mean falls
    strictly below `threshold`, switches drafting off for good (every later step plain)."""

    def __init__(self, config: DecodeConfig):
        policy = config.stopping
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


class AdaptiveVerification(Controller):
    """vLLM's adaptive verification, as vLLM 0.34.0 runs it (commit 62d4bc3c7; vllm/v1/worker/gpu/
    spec_decode/adaptive_verification.py `AdaptiveVerificationManager.get_num_tokens` and its
    `_assign_draft_token_budget_kernel`, acceptance_estimator.py `OnlineAcceptanceEstimator`), with
    vllm/v1/spec_decode/dynamic/utils.py's num_speculative_tokens_per_batch_size lookup for K.

    Every row drafts K (gamma_max, or the table's K for the step's rows). The step's budget B is the
    b that maximises (rows + the b highest survival products) / (draft + verify of rows + b tokens),
    the products from each row's predicted acceptance of its previous round's drafts (one round
    stale, as vLLM's host reads them; 1 for a request's first round); B is then spent on the highest
    products of the drafts just made, ties to the earlier row, each row a prefix of its draft.
    Predicted acceptance: sigmoid(slope × logit(top-1) + intercept_k), one slope and an intercept per
    position for the whole run, refitted by a damped Newton step every 100 steps on the verified
    positions. What differs from vLLM (docs/engine-controllers.md): the step costs are the goodput
    model's (a packed pass), not a profile taken at start-up; the feature is read from the top-1
    probability, not the logits."""

    def __init__(self, config: DecodeConfig):
        policy = config.stopping
        if not policy.goodput_model:
            raise DsparkError(f"{policy.schedule} budgets each step with measured step costs: pass --goodput-model "
                              "with a replay sweep's folder (a replay sweep gives it its own)")
        self.most = policy.gamma_max  # vLLM's num_speculative_tokens
        self.table = schedules.speculative_tokens_table(policy.num_speculative_tokens_per_batch_size)
        self.costs = policy.goodput_model
        step_costs(self.costs, config.batching.batch_size)  # readable, and timed up to its batch size: now
        self.estimator = AcceptanceEstimator(self.most)
        self.stale: dict = {}  # request -> its last drafts' predicted acceptance: what the budget reads
        self.graded: list = []  # this step's rows: (features, predictions, admitted)
        self.drafting = self.most

    @staticmethod
    def shipped(batch_size: int) -> dict:
        """As --speculative-config '{"enable_adaptive_verification": true}' runs it: no table, K every step."""
        return {"num_speculative_tokens_per_batch_size": ""}

    @staticmethod
    def lengths(policy) -> tuple[int, ...]:
        """Every length it drafts: the table's (each at most gamma_max), else gamma_max."""
        table = schedules.speculative_tokens_table(policy.num_speculative_tokens_per_batch_size, check=False)
        return tuple(sorted({min(k, policy.gamma_max) for _, _, k in table} or {policy.gamma_max}))

    def steps(self, rows: int = 1) -> int:
        self.drafting = schedules.table_length(self.table, rows, self.most)
        return self.drafting

    def admit(self, keys: list, confidences: list[list[float]]) -> list[int]:
        drafted = [len(row) for row in confidences]
        features = [[log_odds(c) for c in row] for row in confidences]
        live = [self.estimator.predict(row) for row in features]
        stale = [self.stale.get(key, np.ones(0, np.float32)) for key in keys]
        rows = len(keys)
        t_draft, t_verify = step_costs(self.costs, rows)  # (a server may hold more rows than its policy's B)
        verify = [float(budget.packed_verify(t_verify[rows], rows + b, rows)) for b in range(sum(drafted) + 1)]
        chosen = draft_budget(stale, drafted, self.drafting * t_draft[rows], verify, rows)
        admitted = admit_slots(live, drafted, chosen)
        self.stale = dict(zip(keys, live))
        self.graded = list(zip(features, live, admitted))
        return admitted

    def observe(self, accepted: list[int], drafted: list[int]) -> None:
        for (features, predictions, admitted), a in zip(self.graded, accepted):
            self.estimator.grade(features, predictions, a, admitted)
        self.graded = []
        self.estimator.step()


@functools.lru_cache(maxsize=32)
def step_costs(goodput_model: str, batch_size: int):
    """(t_draft[b], t_verify[b, k]): a goodput model's step costs up to `batch_size` rows (budget.cost_tables)."""
    return budget.cost_tables(goodput.load(goodput_model).costs, batch_size)


def draft_budget(stale: list, drafted: list[int], draft_cost: float, verify: list[float], sampling: int) -> int:
    """vLLM's budget (get_num_tokens): the b maximising (the `sampling` rows' tokens + the b highest
    survival products of the rows' stale predictions, each row's first `drafted` positions, a missing
    position 1) / (draft_cost + verify[b]: the step's pass with b drafts); the first b on ties (np.argmax)."""
    scores = []
    for row, length in zip(stale, drafted):
        padded = np.ones(length, np.float64)
        padded[: min(length, len(row))] = np.asarray(row[:length], np.float64)
        scores.extend(np.cumprod(padded).tolist())
    scores = np.sort(np.asarray(scores, np.float64))[::-1][: len(verify) - 1]  # as many as verify prices
    expected = sampling + np.concatenate(([0.0], np.cumsum(scores)))
    return int(np.argmax(expected / (draft_cost + np.asarray(verify[: len(expected)]))))


def admit_slots(live: list, drafted: list[int], chosen: int) -> list[int]:
    """vLLM's admission (_assign_draft_token_budget_kernel): the `chosen` (row, position) slots of the
    highest float32 survival products of the live predictions, ties to the earlier row; per row, how many."""
    if chosen >= sum(drafted):
        return list(drafted)
    slots = []
    for r, (row, length) in enumerate(zip(live, drafted)):
        survival = np.cumprod(np.asarray(row[:length], np.float32), dtype=np.float32)
        slots += [(-float(s), r, k) for k, s in enumerate(survival)]
    admitted = [0] * len(drafted)
    for _, r, _ in sorted(slots)[:chosen]:
        admitted[r] += 1
    return admitted


MAX_LOG_ODDS = 40.0  # vLLM clamps its feature here (acceptance_estimator.py)


def log_odds(confidence: float) -> float:
    """vLLM's feature, the log-odds of the draft's top-1 probability, clamped to ±40."""
    if not 0.0 < confidence < 1.0:
        return MAX_LOG_ODDS if confidence >= 1.0 else -MAX_LOG_ODDS
    return min(max(math.log(confidence) - math.log1p(-confidence), -MAX_LOG_ODDS), MAX_LOG_ODDS)


class AcceptanceEstimator:
    """vLLM's OnlineAcceptanceEstimator: p_k = sigmoid(slope × feature + intercept_k), from slope 0.5 and
    intercepts -0.2; each step adds the verified positions' Newton (IRLS) statistics (a position is
    seen when it was accepted or was the first rejected), and every 100 steps one ridge-regularised
    Newton step, damped by n / (n + 50), refits them (_accumulate_kernel, _refit_kernel)."""

    REFIT_INTERVAL, DAMPING, L2 = 100, 50.0, 1e-3

    def __init__(self, positions: int):
        self.slope, self.intercepts = 0.5, [-0.2] * positions
        self.since_refit = 0
        self.stats = np.zeros((6, positions))  # per position: Σ w f², Σ w f, Σ w, Σ r f, Σ r, n

    def predict(self, features: list[float]) -> np.ndarray:
        z = np.array([self.slope * f + self.intercepts[k] for k, f in enumerate(features)], np.float64)
        return (1.0 / (1.0 + np.exp(-z))).astype(np.float32)

    def grade(self, features: list[float], predictions, accepted: int, admitted: int) -> None:
        for k in range(min(accepted + 1, admitted)):
            f, p, y = features[k], float(predictions[k]), float(k < accepted)
            w, r = p * (1.0 - p), y - p
            self.stats[:, k] += (w * f * f, w * f, w, r * f, r, 1.0)

    def step(self) -> None:
        self.since_refit += 1
        if self.since_refit >= self.REFIT_INTERVAL:
            self.since_refit = 0
            self.refit()

    def refit(self) -> None:
        a, b, c, g0, g1, n = self.stats
        c = c + self.L2
        slope_step = (g0.sum() - (b * g1 / c).sum()) / (a.sum() + self.L2 - (b * b / c).sum())
        slope_step *= n.sum() / (n.sum() + self.DAMPING)
        if math.isnan(slope_step) or self.slope + slope_step < 0.0:
            slope_step = 0.0
        self.slope += slope_step
        steps = np.nan_to_num((g1 - b * slope_step) / c * n / (n + self.DAMPING), nan=0.0)
        self.intercepts = [i + float(d) for i, d in zip(self.intercepts, steps)]
        self.stats[:] = 0.0


CONTROLLERS = {schedules.SGLANG_ADAPTIVE: AdaptiveSteps, schedules.TRTLLM_SCHEDULE: ScheduleAndGate,
               schedules.VLLM_ADAPTIVE: AdaptiveVerification}


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
    return controller(config) if controller else None


@functools.lru_cache(maxsize=256)
def round_policy(config: DecodeConfig, steps: int) -> DecodeConfig:
    """The policy of a round the controller gave `steps`: a fixed draft length, every token kept
    (a 0-step round runs γ=1 with no room to draft: `round_budget`)."""
    return config.replace(schedule=schedules.BASELINE, gamma_max=max(steps, 1), goodput_model="",
                          **{name: KNOBS[name].default for name in schedules.controller_knobs()})


def round_budget(steps: int, budget: int) -> int:
    """What a controlled round may draft: its steps, within the request's remaining budget."""
    return min(steps, budget)


"""Prices timed inside running decodes: what a sweep, a calibration and a load run price with by
default (docs/batch-sizes.md#in-decode-prices; `--isolated-prices` keeps the passes timed alone).

A pass timed alone between syncs misses what a decode adds around it: at batch 1 the host's work
between draft passes and each round's sampling, acceptance and cache edits; in a live batch the
per-row host work, the upkeep of caches with holes and rows joining and leaving (a saturated
batch's step cost 1.14-1.26x an isolated pass of its shape: docs/data/load-2026-12-05). So, after
the isolated passes are timed, two short runs on the user's own prompts:

- batch 1: plain decoding and two policies, each pass timed where it runs (measure/in_decode.py):
  the batch-1 cost model with a round's and a draft step's work past their passes;
- B > 1 (a batched sweep, or one under load): a server filling up to the largest batch and
  draining (`ramp`), plain decoding and two policies, with the cost surface timed
  beside it, one pass per step (measure/between_steps.py); what each traced step and admission
  took past what that surface charges is fitted as the surface's step terms (replay/cost.StepTerms).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pandas as pd

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.errors import DsparkError
from dspark_bench.harness.under_load import run_under_load, step_costs
from dspark_bench.measure.between_steps import CostBetweenSteps
from dspark_bench.measure.in_decode import measure_in_decode
from dspark_bench.replay.arrivals import Arrivals
from dspark_bench.replay.cost import CostModel, CostSurface, StepTerms

CAP_TOKENS = 64  # the calibration runs decode at most this many tokens a request (their prices do not need more)
BESIDE_REPEATS = 7  # timings of each cell of the surface beside the live batch, as measure_surface takes


def calibration_policies(base: DecodeConfig, gamma: int) -> list[DecodeConfig]:
    """The two policies the runs decode beside plain decoding: a fixed γ and a threshold policy,
    so that both kinds of round and most draft lengths are seen (at the base's sampling)."""
    shared = {"temperature": base.verification.temperature, "top_p": base.verification.top_p,
              "seed": base.verification.seed, "max_new_tokens": min(base.verification.max_new_tokens, CAP_TOKENS)}
    return [DecodeConfig.of(schedule=schedules.BASELINE, gamma_max=min(4, gamma), **shared),
            DecodeConfig.of(threshold=0.45, gamma_max=min(6, gamma), min_draft_len=1, **shared)]  # the default metric


def batch_one(pair, ids: list[list[int]], policies: list[DecodeConfig], isolated: CostModel,
              eos_ids: frozenset[int], compiled: bool = False) -> tuple[CostModel, dict]:
    """The batch-1 cost model timed inside decodes of the first two prompts, on the passes the
    sweep's decodes run (`compiled`: captured); its depth prices kept from the isolated passes
    (the calibration runs at one depth)."""
    policies = [c.replace(compiled=True) for c in policies] if compiled else policies
    model, detail = measure_in_decode(pair, ids[:2], policies, isolated, eos_ids)
    return dataclasses.replace(model, by_depth=isolated.by_depth), detail


def ramp(requests: int, max_batch: int, tokens: int, step: float) -> Arrivals:
    """Requests arriving one every `tokens * step / max_batch` seconds: as many as a batch of
    `max_batch` rows taking `step` a step serves, so the batch fills one row at a time, stays about
    full, and drains at the end (every row count is seen, which the per-row term is fitted on;
    requests all arriving at once would leave the batch at one width, every row finishing together)."""
    gap = tokens * step / max_batch
    return Arrivals(np.arange(requests) * gap, f"{requests} requests, one every {gap * 1e3:.0f} ms", 1 / gap)


def fit_line(rows: np.ndarray, extra: np.ndarray) -> tuple[float, float]:
    """(intercept, slope) of the seconds past the passes against the live rows: least squares over
    the steps (their mean is what a request's time per token sums), flat where one row count was seen."""
    if len(extra) == 0:
        return 0.0, 0.0
    if len(np.unique(rows)) < 2:
        return float(extra.mean()), 0.0
    slope, intercept = np.polyfit(rows.astype(np.float64), extra, 1)
    return float(intercept), float(slope)


def fit_terms(steps: pd.DataFrame, beside: CostSurface, fitted_on: dict) -> StepTerms:
    """The step terms of a traced run (run_under_load's `steps`) against the surface timed beside it."""
    extra = steps["seconds"].to_numpy() - step_costs(steps, beside)
    rows = steps["rows"].to_numpy()
    step, plain, join = (steps["kind"] == "step").to_numpy(), (steps["config_id"] < 0).to_numpy(), \
        (steps["kind"] == "join").to_numpy()
    upkeep, per_row = fit_line(rows[step & ~plain], extra[step & ~plain])
    plain_upkeep, plain_per_row = fit_line(rows[step & plain], extra[step & plain])
    return StepTerms(upkeep, per_row, plain_upkeep, plain_per_row, float(extra[join].mean()) if join.any() else 0.0,
                     {**fitted_on, "steps": int(step.sum()), "joins": int(join.sum())})


def live_batch(pair, ids: list[list[int]], contexts: list[list[int]], context: list[int], policies: list[DecodeConfig],
               batch_sizes, gamma: int, eos_ids: frozenset[int], step: float) -> tuple[CostSurface, pd.DataFrame]:
    """A server of `2 * the largest batch` requests (the prompts in turn) at the largest batch,
    arriving as a ramp to a full batch (`ramp`, at a plain step of `step` seconds), plain decoding
    and `policies` taking turns a step each, with the surface timed beside them (rows: `contexts`,
    halfway through their outputs); the surface with its fitted terms, and the run's traced steps."""
    largest = max(batch_sizes)
    sampler = CostBetweenSteps(pair, context, gamma, batch_sizes, contexts)
    arrivals = ramp(2 * largest, largest, policies[0].verification.max_new_tokens, step)
    _, _, steps = run_under_load(pair, ids, policies, arrivals, largest, eos_ids, sampler=sampler)
    sampler.complete(BESIDE_REPEATS + 1)
    beside = sampler.surface()
    labels = [c.policy_label() for c in policies]
    terms = fit_terms(steps, beside, {"requests": 2 * largest, "max_batch": largest, "policies": labels,
                                      "max_new_tokens": policies[0].verification.max_new_tokens})
    return dataclasses.replace(beside, terms=terms), steps


@dataclasses.dataclass
class InDecode:
    """The in-decode prices: the batch-1 cost model and the surface over B (None where the sweep
    has no B > 1), what each was fitted on, and how long the runs took."""

    cost: CostModel
    surface: CostSurface | None
    detail: dict
    seconds: float

    def described(self) -> dict:
        """summary.json's account of the prices: where they were timed, and the fitted terms."""
        terms = self.surface.terms.to_dict() if self.surface is not None and self.surface.terms else None
        return {"passes": "in decode", "batch_one": self.detail, "step_terms": terms, "seconds": self.seconds}


def price_in_decode(pair, ids: list[list[int]], contexts: list[list[int]], context: list[int], base: DecodeConfig,
                    isolated: CostSurface, gamma: int, batch_sizes, eos_ids: frozenset[int], compiled: bool = False,
                    say=None) -> InDecode:
    """Both runs (the module's docstring): the batch-1 model from `isolated`'s, and, where any batch
    size is above 1, the surface timed beside a live batch with its step terms (a server runs
    its passes eagerly: harness/under_load.py)."""
    if not ids:
        raise DsparkError("prices in decode need at least one prompt")
    started = time.perf_counter()
    policies = calibration_policies(base, gamma)
    if say:
        say(f"timing prices inside decodes: plain decoding, {' and '.join(c.policy_label() for c in policies)}"
            + (f"; then a batch of up to {max(batch_sizes)} rows serving {2 * max(batch_sizes)} requests"
               if max(batch_sizes) > 1 else ""))
    cost, detail = batch_one(pair, ids, policies, isolated.at(1), eos_ids, compiled)
    surface = None
    if max(batch_sizes) > 1:
        surface, _ = live_batch(pair, ids, contexts, context, policies, batch_sizes, gamma, eos_ids,
                                isolated.at(1).t_verify[0])
    return InDecode(cost, surface, detail, time.perf_counter() - started)


def one_surface(pair, ids: list[list[int]], contexts: list[list[int]], context: list[int], base: DecodeConfig,
                isolated: CostSurface, gamma: int, batch_sizes, eos_ids: frozenset[int],
                compiled: bool = False) -> CostSurface:
    """The prices as one surface, for a caller that reads batch 1 from it too (a calibration): the
    live batch's with its terms where a batch size is above 1, else `isolated` with its batch-1
    model the one timed inside decodes."""
    timed = price_in_decode(pair, ids, contexts, context, base, isolated, gamma, batch_sizes, eos_ids, compiled)
    return timed.surface or CostSurface({**isolated.models, 1: timed.cost})


def plan_seconds(per_token: float, tokens: int, largest_batch: int) -> float:
    """About how long price_in_decode takes: an untimed and 2 timed decodes of 2 prompts by 3 sides
    at batch 1, and 3 servers of 2 * B requests at B (a step of B rows costing about B / 2 single ones)."""
    tokens = min(tokens, CAP_TOKENS)
    batched = 3 * 2 * largest_batch * tokens / max(1.0, largest_batch / 2) if largest_batch > 1 else 0.0
    return per_token * (3 * 2 * 3 * tokens + batched)

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
  draining (`ramp`), plain decoding and two policies taking turns a step each, run twice (the
  first warms it up); what each traced step and admission of the second took past what the
  isolated surface charges is fitted as the surface's step terms (replay/cost.StepTerms).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pandas as pd

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.errors import DsparkError
from dspark_bench.harness.under_load import join_positions, run_under_load, step_costs
from dspark_bench.measure.in_decode import measure_in_decode
from dspark_bench.replay.arrivals import Arrivals
from dspark_bench.replay.cost import CostModel, CostSurface, StepTerms

CAP_TOKENS = 64  # the calibration runs decode at most this many tokens a request (their prices do not need more)


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
    (the calibration runs at one depth), whose draft step, like the decodes' own, is a later step's
    (measure/cost_model.chain_line): the first's excess stays once a round (t_first_draft)."""
    policies = [c.replace(compiled=True) for c in policies] if compiled else policies
    model, detail = measure_in_decode(pair, ids[:2], policies, isolated, eos_ids)
    return dataclasses.replace(model, by_depth=isolated.by_depth), detail


def ramp(requests: int, max_batch: int, steps: float, cycle: float) -> Arrivals:
    """Requests arriving one every `steps * cycle / max_batch` seconds: as many as a batch of
    `max_batch` rows frees when a request takes `steps` steps of `cycle` seconds, so the batch fills
    one row at a time, stays about full, and drains at the end (every row count is seen, which the
    terms are fitted over; requests all arriving at once would leave the batch at one width,
    every row finishing together)."""
    gap = steps * cycle / max_batch
    return Arrivals(np.arange(requests) * gap, f"{requests} requests, one every {gap * 1e3:.0f} ms", 1 / gap)


def turn_seconds(surface: CostSurface, policies: list[DecodeConfig]) -> float:
    """About how long the servers' turn takes at the full batch (surface's largest B): a plain step
    and each policy's longest step (gamma_max draft passes and its verify pass). A server steps
    once a turn, so its rows free at the turn's pace, not at one pass's."""
    full = surface.at(max(surface.models))
    return full.t_verify[0] + sum(c.stopping.gamma_max * full.t_draft + full.t_verify[c.stopping.gamma_max]
                                  for c in policies)


def line_over_rows(rows: np.ndarray, extra: np.ndarray, widest: int) -> tuple[list[float], dict]:
    """The seconds past the passes of a step at each row count 0 .. widest, on a line over the row
    count (the per-row host work and the batch's upkeep grow with its rows), and the steps seen at
    each count. The line is fitted by least squares through each count's median, weighted by its
    steps: a count seen a few times at a wide batch (a ramp passes through it once) and a step
    slowed by something else then move it little, where one mean per count took their noise whole
    (one B = 32 sweep's terms ran -41 to +94 ms over the counts). A single count seen: its median,
    flat."""
    counts = {int(r): int((rows == r).sum()) for r in np.unique(rows)}
    if not counts:
        return [0.0] * (widest + 1), {}
    at = np.array(sorted(counts), dtype=np.float64)
    medians = np.array([np.median(extra[rows == r]) for r in sorted(counts)])
    weights = np.array([counts[r] for r in sorted(counts)], dtype=np.float64)
    slope = 0.0
    if len(at) > 1:
        centre = np.average(at, weights=weights)
        slope = float(np.sum(weights * (at - centre) * medians) / np.sum(weights * (at - centre) ** 2))
    intercept = float(np.average(medians, weights=weights) - slope * np.average(at, weights=weights))
    return [intercept + slope * r for r in range(widest + 1)], counts


def per_draft_pass(rows: np.ndarray, forwards: np.ndarray, extra: np.ndarray) -> float:
    """What each draft pass of a speculative step costs past the surface's draft pass. A draft pass
    timed alone follows a target pass and reads the draft's weights back into cache; in a step all
    but the first follow a draft pass, so a step of many draft passes costs less past the surface
    than one of few. Each step's `extra` less its row count's median, then the median of that at
    each count of draft passes, and the slope of those over the count, weighted by their steps (as
    line_over_rows fits its line: a few slow steps move it little); 0 where every step drafted as
    many passes (nothing to tell them apart)."""
    table = pd.DataFrame({"rows": rows, "forwards": forwards, "extra": extra})
    if table["forwards"].nunique() < 2:
        return 0.0
    table["left"] = table["extra"] - table.groupby("rows")["extra"].transform("median")
    by_length = table.groupby("forwards")["left"].agg(["median", "size"]).reset_index()
    at, weights = by_length["forwards"].to_numpy(np.float64), by_length["size"].to_numpy(np.float64)
    centre = np.average(at, weights=weights)
    return float(np.sum(weights * (at - centre) * by_length["median"]) / np.sum(weights * (at - centre) ** 2))


def join_line(positions: np.ndarray, extra: np.ndarray) -> tuple[float, float]:
    """(seconds a join adds past its prefill, seconds per position of the batch's caches it is spliced
    into): least squares over the admissions, the intercept then their median past the slope (a few
    slow joins move it little). Where the joins were all spliced alike, or the slope comes out below
    0, none: their median alone, as before the splice was priced."""
    if len(extra) == 0:
        return 0.0, 0.0
    if np.ptp(positions) > 0:
        slope = float(np.polyfit(positions, extra, 1)[0])
        if slope > 0:
            return float(np.median(extra - slope * positions)), slope
    return float(np.median(extra)), 0.0


def fit_terms(steps: pd.DataFrame, isolated: CostSurface, fitted_on: dict) -> StepTerms:
    """The step terms of a traced run (run_under_load's `steps`) against the surface it is priced on:
    a speculative step's draft passes' term first (`per_draft_pass`), then its line over rows on what
    is left; a join's on a line over the positions it was spliced into (`join_line`)."""
    extra = steps["seconds"].to_numpy() - step_costs(steps, isolated)
    rows, widest = steps["rows"].to_numpy(), int(steps["rows"].max())
    step, plain, join = (steps["kind"] == "step").to_numpy(), (steps["config_id"] < 0).to_numpy(), \
        (steps["kind"] == "join").to_numpy()
    spec = step & ~plain
    forwards = steps["forwards"].fillna(0).to_numpy(dtype=np.float64)  # a join has none
    draft = per_draft_pass(rows[spec], forwards[spec], extra[spec])
    speculative, seen = line_over_rows(rows[spec], extra[spec] - draft * forwards[spec], widest)
    plain_rows, plain_seen = line_over_rows(rows[step & plain], extra[step & plain], widest)
    joined, per_position = join_line(join_positions(steps)[join], extra[join])
    return StepTerms(speculative, plain_rows, joined,
                     {**fitted_on, "steps": int(step.sum()), "joins": int(join.sum()),
                      "steps_by_rows": {"speculative": seen, "plain": plain_seen}}, draft, per_position)


def live_batch(pair, ids: list[list[int]], policies: list[DecodeConfig], isolated: CostSurface,
               eos_ids: frozenset[int]) -> tuple[CostSurface, pd.DataFrame]:
    """A server of `2 * B` requests (the prompts in turn) at `isolated`'s largest batch B, arriving
    as a ramp to a full batch (`ramp`), plain decoding and `policies` taking turns a step each, run
    twice (the first warms every shape up, as a server that has run a while is): `isolated` with
    the step terms fitted on the second run's traced steps, and those steps. Nothing else runs beside the
    servers: a pass timed between their steps would slow the steps it is fitted on."""
    largest = max(isolated.models)
    # Paced by the fewest steps a speculative request can take (every draft accepted): the batch fills
    # before any request can have left, then runs full while the second half arrives (plain decoding,
    # slower, queues), and drains. Paced by a likelier count, the batch stayed at a third of B = 32.
    fewest = policies[0].verification.max_new_tokens / (1 + max(c.stopping.gamma_max for c in policies))
    arrivals = ramp(2 * largest, largest, fewest, turn_seconds(isolated, policies))
    for _ in range(2):
        _, _, steps = run_under_load(pair, ids, policies, arrivals, largest, eos_ids)
    terms = fit_terms(steps, isolated, {"requests": 2 * largest, "max_batch": largest,
                                        "policies": [c.policy_label() for c in policies],
                                        "max_new_tokens": policies[0].verification.max_new_tokens})
    return dataclasses.replace(isolated, terms=terms), steps


@dataclasses.dataclass
class InDecode:
    """The in-decode prices: the batch-1 cost model and the surface over B (None where the sweep
    has no B > 1), what each was fitted on, how long the runs took, and the live batch's traced
    steps the terms were fitted on (run_under_load's `steps`; None without a live batch)."""

    cost: CostModel
    surface: CostSurface | None
    detail: dict
    seconds: float
    steps: pd.DataFrame | None = None

    def described(self) -> dict:
        """summary.json's account of the prices: where they were timed, and the fitted terms."""
        terms = self.surface.terms.to_dict() if self.surface is not None and self.surface.terms else None
        return {"passes": "in decode", "batch_one": self.detail, "step_terms": terms, "seconds": self.seconds}


def price_in_decode(pair, ids: list[list[int]], base: DecodeConfig, isolated: CostSurface, gamma: int,
                    eos_ids: frozenset[int], compiled: bool = False, say=None) -> InDecode:
    """Both runs (the module's docstring): the batch-1 model from `isolated`'s, and, where `isolated`
    has a batch size above 1, it with the step terms of a live batch (a server runs its passes
    eagerly: harness/under_load.py)."""
    if not ids:
        raise DsparkError("prices in decode need at least one prompt")
    started = time.perf_counter()
    policies = calibration_policies(base, gamma)
    largest = max(isolated.models)
    if say:
        say(f"timing prices inside decodes: plain decoding, {' and '.join(c.policy_label() for c in policies)}"
            + (f"; then a batch of up to {largest} rows serving {2 * largest} requests, twice" if largest > 1 else ""))
    cost, detail = batch_one(pair, ids, policies, isolated.at(1), eos_ids, compiled)
    surface, steps = live_batch(pair, ids, policies, isolated, eos_ids) if largest > 1 else (None, None)
    return InDecode(cost, surface, detail, time.perf_counter() - started, steps)


def one_surface(pair, ids: list[list[int]], base: DecodeConfig, isolated: CostSurface, gamma: int,
                eos_ids: frozenset[int], compiled: bool = False) -> CostSurface:
    """The prices as one surface, for a caller that reads batch 1 from it too (a calibration): the
    live batch's with its terms where a batch size is above 1, else `isolated` with its batch-1
    model the one timed inside decodes."""
    timed = price_in_decode(pair, ids, base, isolated, gamma, eos_ids, compiled)
    return timed.surface or CostSurface({**isolated.models, 1: timed.cost})


def plan_seconds(per_token: float, tokens: int, largest_batch: int) -> float:
    """About how long price_in_decode takes: an untimed and 2 timed decodes of 2 prompts by 3 sides
    at batch 1, and 3 servers of 2 * B requests at B, twice: 2 * tokens steps of B rows each, a step
    of B rows costing about √B single ones (8 rows 2.2x, 32 rows 5.3x on the shipped pair, 2 cores)."""
    tokens = min(tokens, CAP_TOKENS)
    batched = 2 * 3 * 2 * tokens * float(np.sqrt(largest_batch)) if largest_batch > 1 else 0.0
    return per_token * (3 * 2 * 3 * tokens + batched)

"""A batched step's prices at its rows' depths (docs/depth.md#at-every-batch-size-and-under-load).

A cost model over B whose every batch size was timed at context depths (CostModel.by_depth in each,
measure/cost_model.measure_surface_depths) prices each step of a batched walk at its own depth, as
the engine pays it:

- padded (the batched decoder here): the widest row's depth. Its rows share the cache's columns
  (decoding/batch_lm.py), so every row's attention reads as many columns as the longest row holds;
  the surface at depth d was timed with its widest row holding d tokens.
- packed (vLLM, SGLang, TensorRT-LLM: paged caches): the rows' mean depth. Each row reads its own
  cache, so a step costs what its rows' total length costs, spread evenly.

Between the timed depths a step's cost is linear in depth, flat below the shallowest and
extrapolated along the deepest two beyond the deepest (CostModel.at_depths, a KV-cache read grows
linearly with its length). A surface without the axis at every batch size prices every step at its
one depth, as batched replay did before depth had an axis: the tables below then hold one depth and
give back the same numbers to the bit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numba
import numpy as np

from dspark_bench.replay.cost import CostModel, CostSurface, between_depths


@dataclass(frozen=True)
class StepPrices:
    """CostSurface.tables at each timed depth: `draft` [D, b] and `verify` [D, b, k] for b = 0 ..
    batch_size rows, `at` [D] the depths (D = 1 and `at` [0.0]: no depth axis)."""

    at: np.ndarray
    draft: np.ndarray
    verify: np.ndarray

    @classmethod
    def flat(cls, draft: np.ndarray, verify: np.ndarray) -> "StepPrices":
        """One depth's tables (CostSurface.tables'): every step priced there."""
        return cls(np.zeros(1), np.ascontiguousarray(np.asarray(draft, dtype=np.float64)[None]),
                   np.ascontiguousarray(np.asarray(verify, dtype=np.float64)[None]))

    @property
    def deep(self) -> bool:
        return len(self.at) > 1 or self.at[0] > 0


def surface_depths(surface: CostSurface) -> tuple[int, ...]:
    """Every depth any batch size of `surface` was timed at; empty unless every batch size has the axis
    (a surface whose B > 1 were timed at one depth, as every surface was before, keeps pricing there)."""
    timed = [set(model.by_depth) for model in surface.models.values()]
    return tuple(sorted(set.union(*timed))) if all(timed) else ()


def at_depth(surface: CostSurface, depth: int) -> CostSurface:
    """`surface` with every batch size's passes at `depth` (its step terms kept): each batch size's own
    timing there, or between its timed depths as CostModel.at_depths reads them (a larger batch is
    timed at fewer depths: measure/cost_model.time_depths)."""
    models = {}
    for b, m in surface.models.items():
        draft, verify = dataclasses.replace(m, t_round=0.0, t_round_empty=None, t_first_draft=0.0,
                                            t_round_token=0.0).at_depths([depth])
        models[b] = dataclasses.replace(m, t_draft=float(draft[0]), t_verify=[float(t) for t in verify[0]],
                                        context_tokens=depth, by_depth={}, t_learned=learned_at(m, depth))
    return CostSurface(models, surface.terms)


def learned_at(model: CostModel, depth: float) -> float:
    """What the learned signal adds to a draft step at `depth`: between the depths that timed it
    (linear, flat below the shallowest, along the deepest two beyond), else the model's one t_learned."""
    timed = sorted((d, e["t_learned"]) for d, e in model.by_depth.items() if "t_learned" in e)
    if not timed:
        return model.t_learned
    at = np.array([d for d, _ in timed], dtype=np.float64)
    values = np.array([v for _, v in timed])
    if len(at) == 1:
        return float(values[0])
    lo, hi, w = between_depths(at, np.array([float(depth)]))
    return max(float((1 - w[0]) * values[lo[0]] + w[0] * values[hi[0]]), 0.0)


def step_prices(surface: CostSurface, batch_size: int, learned: bool = False, plain: bool = False) -> StepPrices:
    """The tables a walk at `batch_size` prices its steps with (`CostSurface.tables`' arguments), at
    every depth the surface was timed at."""
    depths = surface_depths(surface)
    if not depths:
        return StepPrices.flat(*surface.tables(batch_size, learned, plain))
    layers = [at_depth(surface, d).tables(batch_size, learned, plain) for d in depths]
    return StepPrices(np.array(depths, dtype=np.float64), np.stack([d for d, _ in layers]),
                      np.stack([v for _, v in layers]))


def prefill_seconds(surface: CostSurface, tokens) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of each request's prefill of `tokens` prompt tokens (its prompt but the last), batch 1,
    as the batched decoder runs it, plain and speculative (target, then draft), with what joining a
    live batch adds past it (CostSurface.join: 0 on isolated prices). Per token at the prompt's own
    length where the batch-1 model timed prefills at depth (CostModel.prefills), else at its one."""
    alone, tokens = surface.at(min(surface.models)), np.asarray(tokens, dtype=np.float64)
    if any("t_prefill_target" in entry for entry in alone.by_depth.values()):
        target, draft = alone.prefills(tokens)
        both = target + draft
    else:
        target, both = tokens * alone.t_prefill_target, tokens * (alone.t_prefill_target + alone.t_prefill_draft)
    return np.maximum(target + surface.join(), 0.0), np.maximum(both + surface.join(), 0.0)


def admissions(surface: CostSurface, prompt_tokens) -> tuple[tuple, tuple]:
    """What a walk's `admit` (replay/slots.py) charges each request joining, plain and speculative:
    (its prefill's seconds, its prompt's tokens, seconds per position of the batch's caches it is
    spliced into: StepTerms.join_slots, 0 without terms)."""
    tokens = np.asarray(prompt_tokens, dtype=np.float64)
    plain, speculative = prefill_seconds(surface, np.maximum(tokens - 1, 0))
    return (plain, tokens, surface.join_slots()), (speculative, tokens, surface.join_slots())


@numba.njit(cache=True, nogil=True)
def _weight(at, depth):  # pragma: no cover (compiled)
    """(lower, upper, weight) of `depth` between the timed depths `at`, as cost.between_depths weighs them."""
    if len(at) == 1:
        return 0, 0, 0.0
    hi = min(max(np.searchsorted(at, depth), 1), len(at) - 1)
    lo = hi - 1
    return lo, hi, max((depth - at[lo]) / (at[hi] - at[lo]), 0.0)


@numba.njit(cache=True, nogil=True)
def draft_row(at, draft, depth):  # pragma: no cover (compiled)
    """t_draft[b] for every row count b, at `depth`."""
    lo, hi, w = _weight(at, depth)
    if w == 0.0:
        return draft[lo]
    return (1.0 - w) * draft[lo] + w * draft[hi]


@numba.njit(cache=True, nogil=True)
def verify_row(at, verify, depth, rows):  # pragma: no cover (compiled)
    """t_verify[rows, k] for every draft length k, at `depth`."""
    lo, hi, w = _weight(at, depth)
    if w == 0.0:
        return verify[lo, rows]
    return (1.0 - w) * verify[lo, rows] + w * verify[hi, rows]


@numba.njit(cache=True, nogil=True)
def step_depths(depth_of, keys, starts):  # pragma: no cover (compiled)
    """(the widest, the mean) context depth of a step's rows (`keys`: each row's request, -1 for an
    empty slot; `starts`: its position): the depth a padded and a packed step are priced at."""
    widest, total, rows = 0.0, 0.0, 0
    for r in range(len(keys)):
        if keys[r] >= 0:
            d = depth_of[keys[r], starts[r]]
            widest, total, rows = max(widest, d), total + d, rows + 1
    return widest, total / max(rows, 1)

"""What a window of an engine's counters says (engines/counters.py), and what it advises
(docs/observe.md; issue 66).

Per draft position i, from the rounds that accepted at least i + 1 tokens (P_i) over R rounds:
the survival S_i = P_i / R (what vLLM logs as its per-position rate) and the conditional rate
c_i = P_i / P_{i-1} (c_0 = S_0), each with a 95 % Wilson interval; the mean accepted length
A / R (bonus token excluded; the engines' "acceptance length" is 1 + it) with its interval from
the survival counts' own distribution.

**Advice from counters alone.** Where the rounds drafted K tokens (draft tokens ≥ 95 % of R × K: a
request's last drafts are cut to the tokens it has left), a draft cut to K' ≤ K tokens proposes
the same first K' tokens (a draft does not look ahead to its own length), so each round accepts
min(L, K') of them: its expected accepted length is Σ_{i<K'} S_i exactly, for every K' ≤ K. On a
cost model (the engine's measured prices, ours, or a file) each K' then has a predicted speedup,
K' = 0 being plain decoding; the best is named. (A round cut short at a request's end drafted
fewer: min(L, K') holds for it too, and its cost is over-counted by the few tokens it did not
draft.) Nothing past K can be seen: no counter says what position K + 1 would have accepted.
Where the drafts varied in length (a p-min, an adaptive controller), a cut draft's own cost is
unknown and no advice is given.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from dspark_bench.engines import drift, served
from dspark_bench.engines.counters import Counts, window
from dspark_bench.errors import DsparkError
from dspark_bench.paired import Z95
from dspark_bench.replay import cost_file
from dspark_bench.replay.cost import CostModel
from dspark_bench.results import check_writable, new_run_id, write_folder

FULL_DRAFTS = 0.95  # the share of K a fixed-length deployment drafts (Observed.draft_length)


def wilson(successes: int, trials: int) -> tuple[float, float]:
    """The 95 % Wilson score interval of a binomial proportion (nan, nan without trials)."""
    if trials <= 0:
        return math.nan, math.nan
    p, z2 = successes / trials, Z95 * Z95
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = Z95 * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def truncated_mean(survival: list[float], cut: int) -> tuple[float, float]:
    """E[min(L, cut)] and its variance, L a round's accepted length with P(L ≥ j) = survival[j - 1]:
    E = Σ_{j ≤ cut} P(L ≥ j), E[min(L, cut)²] = Σ_{j ≤ cut} (2j − 1) P(L ≥ j)."""
    first = survival[:cut]
    mean = sum(first)
    square = sum((2 * j + 1) * s for j, s in enumerate(first))
    return mean, max(square - mean * mean, 0.0)


@dataclass(frozen=True)
class Observed:
    """A window's counts, read per position."""

    counts: Counts

    def __post_init__(self):
        if self.counts.rounds <= 0:
            raise DsparkError("no speculative round finished inside the window: nothing to read (send traffic, or "
                              "take a longer window)")

    @property
    def survival(self) -> list[float]:
        return [p / self.counts.rounds for p in self.counts.per_position]

    @property
    def draft_length(self) -> int | None:
        """K where the rounds drafted K tokens (at least FULL_DRAFTS of the K a round could have: a
        request's last rounds are cut to the tokens it has left, 3 of 102 draft tokens on llama-server
        at 24 tokens a request), else None: a p-min or a controller varies the length far more."""
        k = len(self.counts.per_position)
        return k if k and self.counts.draft_tokens >= FULL_DRAFTS * self.counts.rounds * k else None

    def positions(self) -> list[dict]:
        """Per position: the rounds that accepted it, its survival and conditional rate with intervals."""
        rows, rounds = [], self.counts.rounds
        before = rounds
        for i, accepted in enumerate(self.counts.per_position):
            rows.append({"position": i, "accepted_rounds": accepted,
                         "survival": accepted / rounds, "survival_interval": wilson(accepted, rounds),
                         "conditional": accepted / before if before else math.nan,
                         "conditional_interval": wilson(accepted, before)})
            before = accepted
        return rows

    def mean_accepted(self) -> tuple[float, float, float]:
        """The mean accepted length a round (bonus token excluded) and its 95 % interval."""
        mean, variance = truncated_mean(self.survival, len(self.survival))
        half = Z95 * math.sqrt(variance / self.counts.rounds)
        return self.counts.accepted / self.counts.rounds, mean - half, mean + half

    def to_dict(self) -> dict:
        mean, low, high = self.mean_accepted()
        tokens = self.counts.draft_tokens
        return {**self.counts.to_dict(), "mean_accepted": mean, "mean_accepted_interval": [low, high],
                "acceptance_length": 1 + mean, "acceptance_rate": self.counts.accepted / tokens if tokens else None,
                "draft_length": self.draft_length,
                "positions_consistent": sum(self.counts.per_position) == self.counts.accepted,
                "positions": self.positions()}


def advice(observed: Observed, cost: CostModel) -> dict:
    """Every K' ≤ K's expected accepted length (exact) and predicted speedup on `cost`, the best named
    (module docstring); refused where the drafts varied in length."""
    k = observed.draft_length
    if k is None:
        raise DsparkError(f"the drafts varied in length ({observed.counts.draft_tokens} draft tokens over "
                          f"{observed.counts.rounds} rounds, {len(observed.counts.per_position)} positions): a shorter "
                          f"draft's cost cannot be read from counters, so no length is advised")
    reach = min(k, len(cost.t_verify) - 1)
    rows = [{"draft_length": 0, "mean_accepted": 0.0, "mean_accepted_interval": [0.0, 0.0], "speedup": 1.0,
             "speedup_interval": [1.0, 1.0]}]
    costs = cost.round_costs()
    for cut in range(1, reach + 1):
        mean, variance = truncated_mean(observed.survival, cut)
        half = Z95 * math.sqrt(variance / observed.counts.rounds)
        per_round = cut * cost.t_draft + costs[cut]
        speedups = [(1 + m) * cost.plain_step / per_round for m in (mean, mean - half, mean + half)]
        rows.append({"draft_length": cut, "mean_accepted": mean, "mean_accepted_interval": [mean - half, mean + half],
                     "speedup": speedups[0], "speedup_interval": speedups[1:]})
    best = max(rows, key=lambda row: row["speedup"])
    return {"deployed": k, "best": best["draft_length"], "best_speedup": best["speedup"], "by_length": rows,
            "priced_up_to": reach,
            "note": f"lengths past the deployed {k} cannot be seen: no counter says what they would have accepted"}


def observe(sources: list[str], seconds: float | None, prices: Path | None, out: Path, say=None,
            against: Path | None = None, served_model: str | None = None) -> tuple[Path, dict]:
    """`dspark-bench observe`: a window of an engine's counters read per position, with advice on
    `prices` (a cost-model file: its smallest batch size's model) where given, held against replay's
    prediction for what `against` (a replay sweep's folder) exports (engines/drift.py) where given,
    written as OUT/<run id>/observed.json (whole or not at all). Every input is checked before the window,
    an engine that serves another target than `against` was swept on among them (engines/served.py;
    `served_model`: the engine's name for the sweep's target, where it names it otherwise)."""
    if served_model is not None and against is None:
        raise DsparkError("--served-model names the sweep's target as the engine calls it: it needs --against")
    cost = None
    if prices is not None:
        surface = cost_file.load(prices).surface
        cost = surface.at(min(surface.models))
    sweep = drift.sweep_of(against) if against is not None else None
    if sweep is not None:
        served.check_target(served.served_by(sources), sweep.info.get("models") or {}, against, served_model)
    check_writable(out)
    counts, how = window(sources, seconds, say=say)
    observed = Observed(counts)
    result = {"window": how, "sources": list(sources), **observed.to_dict()}
    if cost is not None:
        try:
            result["advice"] = {"prices": str(prices), **advice(observed, cost)}
        except DsparkError as refused:
            result["advice"] = {"prices": str(prices), "refused": str(refused)}
    if sweep is not None:
        policy = drift.deployed(sweep, counts.engine)
        expected, effects = drift.predicted(sweep.rec, policy, counts.engine)
        result["against"] = {"folder": str(against), **drift.compare(counts, expected, policy, effects)}
    text = json.dumps(result, indent=1)
    folder = write_folder(out / new_run_id("observe"), lambda partial: (partial / "observed.json").write_text(text))
    return folder, result

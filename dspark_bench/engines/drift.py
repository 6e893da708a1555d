"""An observed window (engines/counters.py) held against replay's prediction for the deployed policy:
`observe --against FOLDER` (docs/observe.md#against-a-sweep-as-predicted-or-drifted; issue 66).

The deployed policy is what `export --format ENGINE` writes from FOLDER (a replay sweep's, which
holds the record of its prompts): replayed on that record in the engine's semantics, its rounds
that carried a draft give the predicted survival per position (the rounds that accepted at least
i + 1 tokens), counted as the engine counts them. Per position, the observed and predicted
survival differ by Δ with a 95 % interval; a position has **drifted** where Δ is both significant
(two-proportion z, Bonferroni over the positions at 1 %) and at least TOLERANCE in size, so
neither a large window's trivial difference nor a small window's noise is called drift. Rounds of
one prompt are alike, so each side's variance is its binomial one times the position's design
effect, measured between the record's prompts (`design_effect`).
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist

from dspark_bench.config import DecodeConfig
from dspark_bench.engines.counters import Counts
from dspark_bench.engines.export import choose
from dspark_bench.engines.run_policies import run_policies
from dspark_bench.errors import DsparkError
from dspark_bench.paired import Z95
from dspark_bench.replay.simulate import simulate

TOLERANCE = 0.05  # the smallest difference in a position's survival called drift
ALPHA = 0.01  # family-wise, over the positions
MIN_ROUNDS = 30  # fewer observed rounds than this: no verdict


def sweep_of(folder: Path):
    """`folder`'s policies and record (engines/run_policies.py), checked before any window is taken."""
    run = run_policies(Path(folder))
    if run.record is None:
        raise DsparkError(f"{folder} has no replay record to predict from: give a replay sweep's folder")
    return run


def deployed(run, engine: str) -> DecodeConfig:
    """The policy `export --format engine` writes from `run` at its smallest batch size; one line where
    the export deploys plain decoding (no speculative counts to hold against it)."""
    choice = choose(run, engine)[0]
    if choice.plain:
        raise DsparkError(f"the {engine} export of {run.folder.name} deploys plain decoding ({choice.plain}): no "
                          f"speculative counts to hold against it")
    return choice.exported


def predicted(rec, policy: DecodeConfig, engine: str) -> tuple[Counts, tuple[float, ...]]:
    """Replay's counts for `policy` on `rec`, as the engine counts them (rounds that carried a
    draft), and each position's design effect: how much more its survival varies than if every
    round were drawn alone (`design_effect`)."""
    per_prompt = [[r for r in prompt if r.drafted > 0] for prompt in simulate(rec, policy)]
    rounds = [r for prompt in per_prompt for r in prompt]
    width = policy.stopping.gamma_max
    counts = Counts(engine, len(rounds), sum(r.drafted for r in rounds), sum(r.accepted for r in rounds),
                    tuple(sum(r.accepted >= i + 1 for r in rounds) for i in range(width)))
    sizes = [len(prompt) for prompt in per_prompt]
    effects = tuple(design_effect([sum(r.accepted >= i + 1 for r in prompt) for prompt in per_prompt], sizes)
                    for i in range(width))
    return counts, effects


def design_effect(hits: list[int], sizes: list[int]) -> float:
    """A position's survival estimated from prompts' rounds (a ratio over clusters): its variance
    between prompts over a binomial's of as many rounds, at least 1. Rounds of one prompt are alike
    (a prompt the draft knows well accepts long on every round), so a window of a few prompts varies
    more than its round count says; the counters do not split a window by prompt, so the sweep's
    record measures how much, and both sides are held to it."""
    total, n = sum(hits), sum(sizes)
    kept = [(h, m) for h, m in zip(hits, sizes) if m]
    if len(kept) < 2 or n == 0 or total in (0, n):
        return 1.0
    rate = total / n
    between = len(kept) / (len(kept) - 1) * sum((h - rate * m) ** 2 for h, m in kept) / n ** 2
    return max(1.0, between / (rate * (1 - rate) / n))


def position(i: int, seen: Counts, expected: Counts, critical: float, effect: float = 1.0) -> dict:
    """One position's observed and predicted survival, their difference with its interval (each side's
    binomial variance times the position's design effect), and whether it drifted."""
    p_o, p_p = seen.per_position[i] / seen.rounds, expected.per_position[i] / expected.rounds
    pooled = (seen.per_position[i] + expected.per_position[i]) / (seen.rounds + expected.rounds)
    n_o, n_p = seen.rounds / effect, expected.rounds / effect  # the rounds' worth of independent draws
    spread = math.sqrt(pooled * (1 - pooled) * (1 / n_o + 1 / n_p))
    z = (p_o - p_p) / spread if spread > 0 else 0.0
    half = Z95 * math.sqrt(p_o * (1 - p_o) / n_o + p_p * (1 - p_p) / n_p)
    return {"position": i, "observed": p_o, "predicted": p_p, "difference": p_o - p_p, "design_effect": effect,
            "difference_interval": [p_o - p_p - half, p_o - p_p + half], "z": z,
            "drifted": abs(z) > critical and abs(p_o - p_p) >= TOLERANCE}


def compare(seen: Counts, expected: Counts, policy: DecodeConfig, effects: tuple[float, ...] | None = None) -> dict:
    """The verdict: "as predicted", "drifted" (which positions, by how much), or "no verdict" (why)."""
    base = {"policy": policy.label(), "predicted_rounds": expected.rounds, "observed_rounds": seen.rounds,
            "tolerance": TOLERANCE, "alpha": ALPHA}
    if len(seen.per_position) != len(expected.per_position):
        return {**base, "verdict": "no verdict",
                "why": f"the engine drafted up to {len(seen.per_position)} positions, the exported policy "
                       f"({policy.label()}) up to {len(expected.per_position)}: it is not the deployed one"}
    if seen.rounds < MIN_ROUNDS or expected.rounds < MIN_ROUNDS:
        return {**base, "verdict": "no verdict",
                "why": f"{min(seen.rounds, expected.rounds)} rounds on one side: fewer than {MIN_ROUNDS} decide "
                       "nothing"}
    critical = NormalDist().inv_cdf(1 - ALPHA / (2 * len(seen.per_position)))
    effects = effects or (1.0,) * len(seen.per_position)
    rows = [position(i, seen, expected, critical, effects[i]) for i in range(len(seen.per_position))]
    drifted = [r["position"] for r in rows if r["drifted"]]
    return {**base, "verdict": "drifted" if drifted else "as predicted", "drifted_positions": drifted,
            "positions": rows}

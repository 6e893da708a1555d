"""Paired verdicts: two policies timed on the same prompts, compared prompt by prompt.

Two policies decoded on the same prompts, interleaved in one process, share what makes each
one's own speedup interval wide: a long or hard prompt is slow for both. Their per-prompt ratio
cancels it, so the ratio's interval is far narrower than the two intervals side by side, and it
decides what those cannot (docs/run.md#paired-verdicts).

The ratio is the speedup's own definition applied between two policies: the reference's seconds
per generated token over the candidate's, (Σ t_ref / Σ n_ref) / (Σ t_cand / Σ n_cand) over the
shared prompts and timed passes; > 1 means the candidate is faster. Its 95 % interval is a
bootstrap that draws whole prompts, then passes within each drawn prompt (the same pass for
both sides: they were timed side by side).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from dspark_bench.errors import DsparkError
from dspark_bench.metrics import speedup_ratio

GOAL = 0.05  # the difference "prompts needed" is for: ±5 %
Z95 = 1.959964  # the normal's 97.5 % quantile
KEYS = ["prompt_id", "turn"]  # one timed sample of a policy per prompt (and turn) per pass


@dataclass(frozen=True)
class Verdict:
    """The candidate against the reference on the same prompts: ratio = reference's seconds per
    token / candidate's (> 1: the candidate is faster), with its 95 % interval."""

    candidate: str
    reference: str
    ratio: float
    low: float
    high: float
    prompts: int
    passes: int  # timed passes per prompt (each a median of the run's interleaved repeats)
    per_prompt: tuple[float, ...]  # each prompt's own ratio, in the samples' prompt order

    @property
    def verdict(self) -> str:
        if self.low > 1.0:
            return "faster"
        if self.high < 1.0:
            return "slower"
        return "no difference detected"

    @property
    def half_width(self) -> float:
        """Half the interval's width, relative to the ratio: a difference smaller than this, this
        run could not tell from none."""
        return (self.high - self.low) / 2 / self.ratio

    @property
    def prompts_needed(self) -> int | None:
        """Prompts that would narrow the interval to ±GOAL at this run's noise (it shrinks as one
        over the square root of the prompts); None after a single timing."""
        if not math.isfinite(self.half_width):
            return None
        return max(2, math.ceil(self.prompts * (self.half_width / GOAL) ** 2))

    def sentence(self) -> str:
        """'top1 threshold 0.3 vs fixed γ=4: +8.1 % [+3.0, +13.4] — faster (±5.2 % detectable)'."""
        change = f"{self.ratio - 1:+.1%} [{self.low - 1:+.1%}, {self.high - 1:+.1%}]"
        if self.verdict == "no difference detected":
            needed = self.prompts_needed
            detail = ("no difference detected: one timing cannot tell a difference from noise" if needed is None else
                      f"no difference detected: a difference under ±{self.half_width:.1%} cannot be told from none "
                      f"here; about {needed} prompts would detect ±{GOAL:.0%}")
        else:
            detail = f"{self.verdict} (±{self.half_width:.1%} detectable)"
        return f"{self.candidate} vs {self.reference}: {change} — {detail}"

    def to_dict(self) -> dict:
        return {**asdict(self), "per_prompt": list(self.per_prompt), "verdict": self.verdict,
                "half_width": self.half_width, "prompts_needed": self.prompts_needed, "sentence": self.sentence()}


def timed_passes(samples: pd.DataFrame) -> pd.DataFrame:
    """One row per prompt (and turn) and pass: spec_time_s and new_tokens of one policy's samples.
    A samples table without a `pass` column holds one pass."""
    table = samples if "pass" in samples else samples.assign(**{"pass": 0})
    keys = [k for k in KEYS if k in table] + ["pass"]
    return table.groupby(keys, sort=False)[["spec_time_s", "new_tokens"]].sum()


def aligned(candidate: pd.DataFrame, reference: pd.DataFrame) -> tuple[np.ndarray, ...]:
    """(t_cand, n_cand, t_ref, n_ref), each [prompts, passes]: the prompts and passes both sides
    timed, in the candidate's prompt order (every prompt keeps as many passes as the fewest has)."""
    joined = timed_passes(candidate).merge(timed_passes(reference), how="inner", left_index=True,
                                           right_index=True, suffixes=("_c", "_r"))
    if joined.empty:
        raise DsparkError("the two policies share no timed prompt: a paired comparison needs the same prompts")
    joined = joined.reset_index()
    joined["prompt"] = joined.groupby([k for k in KEYS if k in joined], sort=False).ngroup()
    passes = int(joined.groupby("prompt").size().min())
    joined = joined.sort_values(["prompt", "pass"], kind="stable")
    joined = joined[joined.groupby("prompt").cumcount() < passes]
    columns = ["spec_time_s_c", "new_tokens_c", "spec_time_s_r", "new_tokens_r"]
    values = joined[columns].to_numpy(float).reshape(-1, passes, len(columns))
    return tuple(values[:, :, i] for i in range(len(columns)))


def ratio(t_cand, n_cand, t_ref, n_ref):
    """(Σ t_ref / Σ n_ref) / (Σ t_cand / Σ n_cand) over the last two axes (prompts, passes)."""
    return (t_ref.sum((-2, -1)) / n_ref.sum((-2, -1))) / (t_cand.sum((-2, -1)) / n_cand.sum((-2, -1)))


def compare(candidate: pd.DataFrame, reference: pd.DataFrame, candidate_label: str = "candidate",
            reference_label: str = "reference", samples: int = 2000, seed: int = 0) -> Verdict:
    """The paired verdict of two policies' samples tables (the same prompts; columns prompt_id,
    turn, spec_time_s, new_tokens and, where a run timed several passes, pass)."""
    arrays = aligned(candidate, reference)
    P, R = arrays[0].shape
    point = float(ratio(*arrays))
    per_prompt = tuple(float(ratio(*(a[p : p + 1] for a in arrays))) for p in range(P))
    if P < 2 and R < 2:  # one timing: nothing to tell noise by
        return Verdict(candidate_label, reference_label, point, 0.0, math.inf, P, R, per_prompt)
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, P, size=(samples, P, 1))
    passes = rng.integers(0, R, size=(samples, P, R))  # within each drawn prompt, the same pass for both sides
    low, high = interval(point, ratio(*(a[prompts, passes] for a in arrays)), P if P > 1 else R)
    return Verdict(candidate_label, reference_label, point, low, high, P, R, per_prompt)


def interval(point: float, draws: np.ndarray, n: int) -> tuple[float, float]:
    """The 95 % interval of `point` from its bootstrap `draws` over n items. A percentile
    bootstrap over few prompts is too narrow (it covered the truth 88 % of the time at 15 prompts,
    tests/test_paired.py): it is widened as Student's t widens a normal interval."""
    low, high = np.percentile(draws, [2.5, 97.5])
    widen = t_factor(n) / Z95
    return float(point - (point - low) * widen), float(point + (high - point) * widen)


def t_factor(n: int) -> float:
    """What multiplies the standard error of a mean of n items for a 95 % half-width: Student's t
    with the n/(n-1) variance correction."""
    return math.sqrt(n / (n - 1)) * t_quantile(n - 1)


def compare_speedups(current: pd.DataFrame, baseline: pd.DataFrame, label: str = "current run",
                     reference: str = "baseline", samples: int = 2000, seed: int = 0) -> Verdict:
    """One policy's speedup in two runs (regress: the current run against its baseline), paired
    on the prompts both timed: (current's speedup) / (baseline's), each run's speedup taken over
    those prompts (metrics.speedup_ratio); > 1: the current run is faster."""
    columns = ["baseline_time_s", "baseline_new_tokens", "spec_time_s", "new_tokens"]
    keys = [k for k in KEYS if k in current and k in baseline]
    joined = current[keys + columns].merge(baseline[keys + columns], on=keys, suffixes=("_c", "_b"))
    if joined.empty:
        raise DsparkError("the two runs share no timed prompt: a paired comparison needs the same prompts")
    now, then = (joined[[f"{c}_{side}" for c in columns]].to_numpy(float).T for side in ("c", "b"))

    def change(rows):  # rows: [..., prompts] indexes
        return speedup_ratio(*(x[rows] for x in now)) / speedup_ratio(*(x[rows] for x in then))

    P = len(joined)
    point = float(change(np.arange(P)))
    per_prompt = tuple(float(change(np.array([p]))) for p in range(P))
    if P < 2:
        return Verdict(label, reference, point, 0.0, math.inf, P, 1, per_prompt)
    low, high = interval(point, change(np.random.default_rng(seed).integers(0, P, size=(samples, P))), P)
    return Verdict(label, reference, point, low, high, P, 1, per_prompt)


# Student's t 97.5 % quantile at 1..30 degrees of freedom as t tables print it: three decimals,
# within 5e-4 of the exact value (Cornish-Fisher is 3.0 off at 1, 0.024 at 3, 7e-4 at 7).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile(dof: int) -> float:
    """Student's t 97.5 % quantile at `dof` >= 1 degrees of freedom: the project's one (these
    verdicts' intervals; replay/sampled.py's over replicates). The table T975 up to 30; beyond,
    the Cornish-Fisher expansion from the normal's quantile, within 2e-6 of the exact value there."""
    if dof < 1:
        raise ValueError(f"Student's t needs at least one degree of freedom, not {dof}")
    if dof <= len(T975):
        return T975[dof - 1]
    z = Z95
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2) + \
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3)

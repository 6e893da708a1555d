"""Paired verdicts of a timed run, and repeats until the headline is known (docs/run.md#paired-verdicts).

Every policy of a run or a sweep's confirmation is compared with the best fixed γ at its batch
size on the same prompts (paired.compare). The headline is the best scheduled policy against
that fixed γ. With a precision target, the headline pair is timed again, pass after pass
(interleaved like the first), until its interval is within ±target or the time budget is spent.

Whether more passes can get there is estimated from the passes so far: the ratio's spread splits
into what differs between prompts (a policy that suits some prompts better: more passes cannot
remove it, only more prompts) and what differs between passes of one prompt (timing noise: it
shrinks as one over the passes).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

# Times the headline pair once more: (candidate, reference) config_ids, the pass's number -> its
# samples (runner.another_pass, bound to the run's models, prompts and settings).
AnotherPass = Callable[[tuple[int, int], int], "pd.DataFrame"]

import numpy as np
import pandas as pd

from dspark_bench import schedules
from dspark_bench.paired import Z95, Verdict, aligned, compare, t_factor


def on_own_clock(samples: pd.DataFrame) -> pd.DataFrame:
    """`samples` with each batched policy's seconds counted in its own plain decoding's seconds per
    token. At B > 1 a policy and plain decoding run as two batched decodes taking turns step by step,
    but one policy after another: the machine's speed moves between them (long-code at B = 8: the
    same plain decoding took 26.6-34.0 s across four confirmations), and raw seconds paired across
    policies judged that drift (-24.5 % [-29 %, -19 %] for two policies whose speedups were 1.31 and
    1.36). Each measured on the plain decoding interleaved with it, the drift cancels. Batch-1
    samples interleave every side prompt by prompt and are left as they are."""
    if "batch_size" not in samples or not (samples["batch_size"] > 1).any():
        return samples
    per_token = samples["baseline_time_s"] / samples["baseline_new_tokens"].clip(lower=1)
    return samples.assign(spec_time_s=np.where(samples["batch_size"] > 1, samples["spec_time_s"] / per_token,
                                               samples["spec_time_s"]))


def best_fixed(table: pd.DataFrame) -> dict[int, int]:
    """Batch size -> config_id of its best measured fixed γ."""
    fixed = table[schedules.where(table, baseline=True)].dropna(subset=["speedup"])
    return {int(b): int(g.sort_values("speedup", ascending=False, kind="stable")["config_id"].iloc[0])
            for b, g in fixed.groupby("batch_size")}


def paired_verdicts(samples: pd.DataFrame, table: pd.DataFrame, timed_as: dict[int, int] | None = None) -> list[dict]:
    """Each measured policy against the best fixed γ at its batch size (none where a batch size
    measured no fixed γ), as Verdict dicts with the two config_ids. `timed_as`: a policy -> the one
    whose timing it shares (identical rounds: tuning/confirm.py); two that share one did the same work."""
    timed_as, samples = timed_as or {}, on_own_clock(samples)
    references, labels = best_fixed(table), dict(zip(table["config_id"], table["config_label"]))
    out = []
    for row in table.dropna(subset=["speedup"]).itertuples():
        reference = references.get(int(row.batch_size))
        if reference is None or reference == row.config_id:
            continue
        ids = {"config_id": int(row.config_id), "reference_id": reference, "batch_size": int(row.batch_size)}
        mine, theirs = timed_as.get(row.config_id, row.config_id), timed_as.get(reference, reference)
        if mine == theirs:
            out.append({**ids, **same_work_verdict(labels[row.config_id], labels[reference])})
            continue
        verdict = compare(samples[samples["config_id"] == mine], samples[samples["config_id"] == theirs],
                          labels[row.config_id], labels[reference])
        out.append({**ids, **verdict.to_dict()})
    return out


def same_work_verdict(candidate: str, reference: str) -> dict:
    """Two policies whose rounds are identical on every prompt: one timing, no difference by construction."""
    return {"candidate": candidate, "reference": reference, "ratio": 1.0, "low": 1.0, "high": 1.0,
            "verdict": "same work", "half_width": 0.0,
            "sentence": f"{candidate} vs {reference}: the same work (identical rounds on every "
                        f"prompt, timed once): no difference by construction"}


def headline(table: pd.DataFrame, verdicts: list[dict]) -> dict | None:
    """The best scheduled policy's verdict against the best fixed γ (at the smallest batch size
    that has both): the sweep's first answer."""
    scheduled = table[~schedules.where(table, baseline=True)].dropna(subset=["speedup"])
    for batch_size in sorted(scheduled["batch_size"].unique()):
        best = scheduled[scheduled["batch_size"] == batch_size].sort_values("speedup", ascending=False, kind="stable")
        found = [v for v in verdicts if v["config_id"] == int(best["config_id"].iloc[0])]
        if found:
            return found[0]
    return None


def spread(samples: pd.DataFrame, candidate: int, reference: int) -> tuple[float, float | None, int, int]:
    """(between-prompt variance, within-prompt variance or None with one pass, prompts, passes) of
    the log of each prompt's per-pass ratio."""
    samples = on_own_clock(samples)
    t_c, n_c, t_r, n_r = aligned(samples[samples["config_id"] == candidate], samples[samples["config_id"] == reference])
    logs = np.log((t_r / n_r) / (t_c / n_c))  # [prompts, passes]
    prompts, passes = logs.shape
    within = float(logs.var(axis=1, ddof=1).mean()) if passes > 1 else None
    between = float(logs.mean(axis=1).var(ddof=1)) - (within or 0.0) / passes if prompts > 1 else 0.0
    return max(between, 0.0), within, prompts, passes


def passes_needed(samples: pd.DataFrame, candidate: int, reference: int, target: float) -> int | None:
    """Passes in all that would bring the interval to ±target at this noise; None where the
    prompts' own differences keep it wider whatever the passes (more prompts are needed)."""
    between, within, prompts, passes = spread(samples, candidate, reference)
    z = t_factor(prompts) if prompts > 1 else Z95  # as compare() widens its interval; one prompt: no t to take
    if within is None:
        return None if z * math.sqrt(between / prompts) >= target else passes + 1
    room = (target / z) ** 2 * prompts - between
    if room <= 0:
        return None
    return max(passes, math.ceil(within / room))


@dataclasses.dataclass
class Sharpening:
    """What the precision loop did: its target and budget, the passes and seconds it took, its
    estimate (after the second pass), and how it ended."""

    target: float
    budget_s: float
    passes: int = 1
    seconds: float = 0.0
    estimate_s: float | None = None
    ended: str = ""  # "reached" | "budget spent" | "more prompts needed"
    half_width: float | None = None

    def sentence(self) -> str:
        done = f"±{self.half_width:.1%} after {self.passes} pass{'es' * (self.passes != 1)}"
        if self.ended == "reached":
            return f"precision ±{self.target:.1%} reached: {done}, {self.seconds:.0f} s of further passes"
        if self.ended == "more prompts needed":
            return (f"precision ±{self.target:.1%} not reachable with these prompts: {done}; the prompts themselves "
                    f"differ more than that, so more passes cannot narrow it — give more prompts")
        return f"precision ±{self.target:.1%} not reached: the {self.budget_s:.0f} s budget ran out at {done}"


def sharpen(samples: pd.DataFrame, pair_ids: tuple[int, int], another_pass: AnotherPass, target: float,
            budget_s: float, say: Callable[[str], None] | None = None) -> tuple[pd.DataFrame, Sharpening]:
    """Time the headline pair (candidate, reference config_ids of `samples`) again, a pass at a
    time, until its paired interval is within ±target or `budget_s` seconds are spent; returns
    the samples with every pass (column `pass`) and what happened."""
    say = say or (lambda line: None)
    samples = samples if "pass" in samples else samples.assign(**{"pass": 0})
    state = Sharpening(target, budget_s)
    started, per_pass = time.perf_counter(), None
    while True:
        verdict = headline_verdict(samples, pair_ids)
        state.half_width, state.passes = verdict.half_width, int(samples["pass"].max()) + 1
        if verdict.half_width <= target:
            state.ended = "reached"
            break
        needed = passes_needed(samples, *pair_ids, target)
        if needed is None and state.passes > 1:
            state.ended = "more prompts needed"
            break
        elapsed = time.perf_counter() - started
        if per_pass is not None and state.estimate_s is None and needed is not None:
            state.estimate_s = elapsed + (needed - state.passes) * per_pass
            say(f"±{verdict.half_width:.1%} after {state.passes} passes: about {needed - state.passes} more "
                f"(≈ {state.estimate_s - elapsed:.0f} s) to reach ±{target:.1%}")
        if elapsed + (per_pass or 0.0) > budget_s:
            state.ended = "budget spent"
            break
        one = time.perf_counter()
        samples = pd.concat([samples, another_pass(pair_ids, state.passes)], ignore_index=True)
        per_pass = time.perf_counter() - one
    state.seconds = time.perf_counter() - started
    return samples, state


def headline_verdict(samples: pd.DataFrame, pair_ids: tuple[int, int]) -> Verdict:
    candidate, reference = pair_ids
    samples = on_own_clock(samples)
    return compare(samples[samples["config_id"] == candidate], samples[samples["config_id"] == reference])


def judge(samples: pd.DataFrame, table: pd.DataFrame, another_pass: AnotherPass | None = None,
          precision: float = 0.0, budget_s: float = 600.0, say: Callable[[str], None] | None = None,
          timed_as: dict[int, int] | None = None) -> tuple[pd.DataFrame, dict]:
    """The paired verdicts of a timed run (`table`: its measured policies, with config_id,
    config_label, schedule, batch_size and speedup) and its headline; with a precision target,
    the headline pair is sharpened first. Returns the samples (every pass) and summary.json's
    `verdicts`, `headline` and `precision`."""
    verdicts = paired_verdicts(samples, table, timed_as)
    top = headline(table, verdicts)
    if precision <= 0 or top is None or another_pass is None or top["verdict"] == "same work":
        return samples, {"verdicts": verdicts, "headline": top}
    samples, state = sharpen(samples, (top["config_id"], top["reference_id"]), another_pass, precision, budget_s, say)
    verdicts = paired_verdicts(samples, table, timed_as)
    return samples, {"verdicts": verdicts, "headline": headline(table, verdicts),
                     "precision": {**dataclasses.asdict(state), "sentence": state.sentence()}}


def with_schedules(table: pd.DataFrame, configs) -> pd.DataFrame:
    """A run's summary table with each policy's schedule (which of them are fixed γ), from its
    DecodeConfigs (config_id indexes them)."""
    return table.assign(schedule=[configs[int(i)].stopping.schedule for i in table["config_id"]])

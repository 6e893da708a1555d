"""The `learned` confidence signal: a calibrated probability that a drafted token is accepted.

A logistic regression fitted on a replay record (replay/learned.py) over what the draft already
computed at that step: its raw signals s (RAW_SIGNALS) as s, log s and log(1 − s) (so
a linear model can bend each into a logit's shape); what the sequence's own n-gram history says
of the drafted token (`agreement`, the CONTEXT features: did the lookup find a match, does it predict this token,
its share of the votes), computed on the host from the tokens; and the token's position in the
draft (one-hot; positions past the record's longest draft count as the last). It is read here,
by the decoder at every draft step and by replay over a whole record, with one function in
float64, one compiled loop token by token (no matmul, whose summation order depends on the
shape). Its inputs agree to float32 rounding, as every metric's do between an engine and its
record (the record batches the draft's forwards otherwise, and the decoder sums topk_mass and
llama.cpp's mass on the host from the top-k, where the record's torch reduction may round the
last bit differently); only a score within that rounding of a threshold can decide otherwise.

Used as `metric: learned` with `signal_model` naming the file (or the replay sweep's folder
holding `learned_signal.json`); every schedule reads it like any metric. Its value is already an
acceptance probability, so the goodput schedule reads it as its own curve.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np

from dspark_bench.errors import DsparkError

# The drafter's signals it reads: all but entropy, which would cost a pass over the vocabulary at
# every draft step for .0003 of held-out AUC (the code task's 40 prompts); the others come from
# one top-k (confidence.top_signals).
RAW_SIGNALS = ("top1", "topk_mass", "margin", "llamacpp_top1")
CONTEXT = ("lookup_found", "lookup_agrees", "lookup_share")  # agreement's, in its order; each enters as itself
FILE = "learned_signal.json"


FLOOR = 1e-4  # log s and log(1 - s) stay finite at 0 and 1, and do not blow up float32 rounding near them
TRANSFORMS = {  # each raw signal enters as these elementwise functions of it (float64 in, float64 out; _probability's)
    "": lambda s: s,
    "log_": lambda s: np.log(np.maximum(s, FLOOR)),
    "log1m_": lambda s: np.log(np.maximum(1.0 - s, FLOOR)),
}


def feature_names(positions: int) -> list[str]:
    """The features, in the order the fit and the signal both use them."""
    return [f"{prefix}{name}" for name in RAW_SIGNALS for prefix in TRANSFORMS] + list(CONTEXT) + \
        [f"position_{g + 1}" for g in range(positions)]


def features(signals: dict[str, np.ndarray]):
    """Each raw signal's transforms, then the context features (float64), in feature_names' order;
    the positions follow them (the fit's columns, replay/learned.py)."""
    for name in RAW_SIGNALS:
        value = np.asarray(signals[name], dtype=np.float64)
        for transform in TRANSFORMS.values():
            yield transform(value)
    for name in CONTEXT:
        yield np.asarray(signals[name], dtype=np.float64)


@dataclass(frozen=True)
class LearnedSignal:
    mean: tuple[float, ...]  # the standardisation of each feature (feature_names' order)
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    positions: int  # one-hot positions 1..positions
    topk: int = 5  # the k of the topk_mass it was fitted on (the record's), which the decoder must compute
    models: tuple = ()  # (name, fingerprint) of the target and draft it was fitted on, where known

    @functools.cached_property
    def weights(self) -> tuple[float, tuple[float, ...], tuple[float, ...]]:
        """The fit folded for speed: z = constant + Σ slope_i · feature_i + at_position[step]
        (standardising is linear; a one-hot position adds its own weight), so a draft step costs
        two operations a feature instead of three, and one for its position."""
        slopes = tuple(c / s for c, s in zip(self.coef, self.scale))
        constant = self.intercept - sum(a * m for a, m in zip(slopes, self.mean))
        raw = len(self.coef) - self.positions
        return constant, slopes[:raw], slopes[raw:]

    @functools.cached_property
    def arrays(self) -> tuple[float, np.ndarray, np.ndarray]:
        constant, slopes, at_position = self.weights
        return constant, np.array(slopes, dtype=np.float64), np.array(at_position, dtype=np.float64)

    def __call__(self, raw: np.ndarray, context: np.ndarray, step: np.ndarray) -> np.ndarray:
        """Acceptance probability [n] (float64) of n drafted tokens: their raw signals `raw`
        [n, RAW_SIGNALS] and context features `context` [n, CONTEXT] (float32, as read from the
        drafter and `agreement`), at 0-based draft `step` [n]. One compiled loop, token by token,
        for the decoder's row or batch and replay's whole record alike, so both see the same numbers."""
        constant, slopes, at_position = self.arrays
        out = np.empty(len(step), dtype=np.float64)
        _probability(np.ascontiguousarray(raw, dtype=np.float32), np.ascontiguousarray(context, dtype=np.float32),
                     np.ascontiguousarray(step, dtype=np.int64), constant, slopes, at_position, FLOOR, out)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "LearnedSignal":
        names = data["features"]
        positions = len(names) - len(RAW_SIGNALS) * len(TRANSFORMS) - len(CONTEXT)
        expected = feature_names(max(positions, 1))
        if names != expected or not len(data["mean"]) == len(data["scale"]) == len(data["coef"]) == len(names):
            raise ValueError(f"features {names} are not {expected} (fitted by an older version: fit it again)")
        if min(data["scale"]) <= 0:
            raise ValueError("a feature's scale is not positive")
        return cls(tuple(map(float, data["mean"])), tuple(map(float, data["scale"])), tuple(map(float, data["coef"])),
                   float(data["intercept"]), positions, int(data.get("topk", 5)),
                   tuple(sorted((k, v) for k, v in (data.get("models") or {}).items() if v)))


@numba.njit(cache=True, nogil=True)
def _probability(raw, context, step, constant, slopes, at_position, floor, out):  # pragma: no cover (compiled)
    for i in range(len(step)):
        out[i] = _token_probability(raw[i], context[i], step[i], constant, slopes, at_position, floor)


@numba.njit(cache=True, nogil=True)
def _token_probability(raw, context, step, constant, slopes, at_position, floor):  # pragma: no cover (compiled)
    # The terms in feature_names' order: each raw s as s, log s, log(1 - s) (TRANSFORMS), then the context's.
    z, j = constant, 0
    for r in range(len(raw)):
        value = np.float64(raw[r])
        z += slopes[j] * value
        z += slopes[j + 1] * np.log(max(value, floor))
        z += slopes[j + 2] * np.log(max(1.0 - value, floor))
        j += 3
    for c in range(len(context)):
        z += slopes[j] * np.float64(context[c])
        j += 1
    z += at_position[min(step, len(at_position) - 1)]
    return 1.0 / (1.0 + np.exp(-z))


def step_scores(signal: LearnedSignal, top: np.ndarray, topk: int, llama: int, contexts: list, tokens,
                steps) -> list[float]:
    """The decoder's learned scores of one draft step's rows, in one compiled call: each row's raw
    signals from its most likely tokens' probabilities `top` [rows, K] (float32, descending; the
    k of topk_mass and llama.cpp's 10: `raw_signals`), its context features from `contexts[i]`
    and `tokens[i]` (`agreement`), and the fit at `steps[i]`. Right after a draft forward every
    Python and numpy call runs several times slower than alone, so the step makes one."""
    lengths = np.fromiter(map(len, contexts), dtype=np.int64, count=len(contexts))
    flat = np.fromiter(itertools.chain.from_iterable(contexts), dtype=np.int64, count=int(lengths.sum()))
    constant, slopes, at_position = signal.arrays
    out = np.empty(len(contexts), dtype=np.float64)
    _step_scores(top, topk, llama, flat, lengths, np.asarray(tokens, dtype=np.int64), np.asarray(steps, dtype=np.int64),
                 constant, slopes, at_position, FLOOR, *AGREEMENT_NGRAMS, out)
    return out.tolist()


@numba.njit(cache=True, nogil=True)
def _step_scores(top, topk, llama, flat, lengths, tokens, steps, constant, slopes, at_position, floor, ngram_min,
                 ngram_max, out):  # pragma: no cover (compiled)
    raw = np.empty(len(RAW_SIGNALS), dtype=np.float32)
    context = np.empty(len(CONTEXT), dtype=np.float32)
    start = 0
    for i in range(len(out)):
        _raw_signals(top[i], topk, llama, raw)
        context[:] = 0.0
        _agreement(flat[start : start + lengths[i]], tokens[i], ngram_min, ngram_max, context)
        start += lengths[i]
        out[i] = _token_probability(raw, context, steps[i], constant, slopes, at_position, floor)


def raw_signals(top: np.ndarray, topk: int, llama: int) -> np.ndarray:
    """[rows, RAW_SIGNALS] (float32) from `top` [rows, K]: what the decoder's learned signal reads
    (`step_scores`), each its confidence function's value to float32 rounding (a test holds them)."""
    top = np.ascontiguousarray(top, dtype=np.float32)
    out = np.empty((len(top), len(RAW_SIGNALS)), dtype=np.float32)
    for i in range(len(top)):
        _raw_signals(top[i], topk, llama, out[i])
    return out


@numba.njit(cache=True, nogil=True)
def _raw_signals(top, topk, llama, out):  # pragma: no cover (compiled)
    # RAW_SIGNALS' order: top1, topk_mass (clamped to [0, 1]), margin, llamacpp_top1.
    mass, kept = np.float32(0.0), np.float32(0.0)
    for i in range(max(topk, llama)):
        if i < topk:
            mass += top[i]
        if i < llama:
            kept += top[i]
    out[0] = top[0]
    out[1] = min(max(mass, np.float32(0.0)), np.float32(1.0))
    out[2] = top[0] - top[1]
    out[3] = top[0] / kept


def load(path: str) -> LearnedSignal:
    """The fitted signal at `path` (a file, or a sweep folder holding one), read once per version
    of the file: a file rewritten in place is read again. The decoder calls it at every draft
    step, so it asks the file system one question when it can (a stat)."""
    file = str(path)
    try:
        found = os.stat(file)
        if stat.S_ISDIR(found.st_mode):
            file = os.path.join(file, FILE)
            found = os.stat(file)
    except OSError:
        found = None
    if found is None or not stat.S_ISREG(found.st_mode):
        raise DsparkError(f"no learned signal at {str(path)!r} (a replay sweep's folder or its {FILE})")
    return _load(file, found.st_mtime_ns, found.st_size)


@functools.lru_cache(maxsize=16)
def _load(file: str, mtime_ns: int, size: int) -> LearnedSignal:
    try:
        return LearnedSignal.from_dict(json.loads(Path(file).read_text()))
    except (OSError, KeyError, TypeError, ValueError) as err:
        raise DsparkError(f"learned signal {file!r} is unreadable: {err}") from None


# --- the context features: what prompt lookup (lookup.py) says of a drafted token -------------
# A draft model's token that the sequence's own n-gram history also predicts is accepted far more
# often: on the code task's 40 held-out prompts the held-out AUC rose from .86 to .93 with these.
AGREEMENT_NGRAMS = (1, 3)  # ngram_min, ngram_max: the lookup drafter's defaults


def agreement(seq, token: int) -> np.ndarray:
    """[found, agrees, share] (float32) for `token` proposed after `seq`: whether the lookup
    (lookup.continuation) found an earlier occurrence of the sequence's last n-gram; whether its next
    token is `token`; the share of the occurrences' votes that went to `token` (0 when none)."""
    out = np.zeros(3, dtype=np.float32)
    _agreement(np.asarray(seq, dtype=np.int64), int(token), *AGREEMENT_NGRAMS, out)
    return out


@numba.njit(cache=True, nogil=True)
def _agreement(arr, token, ngram_min, ngram_max, out):  # pragma: no cover (compiled)
    # lookup.continuation(arr, ngram_min, ngram_max, 1)'s first token and its votes, without the arrays it builds.
    T = len(arr)
    followers = np.empty(max(T, 1), dtype=np.int64)
    for n in range(min(ngram_max, T - 1), ngram_min - 1, -1):
        count = 0
        for s in range(T - n):  # windows ending before the last token, so each has a follower
            same = True
            for i in range(n):
                if arr[s + i] != arr[T - n + i]:
                    same = False
                    break
            if same:
                followers[count] = arr[s + n]
                count += 1
        if count == 0:
            continue
        ranked = np.sort(followers[:count])
        most = 0
        for i in range(count):  # the largest vote
            most = max(most, np.searchsorted(ranked, ranked[i], "right") - np.searchsorted(ranked, ranked[i], "left"))
        winner = -1
        for i in range(count - 1, -1, -1):  # a tie goes to the latest occurrence's vote
            value = followers[i]
            if np.searchsorted(ranked, value, "right") - np.searchsorted(ranked, value, "left") == most:
                winner = value
                break
        votes = np.searchsorted(ranked, token, "right") - np.searchsorted(ranked, token, "left")
        out[0] = 1.0
        out[1] = 1.0 if winner == token else 0.0
        out[2] = np.float32(votes / count)
        return

"""Calibrated acceptance: the probability that the target accepts a drafted token, given the
confidence the draft reported for it.

A replay record holds, at every position of the target's continuation, the draft's rollout
with every confidence metric and how far it matches (`replay.rounds.match_lengths`). Step k of a
rollout is a drafted token whose verdict we know when every step before it matched: it is
accepted iff step k matched too. Per metric, a monotone (isotonic) fit of those verdicts against
the confidence turns the metric into an acceptance probability — what the goodput schedule
(goodput.py) multiplies along a draft. The fit is evaluated with np.interp on its knots, the
same function in the decoder and in replay, so both decide identically.

Quality per metric: the Brier score and the expected calibration error (ECE, 10 equal-width
bins), of the fitted curve (cross-fitted: fitted on half the prompts, scored on the other half,
both ways) and of the raw confidence read as a probability, for comparison.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dspark_bench.config import METRICS
from dspark_bench.decoding.goodput import AcceptanceFit, Curve
from dspark_bench.errors import DsparkError
from dspark_bench.replay.rounds import match_lengths

ECE_BINS = 10


def verdict_steps(matches: np.ndarray, lengths: np.ndarray, G: int) -> np.ndarray:
    """[P, N, G]: the rollout steps that are drafted tokens with a verdict: step k from position j
    counts while every step before it matched (k <= M[p, j]) and the token exists (j + k < length)."""
    _, N = matches.shape
    j, k = np.arange(N)[None, :, None], np.arange(G)[None, None, :]
    return (k <= matches[:, :, None]) & (j + k < np.asarray(lengths)[:, None, None])


def accepted_steps(matches: np.ndarray, G: int) -> np.ndarray:
    """[P, N, G] bool: rollout step k from position j is accepted, given the steps before it were
    (k < M[p, j]); meaningful where `verdict_steps` says the step has a verdict."""
    return np.arange(G)[None, None, :] < matches[:, :, None]


def drafted_tokens(confidences: dict, matches: np.ndarray, lengths: np.ndarray) -> pd.DataFrame:
    """Every rollout step k from every position j of a replay record, for every metric: step k
    counts while the steps before it matched the target (k <= M[p, j]) and the token exists
    (j + k < length); it is accepted iff k < M[p, j] (`replay.rounds.match_lengths`). Columns: metric,
    confidence, accepted, prompt (its index), position (k + 1)."""
    P, _ = matches.shape
    G = next(iter(confidences.values())).shape[2]
    k = np.arange(G)[None, None, :]
    used = verdict_steps(matches, lengths, G)
    accepted = accepted_steps(matches, G)[used]
    prompt = np.broadcast_to(np.arange(P)[:, None, None], used.shape)[used]
    position = np.broadcast_to(k + 1, used.shape)[used]
    frames = [pd.DataFrame({"metric": name, "confidence": values[used].astype(float), "accepted": accepted,
                            "prompt": prompt, "position": position})
              for name, values in confidences.items() if name in METRICS]  # the metrics a user picks
    return pd.concat(frames, ignore_index=True)


def fit_curve(confidence: np.ndarray, accepted: np.ndarray) -> Curve:
    """Isotonic regression (scikit-learn) of accepted (0/1) on confidence, clipped to [0, 1]."""
    from sklearn.isotonic import IsotonicRegression

    confidence, accepted = np.asarray(confidence, float), np.asarray(accepted, float)
    finite = np.isfinite(confidence)  # a NaN confidence (a broken draft step) tells nothing
    if not finite.any():
        raise DsparkError("no drafted tokens with a verdict to fit acceptance on")
    iso = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip")
    iso.fit(confidence[finite], accepted[finite])
    return Curve(tuple(float(v) for v in iso.X_thresholds_), tuple(float(v) for v in iso.y_thresholds_))


def roc_auc(scores, labels) -> float:
    """Area under the ROC curve via the rank-sum (Mann-Whitney U) statistic; ties get mean ranks."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    positives, negatives = labels.sum(), (~labels).sum()
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    _, tie, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.bincount(tie, weights=ranks) / counts)[tie]  # mean rank within each tie
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def brier(probability: np.ndarray, accepted: np.ndarray) -> float:
    return float(np.nanmean((np.asarray(probability, float) - np.asarray(accepted, float)) ** 2))


def ece(probability: np.ndarray, accepted: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error: Σ_bins (tokens in bin / tokens) · |mean accepted − mean probability|."""
    probability, accepted = np.asarray(probability, float), np.asarray(accepted, float)
    finite = np.isfinite(probability)
    probability, accepted = probability[finite], accepted[finite]
    which = np.clip((probability * bins).astype(int), 0, bins - 1)
    total = 0.0
    for b in range(bins):
        inside = which == b
        if inside.any():
            total += inside.mean() * abs(accepted[inside].mean() - probability[inside].mean())
    return float(total)


def cross_fitted(tokens: pd.DataFrame) -> np.ndarray:
    """Each token's fitted acceptance from a curve fitted on the other half of the prompts
    (even / odd), so the reported scores are not the fit grading itself."""
    out = np.empty(len(tokens))
    half = (tokens["prompt"].to_numpy() % 2).astype(bool)
    if half.all() or not half.any():  # one prompt: nothing to hold out
        return fit_curve(tokens["confidence"], tokens["accepted"])(tokens["confidence"].to_numpy())
    for side in (False, True):
        train, test = half != side, half == side
        curve = fit_curve(tokens["confidence"][train], tokens["accepted"][train])
        out[test] = curve(tokens["confidence"].to_numpy()[test])
    return out


def fit_tokens(tokens: pd.DataFrame) -> AcceptanceFit:
    """Fit every metric present in `tokens` (drafted_tokens' columns)."""
    curves, quality = {}, {}
    for metric, rows in tokens.groupby("metric", sort=False):
        rows = rows.reset_index(drop=True)
        curves[metric] = fit_curve(rows["confidence"], rows["accepted"])
        held_out = cross_fitted(rows)
        quality[metric] = {
            "tokens": int(len(rows)), "mean_acceptance": float(rows["accepted"].mean()),
            "brier": brier(held_out, rows["accepted"]), "ece": ece(held_out, rows["accepted"]),
            "raw_brier": brier(rows["confidence"], rows["accepted"]),
            "raw_ece": ece(rows["confidence"], rows["accepted"]),
        }
    return AcceptanceFit(curves, quality)


def fit_record(rec) -> AcceptanceFit:
    """The acceptance fit of a replay record (every metric it holds)."""

    return fit_tokens(drafted_tokens(rec.confidences, match_lengths(rec), rec.lengths))


def load_or_fit(rec, record_dir: Path) -> AcceptanceFit:
    """The record's fit, kept beside it (acceptance.json) so every sweep of it shares one."""
    path = Path(record_dir) / "acceptance.json"
    if path.is_file():
        return AcceptanceFit.load(path)
    fit = fit_record(rec)
    try:
        fit.save(path)
    except OSError:  # a read-only record folder: the fit still serves this sweep
        pass
    return fit

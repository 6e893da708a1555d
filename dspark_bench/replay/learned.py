"""A learned acceptance signal: fitted on a replay record, read by the decoder and by replay.

The rules stop on one raw confidence metric; the headroom (analysis/oracle.py) says how much a rule that
knew acceptance in advance would win. Between the two sits the question this module answers:
how much of "will the target accept this drafted token?" can be predicted at all from what the
draft has already computed? The `learned` signal is a logistic regression (scikit-learn) of a
token's verdict on the record's features of that token: the signals the drafter computed at its
step (top1, topk_mass, margin, llamacpp_top1: all but entropy), each as s, log s and log(1 − s); what
prompt lookup says of the token after the same context (learned_signal.CONTEXT: did it find the
context's last n-gram before, does it predict this token, its share of the votes); and its
position in the draft (one-hot).
It is conditional on the draft so far being accepted, as every verdict in a record is
(acceptance.drafted_tokens). The decoder and replay read the saved fit with
decoding/learned_signal.py, which takes the same features.

The fit on every prompt is saved beside the record (`learned_signal.json`). How well it predicts
acceptance on prompts it never saw, beside every raw metric, is a study of the record:
analysis/signal_quality.py.

Not here: the draft's hidden state as a feature. On the code task's 40 held-out prompts it raised
the held-out AUC from .860 to .876 over the raw signals alone (an L2-regularised fit over its 192
values), and by .001–.002 once the context features were in (.934 without it, .935 with it in a
gradient-boosted fit over everything); the decoder would have to read it out of the draft's forward.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dspark_bench.config import LEARNED
from dspark_bench.decoding import learned_signal
from dspark_bench.decoding.confidence import SIGNALS
from dspark_bench.decoding.learned_signal import CONTEXT, FILE, LearnedSignal
from dspark_bench.decoding.learned_signal import RAW_SIGNALS as RAW
from dspark_bench.errors import DsparkError
from dspark_bench.replay.acceptance import accepted_steps, verdict_steps
from dspark_bench.replay.rounds import match_lengths
from dspark_bench.results import write_json

SHOWN = tuple(SIGNALS)  # every raw signal is kept per token, for the held-out comparison (analysis/signal_quality.py)


@dataclass
class Tokens:
    """Every drafted token of a record with a verdict: features [T, F], accepted [T], prompt [T]."""

    features: np.ndarray
    names: list[str]
    accepted: np.ndarray
    prompt: np.ndarray
    raw: dict[str, np.ndarray]  # each raw metric's value at each token


def used_steps(rec) -> np.ndarray:
    """[P, N, G]: rollout steps that are drafted tokens with a verdict (acceptance.verdict_steps)
    that the drafter had (`available`)."""
    G = rec.rollout.shape[2]
    return verdict_steps(match_lengths(rec), rec.lengths, G) & (np.arange(G)[None, None, :] < rec.available[:, :, None])


def drafted(rec) -> Tokens:
    """The record's drafted tokens with a verdict, and their features."""
    used, matches = used_steps(rec), match_lengths(rec)
    P, N, G = rec.rollout.shape
    k = np.arange(G)[None, None, :]
    signals = inputs(rec)
    # The very transforms the signal applies in the decoder (learned_signal.features), and the position one-hot.
    columns = [value[used] for value in learned_signal.features(signals)]
    # A record made before a signal existed (gini) lacks it: the comparison shows those it holds.
    raw = {m: rec.confidences[m][used].astype(np.float64) for m in SHOWN if m in rec.confidences}
    columns += [np.broadcast_to(k == g, (P, N, G))[used].astype(np.float64) for g in range(G)]
    return Tokens(np.stack(columns, axis=1), learned_signal.feature_names(G), accepted_steps(matches, G)[used],
                  np.broadcast_to(np.arange(P)[:, None, None], used.shape)[used], raw)


def inputs(rec) -> dict:
    """What the learned signal reads of every rollout step: the raw signals and the context features."""
    missing = [m for m in (*RAW, *CONTEXT) if m not in rec.confidences]
    if missing:
        raise DsparkError(f"the record holds no {', '.join(missing)}: record it again")
    return {m: rec.confidences[m] for m in (*RAW, *CONTEXT)}


def make_model():
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))


def evaluate(rec) -> dict:
    """The learned signal fitted on every prompt of `rec` (its held-out quality: analysis/signal_quality.py)."""
    tokens = drafted(rec)
    if len(np.unique(tokens.accepted)) < 2:
        raise DsparkError("every drafted token of the record was accepted, or none was: no signal to learn")
    if len(np.unique(tokens.prompt)) < 2:  # a signal whose quality on unseen prompts cannot be measured is not fitted
        raise DsparkError("a learned signal needs at least 2 prompts in the record (its quality is held out by prompt)")
    model = make_model().fit(tokens.features, tokens.accepted)
    scaler, regression = model[0], model[1]
    models, prompts = rec.info.get("models") or {}, len(np.unique(tokens.prompt))
    return {
        "features": tokens.names, "topk": int(rec.info.get("topk", 5)),
        # What it was fitted on: a run decoding with it checks its models are these.
        "models": {k: models.get(k) for k in ("target_fingerprint", "draft_fingerprint")},
        "mean": scaler.mean_.tolist(), "scale": scaler.scale_.tolist(),
        "coef": regression.coef_[0].tolist(), "intercept": float(regression.intercept_[0]),
        "mean_acceptance": float(tokens.accepted.mean()),
        "prompts": prompts,
    }


def load_or_evaluate(rec, record_dir: Path) -> dict:
    """`evaluate(rec)`, kept beside the record so every sweep and report of it shares one."""
    path = Path(record_dir) / FILE
    if path.is_file():
        try:
            kept = json.loads(path.read_text())
            LearnedSignal.from_dict(kept)
            if "topk" in kept:
                return kept
        except (OSError, KeyError, TypeError, ValueError):
            pass  # damaged, or fitted on features this version does not compute
    # absent, damaged, older or partial: fitted again
    result = evaluate(rec)
    try:
        write_json(path, result)
    except OSError:  # a read-only record folder: the result still serves this sweep
        pass
    return result


def with_learned(rec, model: LearnedSignal):
    """`rec` with confidences["learned"]: the signal at every rollout step, as the decoder computes it."""
    signals = inputs(rec)
    shape = rec.rollout.shape
    raw = np.stack([signals[m].ravel() for m in RAW], axis=1)
    context = np.stack([signals[m].ravel() for m in CONTEXT], axis=1)
    step = np.broadcast_to(np.arange(shape[2]), shape).ravel()
    values = model(raw, context, step).reshape(shape)
    return dataclasses.replace(rec, confidences={**rec.confidences, LEARNED: values})

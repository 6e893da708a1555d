"""The learned acceptance signal (replay/learned.py): it finds what the raw metrics miss, its
quality is held out by prompt, and its saved coefficients are the fit's."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_bench.decoding.learned_signal import LearnedSignal
from dspark_bench.errors import DsparkError
from dspark_bench.replay import learned
from dspark_bench.replay.record import Record
from dspark_bench.replay.simulate import match_lengths

SIGNALS = ("top1", "entropy", "topk_mass", "margin", "llamacpp_top1")


def record_where(accept, P: int = 10, N: int = 40, G: int = 4, seed: int = 0) -> Record:
    """A record whose step k from position j is accepted iff accept(k, signals at that step) says
    so; the signals are uniform noise unless `accept` reads them."""
    rng = np.random.default_rng(seed)
    continuation = rng.integers(10, 100, size=(P, N))
    confidences = {m: rng.random((P, N, G)).astype(np.float32) for m in SIGNALS}
    rollout = np.empty((P, N, G), dtype=np.int64)
    for k in range(G):
        ahead = np.full((P, N), 5, dtype=np.int64)
        ahead[:, : N - k] = continuation[:, k:]
        right = accept(k, {m: c[:, :, k] for m, c in confidences.items()}, rng)
        rollout[:, :, k] = np.where(right, ahead, 7)  # 7 never appears in the continuation
    return Record(continuation, np.full(P, N), rollout, confidences, (), {"max_new_tokens": N, "topk": 5})


def by_signal(result: dict) -> dict:
    return {row["signal"]: row for row in result["quality"]}


def test_the_learned_signal_finds_acceptance_the_raw_metrics_miss():
    # Acceptance falls with the position in the draft; every raw metric is noise.
    chance = (0.95, 0.6, 0.25, 0.05)
    rec = record_where(lambda k, s, rng: rng.random(s["top1"].shape) < chance[k])
    quality = by_signal(learned.evaluate(rec))
    assert quality["learned"]["auc"] > 0.7
    assert all(abs(quality[m]["auc"] - 0.5) < 0.06 for m in SIGNALS)
    assert all(quality["learned"]["brier"] < quality[m]["brier"] for m in SIGNALS)
    assert quality["learned"]["tokens"] == quality["top1"]["tokens"]


def test_a_metric_that_decides_acceptance_scores_perfectly_and_learned_keeps_up():
    rec = record_where(lambda k, s, rng: s["margin"] > 0.4)
    quality = by_signal(learned.evaluate(rec))
    assert quality["margin"]["auc"] == pytest.approx(1.0) and quality["margin"]["brier"] < 0.01
    assert quality["learned"]["auc"] > 0.97


def test_tokens_are_those_with_a_verdict_and_the_saved_fit_is_sklearns(tmp_path):
    rec = record_where(lambda k, s, rng: rng.random(s["top1"].shape) < 0.7)
    tokens = learned.drafted(rec)
    M = match_lengths(rec)
    P, N, G = rec.rollout.shape
    expected = sum(k <= M[p, j] and j + k < N for p in range(P) for j in range(N) for k in range(G))
    assert len(tokens.accepted) == expected  # step k counts while the steps before it matched, inside the text
    result = learned.load_or_evaluate(rec, tmp_path)
    assert (tmp_path / learned.FILE).is_file() and learned.load_or_evaluate(rec, tmp_path) == result
    model = learned.make_model().fit(tokens.features, tokens.accepted)
    # What the engine reads (decoding/learned_signal) is the fit scikit-learn made.
    signal = LearnedSignal.from_dict(result)
    replayed = learned.with_learned(rec, signal).confidences["learned"]
    used = learned.used_steps(rec)
    np.testing.assert_allclose(replayed[used], model.predict_proba(tokens.features)[:, 1], rtol=1e-9)


def test_one_prompt_cannot_be_held_out():
    rec = record_where(lambda k, s, rng: rng.random(s["top1"].shape) < 0.5, P=1)
    with pytest.raises(DsparkError, match="at least 2 prompts"):
        learned.evaluate(rec)

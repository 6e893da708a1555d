"""The learned acceptance signal (replay/learned.py): it finds what the raw metrics miss, its
quality is held out by prompt, and its saved coefficients are the fit's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dspark_bench.analysis.signal_quality import signal_quality
from dspark_bench.decoding.learned_signal import CONTEXT, LearnedSignal, agreement
from dspark_bench.errors import DsparkError
from dspark_bench.replay import learned
from dspark_bench.replay.record import Record
from dspark_bench.replay.rounds import match_lengths

SIGNALS = ("top1", "entropy", "topk_mass", "margin", "llamacpp_top1")


def record_where(accept, P: int = 10, N: int = 40, G: int = 4, seed: int = 0) -> Record:
    """A record whose step k from position j is accepted iff accept(k, signals at that step) says
    so; the signals are uniform noise unless `accept` reads them."""
    rng = np.random.default_rng(seed)
    continuation = rng.integers(10, 100, size=(P, N))
    confidences = {m: rng.random((P, N, G)).astype(np.float32) for m in SIGNALS}
    found = rng.random((P, N, G)) < 0.7  # the context features, noise too: found, agrees if found, its share
    agrees = found & (rng.random((P, N, G)) < 0.5)
    share = np.where(agrees, rng.uniform(0.5, 1, (P, N, G)), np.where(found, rng.uniform(0, 0.5, (P, N, G)), 0))
    confidences.update({m: v.astype(np.float32) for m, v in zip(CONTEXT, (found, agrees, share))})
    rollout = np.empty((P, N, G), dtype=np.int64)
    for k in range(G):
        ahead = np.full((P, N), 5, dtype=np.int64)
        ahead[:, : N - k] = continuation[:, k:]
        right = accept(k, {m: c[:, :, k] for m, c in confidences.items()}, rng)
        rollout[:, :, k] = np.where(right, ahead, 7)  # 7 never appears in the continuation
    return Record(continuation, np.full(P, N), rollout, confidences, (), {"max_new_tokens": N, "topk": 5})


def by_signal(rec) -> dict:
    """Every signal's held-out quality on `rec` (analysis/signal_quality.py), by name."""
    return {row["signal"]: row for row in signal_quality(rec)}


def test_the_learned_signal_finds_acceptance_the_raw_metrics_miss():
    # Acceptance falls with the position in the draft; every raw metric is noise.
    chance = (0.95, 0.6, 0.25, 0.05)
    rec = record_where(lambda k, s, rng: rng.random(s["top1"].shape) < chance[k])
    quality = by_signal(rec)
    assert quality["learned"]["auc"] > 0.7
    assert all(abs(quality[m]["auc"] - 0.5) < 0.06 for m in SIGNALS)
    assert all(quality["learned"]["brier"] < quality[m]["brier"] for m in SIGNALS)
    assert quality["learned"]["tokens"] == quality["top1"]["tokens"]


def test_the_lookups_agreement_is_learned_where_every_raw_metric_is_noise():
    # The target accepts what the sequence's own n-gram history predicts, mostly.
    rec = record_where(lambda k, s, rng: rng.random(s["top1"].shape) < np.where(s["lookup_agrees"] > 0, 0.9, 0.2))
    quality = by_signal(rec)
    assert quality["learned"]["auc"] > 0.8
    assert all(abs(quality[m]["auc"] - 0.5) < 0.06 for m in SIGNALS)
    missing = Record(rec.continuation, rec.lengths, rec.rollout,
                     {m: v for m, v in rec.confidences.items() if m in SIGNALS}, (), rec.info)
    with pytest.raises(DsparkError, match="holds no lookup_found, lookup_agrees, lookup_share: record it again"):
        learned.evaluate(missing)


def test_agreement_is_what_prompt_lookup_would_propose():
    from dspark_bench.decoding import lookup

    rng = np.random.default_rng(1)
    for _ in range(2000):  # small vocabularies: many matches, ties and n-gram lengths
        seq = rng.integers(0, rng.integers(2, 6), rng.integers(1, 40)).tolist()
        token = int(rng.integers(0, 6))
        proposed, votes = lookup.continuation(seq, 1, 3, 1)
        if not proposed:
            expected = [0, 0, 0]
        else:
            values, counts, _ = votes[0]
            expected = [1, proposed[0] == token, counts[values == token].sum() / counts.sum()]
        np.testing.assert_array_equal(agreement(seq, token), np.float32(expected))


def test_a_metric_that_decides_acceptance_scores_perfectly_and_learned_keeps_up():
    rec = record_where(lambda k, s, rng: s["margin"] > 0.4)
    quality = by_signal(rec)
    assert quality["margin"]["auc"] == pytest.approx(1.0) and quality["margin"]["brier"] < 0.01
    assert quality["learned"]["auc"] > 0.97


def test_tokens_are_those_with_a_verdict_and_the_saved_fit_is_sklearns(tmp_path):
    rec = record_where(lambda k, s, rng: rng.random(s["top1"].shape) < 0.7)
    tokens = learned.drafted(rec)
    M = match_lengths(rec)
    P, N, G = rec.rollout.shape
    expected = sum(k <= M[p, j] and j + k < N for p in range(P) for j in range(N) for k in range(G))
    assert len(tokens.accepted) == expected  # step k counts while the steps before it matched, inside the text
    (tmp_path / learned.FILE).write_text('{"features": ["top1", "position_1"]}')  # an older fit's features
    result = learned.load_or_evaluate(rec, tmp_path)
    assert result["features"] == tokens.names and learned.load_or_evaluate(rec, tmp_path) == result
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


# --- the learned signal in the engine, batch 1 and batched, and in replay: the same rounds -------

PROMPTS = [[0, 5, 9, 11], [7], [3, 3, 40, 2, 8, 100, 17], [12, 13], [21, 22, 23]]
N, G = 20, 5


@pytest.fixture(scope="module")
def learned_record(llama_pair, tmp_path_factory):
    """A record of the tiny pair, its learned signal fitted and saved, and the record with it."""
    from types import SimpleNamespace

    from dspark_bench.measure.recording import record
    from dspark_bench.results import write_json

    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=frozenset({1}))
    rec = record(pair, PROMPTS, N, G, topk=5, eos_ids=pair.eos_ids)
    path = tmp_path_factory.mktemp("learned") / learned.FILE
    fitted = learned.evaluate(rec)
    write_json(path, fitted)
    return pair, learned.with_learned(rec, LearnedSignal.from_dict(fitted)), str(path)


def learned_policies(path: str, batch_size: int = 1):
    from tiny import GOODPUT_MODEL

    from dspark_bench.config import DecodeConfig

    common = {"metric": "learned", "signal_model": path, "max_new_tokens": N, "batch_size": batch_size}
    return [DecodeConfig.of(**common, threshold=0.5, gamma_max=G),
            DecodeConfig.of(**common, threshold=0.7, gamma_max=4, min_draft_len=0, semantics="hf"),
            DecodeConfig.of(**common, threshold=0.6, gamma_max=G, min_draft_len=2, semantics="llamacpp"),
            DecodeConfig.of(**common, schedule="cumulative", threshold=0.3, gamma_max=G),
            DecodeConfig.of(**common, schedule="ramp", threshold_start=0.3, threshold_end=0.8, gamma_max=G),
            DecodeConfig.of(**common, schedule="goodput", goodput_model=GOODPUT_MODEL, gamma_max=G, min_draft_len=0)]


def round_tuples(rounds) -> list[tuple]:
    return [(r.drafted, r.accepted, r.emitted, r.stop_reason, list(r.draft_tokens), r.target_token) for r in rounds]


@pytest.mark.parametrize("draft_mode", ["early-stop", "verify-side"])
def test_learned_policies_decode_as_replay_says(learned_record, draft_mode):
    from dspark_bench.decoding.autoregressive import autoregressive_decode
    from dspark_bench.decoding.speculative import speculative_decode
    from dspark_bench.replay.simulate import simulate

    pair, rec, path = learned_record
    stops = set()
    for config in learned_policies(path):
        for prompt, replayed in zip(PROMPTS, simulate(rec, config)):
            real = speculative_decode(pair.target, pair.draft, prompt, config.replace(draft_mode=draft_mode),
                                      pair.eos_ids)
            assert round_tuples(real.rounds) == round_tuples(replayed), config.label()
            assert real.tokens == autoregressive_decode(pair.target, prompt, config, pair.eos_ids).tokens
            if draft_mode == "early-stop":  # the engine's confidences are the signal replay read
                # (to float32 rounding of the raw signals, which the log features magnify: the
                # record's rollouts batch the draft's forwards differently, as for every metric in test_replay)
                for mine, theirs in zip(replayed, real.rounds):
                    assert mine.confidences == pytest.approx(theirs.confidences[: len(mine.confidences)], abs=1e-4)
            stops |= {r.stop_reason for r in real.rounds}
    assert "threshold" in stops and "gamma_max" in stops  # the signal both stops drafts and lets them run


def test_learned_policies_batched_decode_each_row_as_alone(learned_record):
    from dspark_bench.decoding.batched import batched_speculative
    from dspark_bench.decoding.speculative import speculative_decode

    pair, _, path = learned_record
    for config in learned_policies(path, batch_size=3)[:4]:  # goodput's batched costs differ by B
        rows = batched_speculative(pair.target, pair.draft, PROMPTS, config, 3, pair.eos_ids)
        for prompt, row in zip(PROMPTS, rows):
            alone = speculative_decode(pair.target, pair.draft, prompt, config.replace(batch_size=1), pair.eos_ids)
            assert round_tuples(row.result.rounds) == round_tuples(alone.rounds), config.label()


def test_a_learned_policy_without_its_signal_is_one_line(tmp_path):
    from dspark_bench.config import DecodeConfig
    from dspark_bench.decoding import learned_signal

    with pytest.raises(DsparkError, match="needs its fitted signal"):
        DecodeConfig.of(metric="learned")
    with pytest.raises(DsparkError, match="fitted on the draft model's record"):
        DecodeConfig.of(metric="learned", signal_model="x.json", drafter="lookup")
    broken = tmp_path / learned.FILE
    broken.write_text('{"features": ["top1"], "mean": [0], "scale": [0], "coef": [1], "intercept": 0}')
    with pytest.raises(DsparkError, match="unreadable"):
        learned_signal.load(str(tmp_path))
    with pytest.raises(DsparkError, match="no learned signal"):
        learned_signal.load(str(tmp_path / "absent.json"))


def test_a_record_with_nothing_to_learn_is_refused_in_one_line():
    rec = record_where(lambda k, s, rng: np.ones(s["top1"].shape, bool))  # every drafted token accepted
    with pytest.raises(DsparkError, match="no signal to learn"):
        learned.evaluate(rec)


def test_the_fit_is_read_again_when_rewritten_and_checked_against_the_models(learned_record, tmp_path):
    import json
    import os
    from types import SimpleNamespace

    from dspark_bench.config import DecodeConfig
    from dspark_bench.decoding import learned_signal
    from dspark_bench.harness.run import check_learned_models

    _, _, path = learned_record
    fitted = {**json.loads(Path(path).read_text()), "models": {"target_fingerprint": "t1", "draft_fingerprint": "d1"}}
    copy = tmp_path / learned.FILE
    copy.write_text(json.dumps(fitted))
    first = learned_signal.load(str(copy))
    assert first.topk == 5
    copy.write_text(json.dumps({**fitted, "intercept": fitted["intercept"] + 1.0}))
    os.utime(copy, ns=(1, 1))  # a rewrite, whatever the clock's resolution
    assert learned_signal.load(str(copy)).intercept == pytest.approx(first.intercept + 1.0)
    config = DecodeConfig.of(metric="learned", signal_model=str(copy))
    fingerprints = (fitted["models"]["target_fingerprint"], fitted["models"]["draft_fingerprint"])
    check_learned_models(SimpleNamespace(device=torch.device("cpu"), fingerprints=fingerprints), [config])
    with pytest.raises(DsparkError, match="fitted on other models"):
        check_learned_models(SimpleNamespace(device=torch.device("cpu"), fingerprints=("other", fingerprints[1])),
                             [config])


def test_the_context_features_decide_alike_in_our_decoder_and_replay(learned_record, tmp_path):
    # A signal that reads only what prompt lookup says (drafts on while it found the context's
    # last n-gram before): the engines compute it from their own sequences, replay from the record.
    import json

    from dspark_bench.config import DecodeConfig
    from dspark_bench.decoding.batched import batched_speculative
    from dspark_bench.decoding.speculative import speculative_decode
    from dspark_bench.replay.simulate import simulate

    pair, rec, path = learned_record
    fitted = json.loads(Path(path).read_text())
    weights = {"lookup_found": 4.0, "lookup_share": 4.0}
    only_lookup = {**fitted, "mean": [0.0] * len(fitted["features"]), "scale": [1.0] * len(fitted["features"]),
                   "coef": [weights.get(name, 0.0) for name in fitted["features"]], "intercept": -2.0}
    (tmp_path / learned.FILE).write_text(json.dumps(only_lookup))
    rec = learned.with_learned(rec, LearnedSignal.from_dict(only_lookup))
    config = DecodeConfig.of(metric="learned", signal_model=str(tmp_path), threshold=0.5, gamma_max=G, max_new_tokens=N,
                          min_draft_len=0)
    replayed = simulate(rec, config)
    drafted = [r.drafted for rounds in replayed for r in rounds]
    assert min(drafted) == 0 and max(drafted) >= 2  # lookup's matches come and go within a draft
    for mode in ("early-stop", "verify-side"):
        for prompt, rounds in zip(PROMPTS, replayed):
            real = speculative_decode(pair.target, pair.draft, prompt, config.replace(draft_mode=mode), pair.eos_ids)
            assert round_tuples(real.rounds) == round_tuples(rounds), mode
    rows = batched_speculative(pair.target, pair.draft, PROMPTS, config.replace(batch_size=3), 3, pair.eos_ids)
    assert [round_tuples(row.result.rounds) for row in rows] == [round_tuples(rounds) for rounds in replayed]


@pytest.mark.parametrize("shape", [(8192,), (3, 50), (64, 8192)])
def test_every_signal_at_once_is_each_signals_own_value(shape):
    # The record (and the learned signal) read all_metrics; a rule on one metric reads its own function.
    from dspark_bench.decoding import confidence, learned_signal

    probs = torch.softmax(torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))) * 3, dim=-1)
    for topk in (1, 5, 12):
        together = confidence.all_metrics(probs, topk)
        assert list(together) == list(confidence.SIGNALS)
        for name, fn in confidence.SIGNALS.items():
            assert torch.equal(together[name], fn(probs, topk)), (name, topk)
        # The learned signal's, derived on the host from the top probabilities the engine reads.
        rows = probs.reshape(-1, shape[-1])
        top = rows.topk(confidence.top_count(topk, shape[-1]), dim=-1).values.numpy()
        derived = learned_signal.raw_signals(top, min(topk, top.shape[1]), min(confidence.LLAMACPP_TOPK, top.shape[1]))
        for i, name in enumerate(learned.RAW):
            np.testing.assert_allclose(derived[:, i], confidence.SIGNALS[name](rows, topk).numpy(), rtol=1e-6, atol=0)


def test_replay_charges_the_learned_signals_draft_steps(learned_record):
    # The learned signal runs on the host at every draft step (CostModel.t_learned): a learned
    # policy's prediction pays it per draft forward, at batch 1 and on the surface at any B.
    from dspark_bench.config import DecodeConfig
    from dspark_bench.replay.batched import simulate_with_surface
    from dspark_bench.replay.cost import CostModel, CostSurface
    from dspark_bench.replay.simulate import simulate_grid

    _, rec, path = learned_record
    verify = [0.010 + 0.002 * k for k in range(G + 1)]
    plain = CostModel(0.001, verify, 10)
    charged = CostModel(0.001, verify, 10, t_learned=0.0004)
    assert CostModel.from_dict(charged.to_dict()) == charged
    configs = [DecodeConfig.of(metric="learned", signal_model=path, threshold=0.5, gamma_max=G, max_new_tokens=N),
               DecodeConfig.of(threshold=0.5, gamma_max=G, max_new_tokens=N)]
    before, after = simulate_grid(rec, configs, plain), simulate_grid(rec, configs, charged)
    np.testing.assert_allclose(after.predicted_time - before.predicted_time,
                               [after.draft_forwards[0] * 0.0004, 0.0])  # the raw metric's steps pay nothing more
    surface = CostSurface({1: charged, 4: CostModel(0.002, [2 * t for t in verify], 10, 4, t_learned=0.001)})
    draft, _ = surface.tables(4)
    learned_draft, _ = surface.tables(4, learned=True)
    np.testing.assert_allclose((learned_draft - draft)[1:], [0.0004 + 0.0002 * b for b in range(4)])
    batched = [c.replace(batch_size=4) for c in configs]
    free = CostSurface({b: CostModel(m.t_draft, m.t_verify, 10, b) for b, m in surface.models.items()})
    slower = (simulate_with_surface(rec, batched, surface).predicted_time
              - simulate_with_surface(rec, batched, free).predicted_time)
    assert slower[0] > 0 and slower[1] == pytest.approx(0.0)

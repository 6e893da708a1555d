"""The engines' rule variants, the acceptance fit and the goodput schedule's arithmetic.
(Replay == engine for every variant is in test_replay.py and test_batched.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiny

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding import goodput
from dspark_bench.decoding.proposal import draft_length
from dspark_bench.errors import DsparkError
from dspark_bench.replay.acceptance import AcceptanceFit, brier, drafted_tokens, ece, fit_record
from dspark_bench.replay.rounds import match_lengths
from dspark_bench.replay.simulate import Record


def test_the_seed_example_under_each_engine_s_rule():
    ours = DecodeConfig.of(gamma_max=5, threshold=0.7, min_draft_len=1)
    confidences = [0.9, 0.85, 0.65, 0.99]
    assert draft_length(ours, confidences) == (2, "threshold")  # the failing token is dropped
    assert draft_length(ours.replace(semantics="hf"), confidences) == (3, "threshold")  # HF keeps it
    # llama.cpp drops it too, but a draft shorter than --draft-min is thrown away ...
    assert draft_length(ours.replace(semantics="llamacpp", min_draft_len=2), confidences) == (2, "threshold")
    assert draft_length(ours.replace(semantics="llamacpp", min_draft_len=3), confidences) == (0, "threshold")
    # ... and no position is kept unconditionally (ours keeps the first min_draft_len).
    assert draft_length(ours.replace(min_draft_len=3), [0.1, 0.1, 0.1, 0.1]) == (3, "threshold")
    assert draft_length(ours.replace(semantics="llamacpp", min_draft_len=3), [0.1, 0.9, 0.9, 0.9]) == (0, "threshold")
    # With too little budget for --draft-min, llama.cpp does not draft at all.
    assert draft_length(ours.replace(semantics="llamacpp", min_draft_len=3), [0.9] * 5, budget=2) == (0, "budget")
    # HF at its limit: the limit ends the draft, whatever the last token's confidence.
    assert draft_length(ours.replace(semantics="hf", gamma_max=3), [0.9, 0.9, 0.1]) == (3, "gamma_max")


def test_goodput_goes_on_while_one_more_token_raises_expected_tokens_per_second():
    config = DecodeConfig.of(schedule="goodput", goodput_model=tiny.GOODPUT_MODEL, gamma_max=5, min_draft_len=0)
    rule = goodput.rule_for(config)  # acceptance 0.05 + 0.9 c; t_draft 0.3; t_verify(k) = 1 + 0.1 k
    assert (rule.t_draft, rule.t_verify[:3]) == (0.3, (1.0, 1.1, 1.2))
    # By hand: after 0.95 (α .905) E = 1.905: 1.905 / 1.4 < (1.905 + .905²) / 1.8, go on; after 0.9
    # (α .86): 2.683 / 1.8 < 3.353 / 2.2, go on; after 0.2 (α .23): 2.862 / 2.2 > 2.904 / 2.6, stop,
    # keeping the third token (the rule decided against the fourth forward).
    assert draft_length(config, [0.95, 0.9, 0.2, 0.9]) == (3, "threshold")
    # Even a steady 0.95 stops: expected output grows slower than the time (α^k shrinks) ...
    assert draft_length(config, [0.95] * 6) == (4, "threshold")
    assert draft_length(config, [0.99] * 6) == (5, "gamma_max")  # ... unless acceptance is near-certain
    assert draft_length(config, [0.05, 0.9]) == (1, "threshold")
    assert draft_length(config.replace(min_draft_len=2), [0.05, 0.05, 0.05]) == (3, "threshold")
    # Replay's vectorised decisions are the engine's.
    scores = np.array([[[0.95, 0.9, 0.2, 0.9]]], dtype=np.float32)
    assert goodput.decisions(scores, rule)[0, 0].tolist() == [1.0, 1.0, 0.0, 0.0]


def test_a_goodput_policy_needs_a_readable_model(tmp_path):
    with pytest.raises(DsparkError, match="needs a goodput model"):
        DecodeConfig.of(schedule="goodput")
    broken = tmp_path / "goodput_model.json"
    broken.write_text("{not json")
    with pytest.raises(DsparkError, match="unreadable"):
        goodput.rule_for(DecodeConfig.of(schedule="goodput", goodput_model=str(tmp_path)))
    with pytest.raises(DsparkError, match="no goodput model"):
        goodput.rule_for(DecodeConfig.of(schedule="goodput", goodput_model=str(tmp_path / "missing.json")))


def synthetic_record(curve, P: int = 24, n: int = 200, g: int = 4, seed: int = 0) -> Record:
    """Drafted tokens accepted with probability curve(confidence), independently per step."""
    rng = np.random.default_rng(seed)
    continuation = rng.integers(10, 1000, size=(P, n))
    confidences = rng.random((P, n, g)).astype(np.float32)
    accepted = rng.random((P, n, g)) < curve(confidences)
    rollout = np.empty((P, n, g), dtype=np.int64)
    for k in range(g):
        ahead = np.full((P, n), -2)
        ahead[:, : n - k] = continuation[:, k:]
        rollout[:, :, k] = np.where(accepted[:, :, k], ahead, 5)  # 5 is never the continuation's
    return Record(continuation, np.full(P, n), rollout, {"top1": confidences, "margin": confidences ** 3}, (),
                  {"max_new_tokens": n, "topk": 5})


def test_the_fit_recovers_a_known_acceptance_curve():
    rec = synthetic_record(lambda c: c ** 2, P=60)
    fit = fit_record(rec)
    for c in (0.2, 0.5, 0.8, 0.95):
        assert fit.curves["top1"](c) == pytest.approx(c ** 2, abs=0.04)
        assert fit.curves["margin"](c ** 3) == pytest.approx(c ** 2, abs=0.04)  # any monotone metric
    quality = fit.quality["top1"]
    # Raw confidence overstates acceptance (c > c²): the fit is better calibrated, held out.
    assert quality["ece"] < 0.02 < 0.1 < quality["raw_ece"]
    assert quality["brier"] < quality["raw_brier"]
    tokens = drafted_tokens(rec.confidences, match_lengths(rec), rec.lengths)
    assert quality["tokens"] == (tokens["metric"] == "top1").sum() > 10_000
    assert AcceptanceFit.from_dict(fit.to_dict()).curves["top1"](0.5) == fit.curves["top1"](0.5)


def test_a_record_with_nan_confidences_still_fits():
    from test_replay import random_record

    rec = random_record(0)  # NaN and tied confidences, EOS in rollouts
    fit = fit_record(rec)
    assert all(np.isfinite(fit.curves[m](np.linspace(0, 1, 11))).all() for m in fit.curves)
    assert all(np.isfinite(q["brier"]) and np.isfinite(q["ece"]) for q in fit.quality.values())


def test_brier_and_ece_by_hand():
    probability, accepted = np.array([0.9, 0.9, 0.1, 0.1]), np.array([1, 0, 0, 0])
    assert brier(probability, accepted) == pytest.approx((0.01 + 0.81 + 0.01 + 0.01) / 4)
    assert ece(probability, accepted) == pytest.approx(0.5 * 0.4 + 0.5 * 0.1)


def test_export_of_a_run_without_a_record_says_what_the_engine_lacks(saved_pair, prompts_file, tmp_path):
    from typer.testing import CliRunner

    from dspark_bench.cli import app

    target, draft = saved_pair
    runner = CliRunner()
    args = ["run", "--target", target, "--draft", draft, "--dataset", str(prompts_file), "--limit", "1",
            "--max-new-tokens", "8", "--out", str(tmp_path)]
    ran = runner.invoke(app, args + ["--metric", "entropy", "--threshold", "0.4"])
    assert ran.exit_code == 0, ran.output
    (folder,) = tmp_path.iterdir()
    result = runner.invoke(app, ["export", str(folder), "--format", "hf"])
    assert result.exit_code != 0
    assert "the entropy metric" in result.output and "no replay record" in result.output
    assert not (folder / "export").exists()  # nothing written, the run untouched
    # A policy the engine expresses as it is exports from any run.
    fixed = runner.invoke(app, args + ["--schedule", "fixed", "--gamma-max", "3", "--out", str(tmp_path / "fixed")])
    assert fixed.exit_code == 0, fixed.output
    (folder,) = (tmp_path / "fixed").iterdir()
    result = runner.invoke(app, ["export", str(folder), "--format", "vllm"])
    assert result.exit_code == 0, result.output
    assert json.loads((folder / "export" / "speculative_config.json").read_text())["num_speculative_tokens"] == 3


def test_hf_assisted_generation_runs_the_exported_policy_round_for_round():
    """HF's own engine, under the HF rule export writes: its rounds (drafted, accepted) are replay's
    and our decoder's, and its output the target's own (the shipped pair, two code prompts)."""
    from types import SimpleNamespace

    from dspark_bench.decoding.autoregressive import hf_assistant_settings, hf_assisted_decode
    from dspark_bench.decoding.speculative import speculative_decode
    from dspark_bench.harness.models import load_pair
    from dspark_bench.measure.recording import record
    from dspark_bench.replay.simulate import simulate
    from dspark_bench.tasks import load_prompts
    from dspark_bench.tasks.prompts import encode

    pair = load_pair(device="cpu")
    prompts, _, _ = load_prompts("code", None, limit=2)
    ids = [encode(pair.tokenizer, p.text) for p in prompts]
    rec = record(SimpleNamespace(target=pair.target, draft=pair.draft, eos_ids=pair.eos_ids), ids, 40, 6)
    policies = [DecodeConfig.of(semantics="hf", threshold=0.3, gamma_max=6, min_draft_len=0, max_new_tokens=40),
                DecodeConfig.of(semantics="hf", threshold=0.7, gamma_max=3, min_draft_len=0, max_new_tokens=40),
                DecodeConfig.of(schedule="fixed", gamma_max=4, max_new_tokens=40)]
    for config in policies:
        replayed = simulate(rec, config)
        for p, prompt in enumerate(ids):
            hf = hf_assisted_decode(pair.target, pair.draft, prompt, config, pair.eos_ids)
            ours = speculative_decode(pair.target, pair.draft, prompt, config, pair.eos_ids)
            assert hf.tokens == ours.tokens == rec.continuation[p, : rec.lengths[p]].tolist()
            rounds = [(r.drafted, r.accepted) for r in hf.rounds]
            assert rounds == [(r.drafted, r.accepted) for r in ours.rounds] == [
                (r.drafted, r.accepted) for r in replayed[p]], config.label()
    # What `export --format hf` writes is what ran; HF's own settings are left as they were.
    assert hf_assistant_settings(policies[0]) == {"num_assistant_tokens": 6,
                                                  "num_assistant_tokens_schedule": "constant",
                                                  "assistant_confidence_threshold": 0.3}
    assert pair.draft.generation_config.num_assistant_tokens in (None, 20)

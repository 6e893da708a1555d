"""vLLM's adaptive verification (controllers.AdaptiveVerification, vllm-adaptive): its budget, its
admission, its acceptance estimator and its per-batch-size table decide as vLLM 0.34.0's own code
does, on vectors that code computed (tests/data/vllm_adaptive_vectors.json; docs/engine-controllers.md
says how they were made, and why vLLM is not imported here); and replay runs it as our decoders do,
every output the target's own."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.decoding import controllers
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.batched import batched_speculative
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.errors import DsparkError
from dspark_bench.measure.recording import record
from dspark_bench.replay.joint_walks import walk_controlled
from dspark_bench.replay.rounds import match_lengths
from dspark_bench.replay.simulate import simulate
from dspark_bench.replay.slots import unpriced
from dspark_bench.replay.step_prices import StepPrices

DATA = Path(__file__).parent / "data"
VECTORS = json.loads((DATA / "vllm_adaptive_vectors.json").read_text())
N, G = 40, 8
PROMPTS = [[0, 5, 9, 11], [7], [3, 3, 40, 2, 8, 100, 17], [12, 13], [50, 60, 70], [4, 4, 4, 4, 4]]


def test_the_budget_is_vllm_s():
    """get_num_tokens' budget on its own cases (prefill chunks, non-sampling rows, a logits cap among them)."""
    for case in VECTORS["budget"]:
        rows, plain = len(case["scheduled_drafts"]), sum(case["num_non_draft"])
        most = min(sum(case["scheduled_drafts"]), max(0, case["max_total_logits"] - rows * case["num_bonus_tokens"]))
        verify = case["verify_table"][plain : plain + most + 1]
        assert controllers.draft_budget(case["stale_conf"], case["scheduled_drafts"], case["draft_table"][rows],
                                        verify, sum(case["is_sampling"])) == case["draft_budget"], case


def test_the_admission_is_vllm_s():
    """_assign_draft_token_budget_kernel's split of a budget over the rows, ties included."""
    assert len(VECTORS["admit"]) >= 10
    for case in VECTORS["admit"]:
        assert controllers.admit_slots(case["live_conf_batch_order"], case["capacities"],
                                       case["budget"]) == case["admitted"], case


def test_the_estimator_learns_as_vllm_s_does():
    """OnlineAcceptanceEstimator's accumulate and refit kernels, step by step (refitting every 3 steps
    here, as the vectors were made), and its feature and prediction from a draft's logits."""
    spec = VECTORS["estimator"]
    estimator = controllers.AcceptanceEstimator(spec["num_steps"])
    estimator.REFIT_INTERVAL = spec["refit_interval_used"]
    refits = 0
    for step in spec["steps"]:
        for features, predictions, sampled, rejected in zip(step["features"], step["preds"], step["num_sampled"],
                                                            step["num_rejected"]):
            accepted = max(sampled - 1, 0)
            estimator.grade(features, predictions, accepted, accepted + rejected)
        before = estimator.slope
        estimator.step()
        refits += estimator.slope != before
        assert estimator.slope == pytest.approx(step["slope_after"], abs=1e-4)
        assert estimator.intercepts == pytest.approx(step["intercepts_after"], abs=1e-4)
    assert refits >= 2  # the slope moved: the refit ran, not only the accumulation
    for case in VECTORS["feature"]:  # rows of draft logits at a temperature each (0: greedy, read at 1)
        for logits, temperature, feature, confidence in zip(case["logits"], case["temperature"], case["feature"],
                                                            case["conf"]):
            scaled = np.asarray(logits, np.float64) / (temperature or 1.0)
            top1 = float(np.exp(scaled.max() - np.logaddexp.reduce(scaled)))
            assert controllers.log_odds(top1) == pytest.approx(feature, abs=1e-4)
            fitted = controllers.AcceptanceEstimator(1)
            fitted.slope, fitted.intercepts = case["slope"], [case["intercept"]]
            assert float(fitted.predict([feature])[0]) == pytest.approx(confidence, abs=1e-6)


def test_the_batch_size_table_is_vllm_s():
    """build_dynamic_sd_schedule_lookup's K for every batch size: gaps and the tail keep the K before,
    each at most num_speculative_tokens."""
    for case in VECTORS["dynamic_sd"]:
        text = ",".join(f"{first}-{last}:{k}" for first, last, k in case["schedule"])
        table = schedules.speculative_tokens_table(text)
        assert [schedules.table_length(table, rows, case["num_speculative_tokens"])
                for rows in range(1, case["max_num_seqs"] + 1)] == case["lookup"][1:], text


@pytest.mark.parametrize("text,message", [
    ("2-8:3", "must start at 1"), ("1-8:3,8-16:2", "not overlap"), ("1-8:-1", "K at least 0"),
    ("4-2:1", "first <= last"), ("1-8", "not first-last:K"),
])
def test_a_bad_table_is_refused_in_one_line(text, message, tmp_path):
    with pytest.raises(DsparkError, match=message) as refused:
        DecodeConfig.of(schedule=schedules.VLLM_ADAPTIVE, goodput_model=str(tmp_path),
                        num_speculative_tokens_per_batch_size=text)
    assert "\n" not in str(refused.value)


def test_it_needs_step_costs_and_the_draft_model():
    with pytest.raises(DsparkError, match="budgets each step with measured step costs: pass --goodput-model"):
        controllers.start(DecodeConfig.of(schedule=schedules.VLLM_ADAPTIVE))
    with pytest.raises(DsparkError, match="draft model's step costs, not the lookup drafter's"):
        DecodeConfig.of(schedule=schedules.VLLM_ADAPTIVE, goodput_model="x", drafter="lookup")
    with pytest.raises(DsparkError, match="early-stop"):
        DecodeConfig.of(schedule=schedules.VLLM_ADAPTIVE, goodput_model="x", draft_mode="verify-side")


def costs_file(folder: Path, growth: float) -> str:
    """A goodput model whose verify pass grows by `growth` of its cost a token: the budget trims drafts it doubts."""
    model = json.loads((DATA / "budget_goodput_model.json").read_text())
    model["costs"] = {str(b): {"t_draft": 0.2 * b**0.5, "t_verify": [b**0.5 * (1 + growth * k) for k in range(G + 1)]}
                      for b in (1, 8)}
    (folder / "goodput_model.json").write_text(json.dumps(model))
    return str(folder / "goodput_model.json")


@pytest.fixture(scope="module")
def costly(tmp_path_factory):
    return costs_file(tmp_path_factory.mktemp("vllm"), 0.4)


@pytest.fixture(scope="module")
def recorded(llama_pair):
    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=frozenset())
    return pair, record(pair, PROMPTS, N, G, topk=5)


def test_replay_runs_it_as_our_decoder_does(recorded, costly):
    """Batch 1, one controller running on across the prompts in order: the same rounds, the budget
    trimming some drafts and not others, every output the target's own."""
    pair, rec = recorded
    config = DecodeConfig.of(schedule=schedules.VLLM_ADAPTIVE, gamma_max=4, goodput_model=costly, max_new_tokens=N)
    state, rounds_seen = None, []
    for prompt, rounds in zip(PROMPTS, simulate(rec, config)):
        real = speculative_decode(pair.target, pair.draft, prompt, config, pair.eos_ids, controller=state)
        state = real.controller
        assert [(r.drafted, r.accepted, r.emitted, r.stop_reason, r.draft_tokens, r.target_token, r.draft_forwards)
                for r in rounds] == [(r.drafted, r.accepted, r.emitted, r.stop_reason, r.draft_tokens,
                                      r.target_token, r.draft_forwards) for r in real.rounds]
        assert real.tokens == autoregressive_decode(pair.target, prompt, config).tokens
        rounds_seen += rounds
    trimmed = [r for r in rounds_seen if r.stop_reason == "threshold"]
    assert trimmed and len(trimmed) < len(rounds_seen)  # the budget cut some drafts, not all
    assert all(r.drafted <= r.draft_forwards <= 4 for r in rounds_seen)  # it drafts K, and verifies at most that
    assert any(0 < r.drafted < 4 for r in trimmed) and any(r.drafted == 4 for r in rounds_seen)  # cut part-way too


@pytest.mark.parametrize("batch_size", [2, 3])
def test_a_batched_server_budgets_the_whole_batch(recorded, costly, batch_size):
    """At batch size B the budget is the batch's, spent on its most likely drafts: the output is the
    target's own, the rows verified different lengths, and replay's walk of the same server counts
    the decoder's rounds, drafts, acceptances and draft forwards."""
    pair, rec = recorded
    config = DecodeConfig.of(schedule=schedules.VLLM_ADAPTIVE, gamma_max=4, goodput_model=costly, max_new_tokens=N,
                             batch_size=batch_size, num_speculative_tokens_per_batch_size="1-1:4,2-8:3")
    requests = batched_speculative(pair.target, pair.draft, PROMPTS, config, batch_size)
    for request, prompt in zip(requests, PROMPTS):
        assert request.result.tokens == autoregressive_decode(pair.target, prompt, config).tokens
    rounds = [r for q in requests for r in q.result.rounds]
    assert len({r.drafted for r in rounds}) >= 2 and {3, 4} <= {r.draft_forwards for r in rounds}  # 4: one row left
    zeros = np.zeros(len(PROMPTS))
    free = StepPrices.flat(np.zeros(batch_size + 1), np.zeros((batch_size + 1, G + 1)))
    walked = walk_controlled(rec, config, free, unpriced(len(zeros)),
                             True, match_lengths(rec), zeros, zeros.copy(), zeros.copy())
    assert [walked[k] for k in ("rounds", "drafted_total", "accepted_total", "draft_forwards")] == [
        len(rounds), sum(r.drafted for r in rounds), sum(r.accepted for r in rounds),
        sum(r.draft_forwards for r in rounds)]


def test_log_odds_clamps_as_vllm_does():
    assert controllers.log_odds(1.0) == controllers.MAX_LOG_ODDS == -controllers.log_odds(0.0)
    assert controllers.log_odds(0.5) == 0.0 and math.isclose(controllers.log_odds(0.9), math.log(9))


def test_sampling_stays_lossless_when_it_trims(tmp_path):
    """Rejection sampling stays lossless when the budget trims drafts (a round's budget reads the
    request's previous round's drafts, so a second round after a rejection is trimmed or not by what
    the draft sampled): the first two tokens' distribution is the target's own."""
    import tiny
    from test_speculative import SMALL_VOCAB, chi_square_p, exact_first_two, sampled_first_two

    target = tiny.llama(vocab=SMALL_VOCAB, seed=3)
    draft = tiny.llama(layers=1, vocab=SMALL_VOCAB, seed=4)
    config = DecodeConfig.of(schedule=schedules.VLLM_ADAPTIVE, goodput_model=costs_file(tmp_path, 1.5),
                             temperature=1.0, top_p=0.9, gamma_max=3, max_new_tokens=3)
    reasons = {r.stop_reason for s in range(60)
               for r in speculative_decode(target, draft, [2, 4], config.replace(seed=s)).rounds}
    assert "threshold" in reasons and reasons - {"threshold"}  # some rounds trimmed, some not
    counts = sampled_first_two(target, draft, [2, 4], config, samples=1500)
    assert chi_square_p(counts, exact_first_two(target, [2, 4], config)) > 0.001


def test_replayed_from_a_sampled_record_it_is_the_real_process_in_expectation(tmp_path):
    """At temperature 0.5 on the Markov pair (tiny.markov_llama), as for SGLang's controller
    (tests/test_controllers.py): our decoder running vLLM's controller on across streams of requests and
    replay of a sampled record give the same expected rounds, drafts and acceptances (within 5 %),
    the budget trimming some rounds."""
    from test_controllers import served_and_replayed

    config = DecodeConfig.of(schedule=schedules.VLLM_ADAPTIVE, goodput_model=costs_file(tmp_path, 0.4), gamma_max=3,
                             max_new_tokens=8, temperature=0.5)
    decodes, real, replayed = served_and_replayed(config, 30_000)
    assert np.allclose(real, replayed, rtol=0.05), (real, replayed)
    reasons = {x.stop_reason for r in decodes for x in r}
    assert "threshold" in reasons and len(reasons) >= 2  # the budget trimmed some rounds, not all

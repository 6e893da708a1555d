"""The decoder's correctness: greedy output equals the target's own, sampling is lossless."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import tiny
import torch
from tiny import chi_square_p  # here too for the tests that import it from this file

from dspark_bench.config import DRAFT_MODES, METRICS, SCHEDULES, SEMANTICS, DecodeConfig
from dspark_bench.decoding import speculative
from dspark_bench.decoding.autoregressive import autoregressive_decode, hf_generate
from dspark_bench.decoding.proposal import draft_length
from dspark_bench.decoding.rules import at_depth, threshold_at
from dspark_bench.decoding.sampling import distribution
from dspark_bench.depth import round_depths
from dspark_bench.errors import DsparkError
from dspark_bench.harness.samples import sample_row

PROMPTS = [[0, 5, 9, 11], [7], [3, 3, 40, 2, 8, 100, 17]]


def policies(metric: str, schedule: str):
    for threshold, gamma_max, min_draft_len in itertools.product((0.15, 0.6), (1, 4), (0, 4)):
        if min_draft_len <= gamma_max:
            yield tiny.policy(
                metric=metric, schedule=schedule, threshold=threshold, threshold_start=threshold / 2,
                threshold_end=threshold, gamma_max=gamma_max, min_draft_len=min_draft_len, max_new_tokens=24,
                semantics=SEMANTICS[(gamma_max + min_draft_len) % len(SEMANTICS)])


@pytest.mark.parametrize("arch", ["llama_pair", "gpt2_pair"])
@pytest.mark.parametrize("metric,schedule", list(itertools.product(METRICS, SCHEDULES)))
def test_greedy_output_equals_target_greedy(arch, metric, schedule, request):
    target, draft = request.getfixturevalue(arch)
    accepted_any = rejected_any = False
    expected_by_prompt = {}
    for config in policies(metric, schedule):
        for prompt in PROMPTS[:2]:
            key = tuple(prompt)
            if key not in expected_by_prompt:
                expected_by_prompt[key] = autoregressive_decode(target, prompt, config).tokens
            expected = expected_by_prompt[key]
            result = speculative.speculative_decode(target, draft, prompt, config)
            assert result.tokens == expected, (config.label(), prompt)
            accepted_any |= any(r.accepted > 0 for r in result.rounds)
            rejected_any |= any(r.accepted < r.drafted for r in result.rounds)
    # The pair must exercise both paths, or equality would prove little.
    assert accepted_any and rejected_any


def test_eos_in_the_middle_of_a_draft(llama_pair):
    target, draft = llama_pair
    config = DecodeConfig.of(threshold=0.0, gamma_max=6, max_new_tokens=40)
    free = autoregressive_decode(target, PROMPTS[0], config).tokens
    eos = free[9]
    stop = free.index(eos)
    for draft_model in (draft, target):  # with target as draft, EOS is accepted inside a draft
        result = speculative.speculative_decode(target, draft_model, PROMPTS[0], config, frozenset({eos}))
        assert result.tokens == free[: stop + 1]
        assert sum(r.emitted for r in result.rounds) == len(result.tokens)
    rounds = speculative.speculative_decode(target, target, PROMPTS[0], config, frozenset({eos})).rounds
    assert rounds[-1].stop_reason == "eos" and rounds[-1].target_token == -1


def test_rounds_respect_bounds_and_add_up(llama_pair):
    target, draft = llama_pair
    for config in policies("top1", "threshold"):
        result = speculative.speculative_decode(target, draft, PROMPTS[2], config)
        produced = 0
        for r in result.rounds:
            budget = config.verification.max_new_tokens - produced - 1
            assert r.drafted <= min(config.stopping.gamma_max, budget)
            if config.stopping.semantics == "llamacpp":  # min_draft_len discards shorter drafts instead
                assert r.drafted == 0 or r.drafted >= config.stopping.min_draft_len
            elif r.stop_reason != "eos":
                assert r.drafted >= min(config.stopping.min_draft_len, budget)
            assert 0 <= r.accepted <= r.drafted
            assert r.emitted == r.accepted + 1
            assert r.draft_forwards >= r.drafted
            assert len(r.confidences) >= r.drafted
            produced += r.emitted
        assert produced == len(result.tokens) == config.verification.max_new_tokens
        row = sample_row(result, config)
        if row["drafted_total"]:  # (llama.cpp's rule may discard every draft: 0 / 0 acceptance)
            assert row["accepted_per_round"] == pytest.approx(row["avg_draft_len"] * row["acceptance_rate"])
        assert row["tokens_per_round"] == pytest.approx(row["accepted_per_round"] + 1)
        assert row["position_drafted"][0] == sum(r.drafted >= 1 for r in result.rounds)


def test_draft_equal_to_target_accepts_everything(llama_pair):
    target, _ = llama_pair
    config = DecodeConfig.of(schedule="fixed", gamma_max=4, max_new_tokens=27)
    result = speculative.speculative_decode(target, target, PROMPTS[0], config)
    row = sample_row(result, config)
    assert row["acceptance_rate"] == 1.0 and row["block_acceptance_rate"] == 1.0
    # Five rounds of 4 drafted + 1 bonus token; the last round has room for only 1 + 1.
    assert [r.drafted for r in result.rounds] == [4, 4, 4, 4, 4, 1]
    assert result.rounds[-1].stop_reason == "budget"


def test_seed_worked_example():
    config = DecodeConfig.of(gamma_max=5, threshold=0.7, min_draft_len=1)
    assert draft_length(config, [0.9, 0.85, 0.65, 0.99]) == (2, "threshold")
    assert draft_length(config.replace(min_draft_len=3), [0.9, 0.85, 0.65, 0.99, 0.1]) == (4, "threshold")
    assert draft_length(config, [0.9] * 8) == (5, "gamma_max")
    assert draft_length(config, [0.9] * 8, budget=3) == (3, "budget")
    cumulative = config.replace(schedule="cumulative")
    assert draft_length(cumulative, [0.9, 0.85, 0.65]) == (2, "threshold")  # 0.9·0.85 ≥ 0.7 > 0.9·0.85·0.65
    assert draft_length(cumulative, [0.9, 0.75, 0.99]) == (1, "threshold")  # 0.9·0.75 < 0.7
    assert draft_length(config.replace(schedule="fixed"), [0.01] * 8) == (5, "gamma_max")


def test_ramp_rises_linearly():
    config = DecodeConfig.of(schedule="ramp", threshold_start=0.2, threshold_end=0.6, gamma_max=5)
    assert [round(threshold_at(config, k), 6) for k in range(1, 6)] == [0.2, 0.3, 0.4, 0.5, 0.6]
    assert draft_length(config.replace(min_draft_len=0), [0.9, 0.35, 0.2]) == (2, "threshold")


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"threshold": 1.5}, r"threshold must be in \[0, 1\] \(got 1.5\)"),
        ({"gamma_max": 0}, "gamma_max"),
        ({"min_draft_len": 6, "gamma_max": 5}, "must not exceed"),
        ({"metric": "perplexity"}, "unknown confidence metric"),
        ({"temperature": -1.0}, "temperature"),
        ({"threshold_end": -0.1}, r"threshold_end must be in \[0, 1\] \(got -0.1\)"),
        ({"batch_quorum": 1.5}, r"batch_quorum must be in \[0, 1\] \(got 1.5\)"),
        ({"schedule": "depth"}, r"the depth schedule needs --depth-policy: a policy per depth bucket "
                                r"\(0-256, 256-1k, 1k-2k, 2k-4k, 4k\+\), e.g. 0.5/4,0.3/6,0.2/8"),
        ({"schedule": "depth", "depth_policy": "0.5/4;0.3/6"}, "depth_policy entry '0.5/4;0.3/6' is not "
                                                               "threshold/gamma_max"),
        ({"depth_policy": "0.5/4,1.5/6"}, r"depth_policy entry '1.5/6': its threshold must be in \[0, 1\]"),
        ({"depth_policy": "0.5/0"}, "depth_policy entry '0.5/0': its gamma_max must be at least 1"),
        ({"depth_policy": ",".join(["0.5/4"] * 6)}, "has 6 entries; there are 5 depth buckets"),
        ({"schedule": "depth", "depth_policy": "0.5/2,0.3/6", "min_draft_len": 3},
         r"min_draft_len \(3\) must not exceed the depth policy's smallest gamma_max, 2"),
    ],
)
def test_config_refuses_bad_values(changes, message):
    with pytest.raises(DsparkError, match=message):
        DecodeConfig.of(**changes)


def test_a_depth_policy_is_its_buckets_threshold_policies():
    config = DecodeConfig.of(schedule="depth", depth_policy="0.5/4, 0.3/6,0.3/6", min_draft_len=0, gamma_max=2)
    assert config.stopping.gamma_max == 6  # derived: the largest bucket's (a caller's 2 is not the policy's)
    assert config.stopping.depth_policy == "0.5/4,0.3/6"  # the trailing repeat is implied
    assert config.label() == "top1 depth 0.5/4·0.3/6 min0"
    rounds = [at_depth(config, depth).stopping for depth in (0, 255, 256, 1023, 5000)]
    assert [(p.schedule, p.threshold, p.gamma_max, p.min_draft_len) for p in rounds] == [
        ("threshold", 0.5, 4, 0), ("threshold", 0.5, 4, 0)] + [("threshold", 0.3, 6, 0)] * 3
    assert DecodeConfig.of(depth_policy="0.5/4").stopping.depth_policy == ""  # only the depth schedule reads it
    plain = DecodeConfig.of(threshold=0.4)
    assert at_depth(plain, 5000) is plain  # any other schedule: the policy itself


def test_the_depth_schedule_runs_each_rounds_bucket_and_keeps_the_targets_output(llama_pair):
    """A 230-token prompt and 48 new tokens cross depth 256: rounds before it draft 2 tokens whatever
    their confidence (threshold 0, γ_max 2), rounds after it up to 6 at threshold 0.3. Greedy output is
    the target's own on the host's rule and on the device's (verify-side)."""
    target, draft = llama_pair
    prompt = [int(i) for i in np.random.default_rng(0).integers(2, tiny.VOCAB, 230)]
    config = DecodeConfig.of(schedule="depth", depth_policy="0/2,0.3/6", max_new_tokens=48)
    expected = autoregressive_decode(target, prompt, config).tokens
    for draft_mode in DRAFT_MODES:
        result = speculative.speculative_decode(target, draft, prompt, config.replace(draft_mode=draft_mode))
        assert result.tokens == expected, draft_mode
        depths = round_depths(len(prompt), [r.emitted for r in result.rounds])
        shallow = [r for r, depth in zip(result.rounds, depths) if depth < 256]
        deep = [r for r, depth in zip(result.rounds, depths) if depth >= 256]
        assert len(shallow) >= 8 and len(deep) >= 8
        assert all((r.drafted, r.stop_reason) == (2, "gamma_max") for r in shallow)
        assert all(r.drafted <= 6 for r in deep) and max(r.drafted for r in deep) > 2  # a bucket ignored fails here
        assert {r.stop_reason for r in deep} >= {"threshold"}  # 0.3, not the shallow bucket's 0


def test_hf_generate_peer_agrees_with_baseline(llama_pair):
    target, _ = llama_pair
    config = DecodeConfig.of(max_new_tokens=20)
    plain = autoregressive_decode(target, PROMPTS[0], config)
    peer = hf_generate(target, PROMPTS[0], config)
    assert peer.tokens == plain.tokens and peer.target_forwards == plain.target_forwards - 1  # + 1 from the prefill
    # Assisted by a copy of itself, drafts are accepted: fewer target passes than tokens.
    assisted = hf_generate(target, PROMPTS[0], config, assistant=copy.deepcopy(target))
    assert assisted.tokens == plain.tokens and 0 < assisted.target_forwards < len(plain.tokens) - 1


# --- sampling: lossless rejection sampling ---------------------------------------------------

SMALL_VOCAB = 6
SAMPLES = 2000  # enough for a chi-square over 36 cells to catch the broken rules below


def exact_first_two(target, prompt, config) -> np.ndarray:
    """The target's own joint distribution of its first two sampled tokens [vocab * vocab]."""
    with torch.inference_mode():
        first = distribution(target(torch.tensor([prompt])).logits[0, -1], config)
        joint = []
        for x in range(SMALL_VOCAB):
            second = distribution(target(torch.tensor([prompt + [x]])).logits[0, -1], config)
            joint.append(first[x] * second)
    return torch.stack(joint).flatten().double().numpy()


def sampled_first_two(target, draft, prompt, config, samples: int = SAMPLES) -> np.ndarray:
    counts = np.zeros(SMALL_VOCAB * SMALL_VOCAB)
    for seed in range(samples):
        tokens = speculative.speculative_decode(target, draft, prompt, config.replace(seed=seed)).tokens
        counts[tokens[0] * SMALL_VOCAB + tokens[1]] += 1
    return counts


def make_sampling_setup(kind: str):
    target = tiny.llama(vocab=SMALL_VOCAB, seed=3)
    draft = tiny.llama(layers=1, vocab=SMALL_VOCAB, seed=4)  # independent: q differs from p
    if kind == "two-drafted":
        # Three new tokens let one round draft both of the first two (gamma_max 3, budget 2).
        config = DecodeConfig.of(temperature=1.0, top_p=0.9, threshold=0.0, gamma_max=3, max_new_tokens=3)
    else:
        # One drafted token: whenever it is accepted, the second token is the target's bonus.
        config = DecodeConfig.of(temperature=0.7, threshold=0.0, gamma_max=1, max_new_tokens=2)
    prompt = [2, 4]
    return target, draft, prompt, config, exact_first_two(target, prompt, config)


@pytest.fixture(scope="module", params=["two-drafted", "bonus"])
def sampling_setup(request):
    return make_sampling_setup(request.param)


@pytest.fixture(scope="module")
def two_drafted_setup():
    return make_sampling_setup("two-drafted")


def test_sampling_matches_target_distribution(sampling_setup):
    target, draft, prompt, config, exact = sampling_setup
    counts = sampled_first_two(target, draft, prompt, config)
    assert chi_square_p(counts, exact) > 0.001


@pytest.mark.parametrize("broken", ["always_accept", "resample_from_target"])
def test_sampling_test_catches_a_wrong_rule(two_drafted_setup, monkeypatch, broken):
    target, draft, prompt, config, exact = two_drafted_setup
    if broken == "always_accept":
        monkeypatch.setattr(speculative, "acceptance_probability", lambda p, q: 1.0)
    else:  # the classic bug: on rejection, draw from p instead of norm(max(p - q, 0))
        monkeypatch.setattr(speculative, "residual_distribution", lambda p, q: p)
    counts = sampled_first_two(target, draft, prompt, config, samples=SAMPLES // 2)
    assert chi_square_p(counts, exact) < 1e-4

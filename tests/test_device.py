"""The device-side decoder: how often it waits for the device, and verify-side truncation.

No GPU is needed to count host syncs: every read of a tensor's value in the decoders goes
through host.fetch, which counts; a stray read elsewhere (`.item()`, `int(t)`, `.tolist()`, ...)
would be caught by `stray_reads`, which watches every such call not made from host.py.
"""

from __future__ import annotations

import sys

import pytest
import tiny
import torch
from test_speculative import chi_square_p, sampled_first_two

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding import host, speculative

READS = ("tolist", "item", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")


@pytest.fixture
def stray_reads(monkeypatch) -> list[str]:
    """Every read of a tensor's value made outside host.fetch, by name."""
    seen: list[str] = []
    for name in READS:
        original = getattr(torch.Tensor, name)

        def watched(self, *args, _original=original, _name=name, **kwargs):
            if sys._getframe(1).f_code.co_filename != host.__file__:
                seen.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, watched)
    return seen


POLICIES = {
    "threshold": DecodeConfig.of(threshold=0.6, gamma_max=5, min_draft_len=0, max_new_tokens=40),
    "cumulative, HF's rule": DecodeConfig.of(schedule="cumulative", threshold=0.3, gamma_max=4, semantics="hf",
                                          max_new_tokens=40),
    "goodput": tiny.policy(schedule="goodput", metric="entropy", gamma_max=6, max_new_tokens=40),
}


@pytest.fixture
def host_copies(monkeypatch) -> list[str]:
    """Every tensor the decoder builds from host data (`torch.tensor`): on CUDA a blocking copy
    waits for the queued work like a read, so the engine may make them per decode, not per round."""
    made: list[str] = []
    original = torch.tensor

    def watched(*args, **kwargs):
        caller = sys._getframe(1).f_code.co_filename
        if "dspark_bench" in caller:
            made.append(caller)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", watched)
    return made


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("name", POLICIES)
def test_verify_side_syncs_once_per_round(llama_pair, stray_reads, host_copies, name, temperature):
    target, draft = llama_pair
    config = POLICIES[name].replace(temperature=temperature)
    counts = {}
    for mode in ("early-stop", "verify-side"):
        with host.counting() as count:
            result = speculative.speculative_decode(target, draft, [3, 9, 27], config.replace(draft_mode=mode))
        counts[mode] = (count.fetches, result)
    fetches, result = counts["verify-side"]
    assert fetches == len(result.rounds) > 5  # the round's one read: accepted, target token, the draft
    assert len(host_copies) <= 12  # per decode (prefills, EOS ids, the rule's constants), never per round: 2 decodes
    assert any(r.drafted < r.draft_forwards for r in result.rounds)  # the rule did cut drafts on the device
    fetches, result = counts["early-stop"]
    assert fetches == result.draft_forwards + len(result.rounds)  # + one per draft step: whether to go on
    assert stray_reads == []


def test_stray_reads_are_seen(llama_pair, stray_reads):
    """The watch itself works: the plain baseline reads each token it feeds back."""
    from dspark_bench.decoding.autoregressive import autoregressive_decode

    target, _ = llama_pair
    with host.counting() as count:
        result = autoregressive_decode(target, [1, 2], DecodeConfig.of(max_new_tokens=5))
    assert count.fetches == len(result.tokens) and stray_reads == []
    float(torch.ones(()))
    assert stray_reads == ["__float__"]


@pytest.fixture(scope="module")
def cutting_setup():
    """Test_engine's sampling setup with a threshold that cuts drafts, so truncation on the
    device decides which tokens can be accepted."""
    from test_speculative import make_sampling_setup

    target, draft, prompt, config, exact = make_sampling_setup("two-drafted")
    return target, draft, prompt, config.replace(threshold=0.7, min_draft_len=0, draft_mode="verify-side"), exact


def test_verify_side_sampling_matches_target_distribution(cutting_setup):
    target, draft, prompt, config, exact = cutting_setup
    cut = [r for seed in range(50) for r in speculative.speculative_decode(
        target, draft, prompt, config.replace(seed=seed)).rounds if r.drafted < r.draft_forwards]
    assert cut  # truncation happens in this setup
    assert chi_square_p(sampled_first_two(target, draft, prompt, config), exact) > 0.001


def test_verify_side_sampling_test_catches_a_wrong_rule(cutting_setup, monkeypatch):
    target, draft, prompt, config, exact = cutting_setup
    monkeypatch.setattr(speculative, "residual_distribution", lambda p, q: p)
    assert chi_square_p(sampled_first_two(target, draft, prompt, config, samples=1000), exact) < 1e-4


@pytest.mark.parametrize("arch", ["llama_pair", "gpt2_pair"])
def test_compiled_steps_decode_the_target_greedy(arch, request, monkeypatch):
    """The compiled path: a static cache rolled back by length and reused across decodes, every
    step but the prefill through torch.compile. Dynamo's "eager" backend traces and guards the
    model as inductor would but generates no code, so this runs in seconds on a CPU."""
    from dspark_bench.decoding import cached_lm as cache
    from dspark_bench.decoding.autoregressive import autoregressive_decode

    monkeypatch.setitem(cache.COMPILE_OPTIONS, "backend", "eager")
    target, draft = request.getfixturevalue(arch)
    for prompt in ([3, 9, 27], [5, 1, 4, 1, 5, 9, 2, 6]):
        for mode in ("early-stop", "verify-side"):
            config = DecodeConfig.of(threshold=0.5, gamma_max=4, max_new_tokens=30, draft_mode=mode)
            expected = autoregressive_decode(target, prompt, config).tokens
            compiled = config.replace(compiled=True)
            result = speculative.speculative_decode(target, draft, prompt, compiled)
            assert result.tokens == expected == autoregressive_decode(target, prompt, compiled).tokens
            assert any(r.accepted < r.drafted for r in result.rounds)  # rollbacks happened
    def single(model):  # the batch-1 caches (the shared fixtures may hold batched ones too: test_static_batch)
        return {key: held for key, held in cache._STATIC[model].items() if key[1] == 1}

    (held, size), = single(target).values()  # one static cache per model and role, reused
    assert set(single(draft)) == {("draft", 1)} and size >= 30 + 8 + 4 + 1
    with torch.inference_mode():
        assert cache.static_cache(target, 40) is held
    # A model drafting for itself holds two caches (one per role), which must not collide.
    config = DecodeConfig.of(threshold=0.5, gamma_max=4, max_new_tokens=20, compiled=True)
    itself = speculative.speculative_decode(target, target, [3, 9, 27], config)
    assert itself.tokens == autoregressive_decode(target, [3, 9, 27], config).tokens
    assert all(r.accepted == r.drafted for r in itself.rounds)
    assert set(single(target)) == {("target", 1), ("draft", 1)}


def test_compiled_rollback_needs_no_crop_of_the_static_layers(llama_pair, monkeypatch):
    """transformers 5.17 (the H200's) has static cache layers without `crop`: the compiled
    decode broke there on its first rollback. The rollback moves each layer's length itself."""
    from transformers.cache_utils import StaticLayer

    from dspark_bench.decoding import cached_lm as cache
    from dspark_bench.decoding.autoregressive import autoregressive_decode

    monkeypatch.setitem(cache.COMPILE_OPTIONS, "backend", "eager")
    if hasattr(StaticLayer, "crop"):
        monkeypatch.delattr(StaticLayer, "crop")
    target, draft = llama_pair
    config = DecodeConfig.of(threshold=0.5, gamma_max=4, max_new_tokens=30, compiled=True)
    result = speculative.speculative_decode(target, draft, [5, 1, 4, 1, 5, 9, 2, 6], config)
    assert any(r.accepted < r.drafted for r in result.rounds)  # rollbacks happened
    assert result.tokens == autoregressive_decode(target, [5, 1, 4, 1, 5, 9, 2, 6],
                                                  config.replace(compiled=False)).tokens


def test_verify_side_refuses_batches():
    assert DecodeConfig.of(compiled=True, batch_size=4).verification.compiled  # captured batches: static_batch_lm.py
    with pytest.raises(Exception, match="batch size 1 only"):
        DecodeConfig.of(draft_mode="verify-side", batch_size=4)


def test_identical_share_and_first_divergence():
    from dspark_bench.harness.samples import first_divergence, identical_share

    assert identical_share([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0 and first_divergence([1, 2], [1, 2]) is None
    # after a near-tie the outputs part and mostly stay apart: 2 of 4 positions still agree
    assert identical_share([1, 2, 9, 4], [1, 2, 3, 5]) == 0.5 and first_divergence([1, 2, 9, 4], [1, 2, 3, 5]) == 2
    assert identical_share([1, 2], [1, 2, 3, 4]) == 0.5  # a shorter output counts its missing tokens


def test_the_device_rule_cuts_where_the_host_rule_stops(tmp_path):
    """rules.DeviceRule (verify-side) against proposal.Proposal (the host's rule, token by token)
    on random drafts with EOS in them, for every schedule and engine rule, goodput with awkward
    step costs and a many-knot curve (float64 throughout, or near-ties would part them)."""
    import json
    from pathlib import Path

    import numpy as np

    from dspark_bench.decoding.proposal import Proposal
    from dspark_bench.decoding.rules import DeviceRule
    from dspark_bench.replay.simulate import spanning_policies

    model = json.loads(Path(tiny.GOODPUT_MODEL).read_text())
    knots = np.linspace(0, 1, 9)
    for curve in model["acceptance"]["curves"].values():
        curve.update(x=knots.tolist(), y=(0.05 + 0.9 * knots ** 1.7).tolist())
    for costs in model["costs"].values():
        costs.update(t_draft=0.0123456789, t_verify=[0.1 + 0.0371 * k ** 1.3 for k in range(len(costs["t_verify"]))])
    path = tmp_path / "goodput_model.json"
    path.write_text(json.dumps(model))
    rng = np.random.default_rng(0)
    seen = set()
    for config in spanning_policies(6, 40, str(path)):
        rule = DeviceRule(config, torch.device("cpu"))
        for _ in range(60):
            n = config.stopping.gamma_max
            scores = torch.tensor(rng.uniform(0, 1, n), dtype=torch.float32)
            tokens = torch.tensor(rng.integers(0, 12, n))  # id 0 is EOS
            proposal = Proposal.start(config, n)
            proposal.walk(config, tokens.tolist(), scores.tolist(), frozenset({0}))
            assert int(rule.kept(scores, tokens, torch.tensor([0]))) == len(proposal.tokens), config.label()
            seen.add((config.stopping.schedule, proposal.stop_reason))
    assert {("goodput", "threshold"), ("goodput", "gamma_max"), ("goodput", "eos")} <= seen

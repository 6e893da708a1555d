"""Timed replay (measure/timed.py): the rounds replay says a policy makes, run on real passes. On
the pair that made the record, each round's draft and acceptance as those passes compute them
are the forced ones, for every schedule; on another pair the rounds still run, with the record's
acceptance."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import tiny
from test_batched import GREEDY_POLICIES, PROMPTS, N

from dspark_bench.decoding.cached_lm import CachedLM
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.errors import DsparkError
from dspark_bench.measure.recording import record
from dspark_bench.measure.timed import timed_plain, timed_replay
from dspark_bench.replay.simulate import simulate


@pytest.fixture(scope="module")
def recorded(llama_pair):
    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=frozenset({1}))
    return pair, record(pair, PROMPTS, N, 5, topk=5, eos_ids=pair.eos_ids)


def passes(monkeypatch, pair) -> list:
    """Every CachedLM pass from now on: (which model, tokens fed, logits kept)."""
    seen, forward = [], CachedLM.forward

    def logged(lm, tokens, keep=1, eager=False):
        seen.append(("target" if lm.model is pair.target else "draft", len(tokens), keep))
        return forward(lm, tokens, keep, eager)

    monkeypatch.setattr(CachedLM, "forward", logged)
    return seen


@pytest.mark.parametrize("config", GREEDY_POLICIES, ids=lambda c: c.label())
def test_the_forced_rounds_are_the_rounds_the_passes_make(recorded, config, monkeypatch):
    pair, rec = recorded
    forced = passes(monkeypatch, pair)
    timed = timed_replay(pair, rec, PROMPTS, config)
    forced_passes = list(forced)
    forced.clear()
    decoded_all = [speculative_decode(pair.target, pair.draft, prompt, config, pair.eos_ids) for prompt in PROMPTS]
    # The same passes, of the same shapes, in the same order as the decoder's own (prefills too).
    assert forced_passes == forced
    for prompt, run, rounds, decoded in zip(PROMPTS, timed, simulate(rec, config), decoded_all):
        assert run.tokens == decoded.tokens  # the target's own greedy output
        assert run.accepted == run.forced == [r.accepted for r in decoded.rounds]
        assert run.drafted == [r.draft_tokens for r in rounds]
        assert run.seconds > 0


def test_another_pair_runs_the_record_s_rounds(recorded):
    _, rec = recorded
    target = tiny.llama(seed=7)
    other = SimpleNamespace(target=target, draft=tiny.noisy_copy(target, 0.5))
    config = GREEDY_POLICIES[0]
    timed = timed_replay(other, rec, PROMPTS, config)
    assert [run.forced for run in timed] == [[r.accepted for r in rounds] for rounds in simulate(rec, config)]
    assert [len(run.tokens) for run in timed] == rec.lengths.tolist()  # the record's tokens, committed


def test_timed_replay_refuses_what_it_cannot_force(recorded):
    pair, rec = recorded
    with pytest.raises(DsparkError, match="needs the record's 6 prompts"):
        timed_replay(pair, rec, PROMPTS[:2], GREEDY_POLICIES[0])
    with pytest.raises(DsparkError, match="greedy record's rounds"):
        timed_replay(pair, rec, PROMPTS, GREEDY_POLICIES[0].replace(temperature=1.0))
    for change, what in (({"draft_mode": "verify-side"}, "verify-side"), ({"batch_size": 2}, "batch size above 1")):
        with pytest.raises(DsparkError, match=f"decoder's passes, not .*{what}"):
            timed_replay(pair, rec, PROMPTS, GREEDY_POLICIES[0].replace(**change))


def test_compiled_passes_force_the_same_rounds(recorded, monkeypatch):
    """The passes the decoder runs on CUDA by default (compiled; dynamo's eager backend here):
    every round's acceptance as they compute it is still the forced one."""
    from dspark_bench.decoding import cached_lm

    monkeypatch.setitem(cached_lm.COMPILE_OPTIONS, "backend", "eager")
    pair, rec = recorded
    config = GREEDY_POLICIES[0].replace(compiled=True)
    timed = timed_replay(pair, rec, PROMPTS, config)
    assert [run.accepted for run in timed] == [run.forced for run in timed]
    assert all(same for _, same in timed_plain(pair, rec, PROMPTS, compiled=True))


def test_plain_decoding_is_timed_on_the_record_s_tokens(recorded):
    pair, rec = recorded
    timed = timed_plain(pair, rec, PROMPTS)
    assert len(timed) == len(PROMPTS) and all(seconds > 0 and same for seconds, same in timed)
    target = tiny.llama(seed=7)  # another target chooses other tokens, and is timed all the same
    assert not all(same for _, same in timed_plain(SimpleNamespace(target=target), rec, PROMPTS))

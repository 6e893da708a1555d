"""Batched decoding: every row is what that prompt decoded alone gives, whatever its neighbours.

Prompts of different lengths share a batch (left holes, per-row positions and masks), rows
leave as they finish and the longest prompt joins a running batch last (the cache grows on the
left for it). fp32 on CPU: identity is exact, so any difference is a bug.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from dspark_bench.baselines import autoregressive_decode
from dspark_bench.batch_cache import BatchLM
from dspark_bench.batched import batched_autoregressive, batched_speculative
from dspark_bench.config import METRICS, SCHEDULES, DecodeConfig
from dspark_bench.engine import speculative_decode
from dspark_bench.replay import record, simulate

from test_engine import chi_square_p, make_sampling_setup

PROMPTS = [[2, 5, 7], [9], [11, 3, 4, 5, 6], [4, 8], [15, 16, 23, 42], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]]
N = 14


def rounds_of(result) -> list[tuple]:
    return [(r.drafted, r.accepted, r.emitted, r.stop_reason, r.draft_tokens, r.target_token, r.draft_forwards)
            for r in result.rounds]


GREEDY_POLICIES = [DecodeConfig(metric=metric, schedule=schedule, threshold=0.4, threshold_start=0.2, threshold_end=0.6,
                                 gamma_max=4, min_draft_len=0, max_new_tokens=N)
                   for metric, schedule in itertools.product(METRICS, SCHEDULES)]


@pytest.fixture(scope="module")
def decoded_alone():
    """Each policy's batch-1 decode of each prompt, per pair (shared by the batch sizes)."""
    cache = {}

    def alone(name, target, draft, eos):
        if name not in cache:
            cache[name] = [[speculative_decode(target, draft, p, config, eos) for p in PROMPTS]
                           for config in GREEDY_POLICIES]
        return cache[name]

    return alone


@pytest.mark.parametrize("arch", ["llama_pair", "gpt2_pair"])
@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_batched_greedy_rows_equal_each_prompt_alone(arch, batch_size, request, decoded_alone):
    target, draft = request.getfixturevalue(arch)
    eos = frozenset({1})
    checked = 0
    for config, alone in zip(GREEDY_POLICIES, decoded_alone(arch, target, draft, eos)):
        metric, schedule = config.metric, config.schedule
        together = batched_speculative(target, draft, PROMPTS, config, batch_size, eos)
        for single, row in zip(alone, together):
            assert row.result.tokens == single.tokens, (metric, schedule)
            assert rounds_of(row.result) == rounds_of(single), (metric, schedule)
            checked += 1
    plain = DecodeConfig(max_new_tokens=N)
    baseline = [autoregressive_decode(target, p, plain, eos).tokens for p in PROMPTS]
    assert [r.result.tokens for r in batched_autoregressive(target, PROMPTS, plain, batch_size, eos)] == baseline
    assert [r.result.tokens for r in together] == baseline  # the last policy's rows: the target's own text
    assert checked == len(METRICS) * len(SCHEDULES) * len(PROMPTS)


def test_drained_batches_decode_the_same(llama_pair):
    target, draft = llama_pair
    config = DecodeConfig(threshold=0.3, gamma_max=3, max_new_tokens=N)
    refilled = batched_speculative(target, draft, PROMPTS, config, 4, refill=True)
    drained = batched_speculative(target, draft, PROMPTS, config, 4, refill=False)
    assert [r.result.tokens for r in refilled] == [r.result.tokens for r in drained]
    # Draining: the last two prompts wait for the first four to finish; refilling: one does not.
    assert min(r.admitted for r in drained[4:]) >= max(r.finished for r in drained[:4])
    assert min(r.admitted for r in refilled[4:]) < max(r.finished for r in refilled[:4])


def test_time_shares_add_up_to_the_run(llama_pair):
    target, draft = llama_pair
    config = DecodeConfig(threshold=0.3, gamma_max=3, max_new_tokens=N)
    requests = batched_speculative(target, draft, PROMPTS, config, 3)
    wall = max(r.finished for r in requests) - min(r.admitted for r in requests)
    shares = sum(r.time_s for r in requests)
    assert 0.9 * wall <= shares <= wall * 1.0001
    assert all(r.latency_per_token > 0 for r in requests)


def test_replay_predicts_every_row_of_a_batch(llama_pair):
    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=frozenset())
    rec = record(pair, PROMPTS, N, 5, topk=5)
    for config in (DecodeConfig(metric="entropy", threshold=0.5, gamma_max=5, max_new_tokens=N),
                   DecodeConfig(schedule="cumulative", threshold=0.2, gamma_max=4, min_draft_len=0, max_new_tokens=N),
                   DecodeConfig(schedule="fixed", gamma_max=5, max_new_tokens=N)):
        simulated = simulate(rec, config)
        for batch_size in (3, 8):
            rows = batched_speculative(target, draft, PROMPTS, config, batch_size)
            assert [rounds_of(r.result) for r in rows] == [
                [(s.drafted, s.accepted, s.emitted, s.stop_reason, s.draft_tokens, s.target_token, s.draft_forwards)
                 for s in rounds] for rounds in simulated]


def test_holes_are_compacted_away(llama_pair):
    target, _ = llama_pair
    lm = BatchLM(target)
    for prompt in PROMPTS[:3]:
        lm.add(prompt[:-1])
    for _ in range(12):  # feed 4 tokens per row, keep 1: three holes per row per step
        lm.forward([[5, 6, 7, 8]] * lm.rows)
        for row in range(lm.rows):
            lm.rollback(row, lm.lengths[row] - 3)
        lm.tidy()
    assert lm.mask.sum(dim=1).tolist() == lm.lengths
    assert lm.mask.shape[1] <= 8 + max(lm.lengths) * 5 // 4 + 4


def test_batched_sampling_equals_each_prompt_sampled_alone(llama_pair):
    target, draft = llama_pair
    config = DecodeConfig(temperature=0.9, top_p=0.95, threshold=0.3, gamma_max=4, max_new_tokens=N)
    alone = [speculative_decode(target, draft, p, config).tokens for p in PROMPTS]
    assert [r.result.tokens for r in batched_speculative(target, draft, PROMPTS, config, 3)] == alone


@pytest.mark.parametrize("kind", ["two-drafted", "bonus"])
def test_batched_sampling_matches_target_distribution(kind):
    target, draft, prompt, config, exact = make_sampling_setup(kind)
    samples = 2000
    rows = batched_speculative(target, draft, [prompt] * samples, config, 8, seeds=list(range(samples)))
    counts = np.zeros(len(exact))
    for row in rows:
        counts[row.result.tokens[0] * int(np.sqrt(len(exact))) + row.result.tokens[1]] += 1
    assert chi_square_p(counts, exact) > 0.001

"""Batched decoding: every row is what that prompt decoded alone gives, whatever its neighbours.

Prompts of different lengths share a batch (left holes, per-row positions and masks), rows
leave as they finish and the longest prompt joins a running batch last (the cache grows on the
left for it). fp32 on CPU: identity is exact, so any difference is a bug.
"""

from __future__ import annotations

import dataclasses
import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import tiny
from test_speculative import chi_square_p, make_sampling_setup

from dspark_bench import schedules
from dspark_bench.config import METRICS, SCHEDULES, SEMANTICS, DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.batch_lm import BatchLM
from dspark_bench.decoding.batched import (
    AutoregressiveStep,
    SpeculativeStep,
    autoregressive_serving,
    batched_autoregressive,
    batched_speculative,
    interleave,
    serve,
    speculative_serving,
)
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.errors import DsparkError
from dspark_bench.measure.recording import record
from dspark_bench.replay.batched import predict_batched
from dspark_bench.replay.cost import CostModel, CostSurface
from dspark_bench.replay.simulate import simulate, simulate_grid, spanning_policies

PROMPTS = [[2, 5, 7], [9], [11, 3, 4, 5, 6], [4, 8], [15, 16, 23, 42], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]]
N = 14


def rounds_of(result) -> list[tuple]:
    return [(r.drafted, r.accepted, r.emitted, r.stop_reason, r.draft_tokens, r.target_token, r.draft_forwards)
            for r in result.rounds]


# Each row decides alone (budget: test_budget.py; an engine's controller, one for the batch: test_controllers.py).
ROW_SCHEDULES = [s for s in SCHEDULES if not schedules.named(s).whole_batch and not schedules.named(s).controlled]
GREEDY_POLICIES = [tiny.policy(metric=metric, schedule=schedule, threshold=0.4, threshold_start=0.2,
                                                threshold_end=0.6, gamma_max=4, min_draft_len=i % 3, max_new_tokens=N,
                                                semantics=SEMANTICS[i % len(SEMANTICS)])
                   for i, (metric, schedule) in enumerate(itertools.product(METRICS, ROW_SCHEDULES))]


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
        metric, schedule = config.stopping.metric, config.stopping.schedule
        together = batched_speculative(target, draft, PROMPTS, config, batch_size, eos)
        for single, row in zip(alone, together):
            assert row.result.tokens == single.tokens, (metric, schedule)
            assert rounds_of(row.result) == rounds_of(single), (metric, schedule)
            checked += 1
    plain = DecodeConfig.of(max_new_tokens=N)
    baseline = [autoregressive_decode(target, p, plain, eos).tokens for p in PROMPTS]
    assert [r.result.tokens for r in batched_autoregressive(target, PROMPTS, plain, batch_size, eos)] == baseline
    assert [r.result.tokens for r in together] == baseline  # the last policy's rows: the target's own text
    assert checked == len(METRICS) * len(ROW_SCHEDULES) * len(PROMPTS)


def test_a_depth_policys_rows_each_run_their_own_depth(llama_pair):
    """Each row's round runs its own depth bucket's policy: prompts of 240, 250 and 20 tokens, batched
    with 30 new tokens each, two rows crossing depth 256 while the third never reaches it, decode as
    each alone."""
    target, draft = llama_pair
    rng = np.random.default_rng(2)
    prompts = [[int(i) for i in rng.integers(2, tiny.VOCAB, n)] for n in (240, 250, 20)]
    config = DecodeConfig.of(schedule="depth", depth_policy="0/2,0.3/5", max_new_tokens=30)
    together = batched_speculative(target, draft, prompts, config, 3)
    for prompt, row in zip(prompts, together):
        assert rounds_of(row.result) == rounds_of(speculative_decode(target, draft, prompt, config))
    shallow = together[2].result.rounds  # threshold 0, γ_max 2 (but the last rounds, cut by the budget)
    assert {(r.drafted, r.stop_reason) for r in shallow[:-2]} == {(2, "gamma_max")}
    deep = [r for row in together[:2] for r in row.result.rounds]
    assert "threshold" in {r.stop_reason for r in deep} and max(r.drafted for r in deep) > 2  # the deep bucket's


def test_drained_batches_decode_the_same(llama_pair):
    target, draft = llama_pair
    config = DecodeConfig.of(threshold=0.3, gamma_max=3, max_new_tokens=N)
    refilled = batched_speculative(target, draft, PROMPTS, config, 4, refill=True)
    drained = batched_speculative(target, draft, PROMPTS, config, 4, refill=False)
    assert [r.result.tokens for r in refilled] == [r.result.tokens for r in drained]
    # Draining: the last two prompts wait for the first four to finish; refilling: one does not.
    assert min(r.admitted for r in drained[4:]) >= max(r.finished for r in drained[:4])
    assert min(r.admitted for r in refilled[4:]) < max(r.finished for r in refilled[:4])


def test_side_by_side_servers_take_turns_join_by_join(llama_pair, monkeypatch):
    """Plain decoding and a policy interleaved prefill their prompts in turns, the same prompt one
    after the other: a batch's joins in one stretch per side let drift part a long prompt's pair."""
    target, draft = llama_pair
    config = DecodeConfig.of(threshold=0.3, gamma_max=3, max_new_tokens=N)
    joined, add = [], BatchLM.add

    def logged(lm, tokens):
        if lm.model is target:
            joined.append((lm, tuple(tokens)))
        add(lm, tokens)

    monkeypatch.setattr(BatchLM, "add", logged)
    plain, spec = interleave(autoregressive_serving(target, PROMPTS[:4], config, 4),
                             speculative_serving(target, draft, PROMPTS[:4], config, 4))
    sides = list(dict.fromkeys(lm for lm, _ in joined))
    assert [sides.index(lm) for lm, _ in joined] == [0, 1] * 4
    assert [tokens for _, tokens in joined] == [tuple(p[:-1]) for p in PROMPTS[:4] for _ in range(2)]
    assert [r.result.tokens for r in spec] == [r.result.tokens for r in plain]


def test_time_shares_add_up_to_the_run(llama_pair):
    target, draft = llama_pair
    config = DecodeConfig.of(threshold=0.3, gamma_max=3, max_new_tokens=N)
    requests = batched_speculative(target, draft, PROMPTS, config, 3)
    wall = max(r.finished for r in requests) - min(r.admitted for r in requests)
    shares = sum(r.time_s for r in requests)
    assert 0.9 * wall <= shares <= wall * 1.0001
    assert all(r.latency_per_token > 0 for r in requests)


def test_replay_predicts_every_row_of_a_batch(llama_pair):
    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=frozenset())
    rec = record(pair, PROMPTS, N, 5, topk=5)
    for config in (DecodeConfig.of(metric="entropy", threshold=0.5, gamma_max=5, max_new_tokens=N),
                   DecodeConfig.of(schedule="cumulative", threshold=0.2, gamma_max=4, min_draft_len=0,
                                   max_new_tokens=N),
                   DecodeConfig.of(schedule="fixed", gamma_max=5, max_new_tokens=N)):
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
        lm.rollback([length - 3 for length in lm.lengths])
        lm.tidy()
    assert lm.mask.sum(dim=1).tolist() == lm.lengths
    assert lm.mask.shape[1] <= 8 + max(lm.lengths) * 5 // 4 + 4


def test_batched_sampling_equals_each_prompt_sampled_alone(llama_pair):
    target, draft = llama_pair
    config = DecodeConfig.of(temperature=0.9, top_p=0.95, threshold=0.3, gamma_max=4, max_new_tokens=N)
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


# --- replay at batch size B: the walk charges the engine's own steps -----------------------------

SURFACE = CostSurface({1: CostModel(0.001, [0.010 + 0.001 * k for k in range(6)], 10, 1),
                       8: CostModel(0.004, [0.030 + 0.006 * k for k in range(6)], 10, 8)})


class Logged:
    """A batched step that notes each step's rows, most draft forwards and longest draft."""

    def __init__(self, step):
        self.step, self.steps = step, []

    def __call__(self, requests):
        self.step(requests)
        last = [r.result.rounds[-1] for r in requests] if hasattr(self.step, "draft") else []
        self.steps.append((len(requests), max((r.draft_forwards for r in last), default=0),
                           max((r.drafted for r in last), default=0), sum(r.drafted + 1 for r in last)))


@pytest.mark.parametrize("refill", [True, False])
def test_batched_replay_charges_the_decoder_s_own_steps(llama_pair, refill):
    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=frozenset({1}))
    rec = record(pair, PROMPTS, N, 5, topk=5, eos_ids=pair.eos_ids)
    configs = [DecodeConfig.of(metric="entropy", threshold=0.5, gamma_max=5, max_new_tokens=N, batch_size=3),
               DecodeConfig.of(schedule="cumulative", threshold=0.2, gamma_max=4, min_draft_len=0, max_new_tokens=N,
                            batch_size=3),
               DecodeConfig.of(schedule="fixed", gamma_max=5, max_new_tokens=N, batch_size=3),
               # The batch-level rule: every row stops once fewer than half the rows still draft.
               DecodeConfig.of(metric="top1", threshold=0.6, gamma_max=5, min_draft_len=1, batch_quorum=0.5,
                            max_new_tokens=N, batch_size=3),
               # The engines' own rule variants and the goodput schedule.
               DecodeConfig.of(metric="top1", threshold=0.6, gamma_max=5, min_draft_len=2, batch_quorum=0.5,
                            semantics="llamacpp", max_new_tokens=N, batch_size=3),
               DecodeConfig.of(threshold=0.5, gamma_max=4, semantics="hf", max_new_tokens=N, batch_size=3),
               DecodeConfig.of(schedule="goodput", goodput_model=tiny.GOODPUT_MODEL, gamma_max=5, min_draft_len=0,
                            max_new_tokens=N, batch_size=3)]
    # Each request pays its own batch-1 prefill (prompt but its last token) when it joins.
    alone = dataclasses.replace(SURFACE.at(1), t_prefill_target=1e-4, t_prefill_draft=3e-5)
    surface = CostSurface({**SURFACE.models, 1: alone})
    prefill = sum(len(p) - 1 for p in PROMPTS)
    predicted = predict_batched(rec, configs, surface, refill)
    t_draft, t_verify = surface.tables(3)
    for config, row in zip(configs, predicted.itertuples()):
        target_lm, draft_lm = BatchLM(target), BatchLM(draft)
        logged = Logged(SpeculativeStep(target_lm, draft_lm, config, pair.eos_ids))
        serve(PROMPTS, config, 3, [target_lm, draft_lm], logged, pair.eos_ids, refill)
        padded = sum(s * t_draft[b] + t_verify[b, longest] for b, s, longest, _ in logged.steps)
        assert row.predicted_time == pytest.approx(padded + prefill * 1.3e-4, rel=1e-12)
        assert row.predicted_time_packed < row.predicted_time  # packed never pays for padding
        plain = Logged(AutoregressiveStep(BatchLM(target), config, pair.eos_ids))
        serve(PROMPTS, config, 3, [plain.step.target], plain, pair.eos_ids, refill)
        assert row.predicted_baseline_time == pytest.approx(sum(t_verify[b, 0] for b, *_ in plain.steps)
                                                            + prefill * 1e-4, rel=1e-12)


def test_batched_replay_at_batch_one_is_replay(llama_pair):
    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=frozenset())
    rec = record(pair, PROMPTS, N, 5, topk=5)
    configs = spanning_policies(5, N, tiny.GOODPUT_MODEL)
    grid = simulate_grid(rec, configs, SURFACE.at(1))
    batched = predict_batched(rec, configs, SURFACE)
    # (SURFACE has no prefill costs: the batched walk adds only those to replay's own.)
    assert np.allclose(batched["predicted_time"], grid["predicted_time"], rtol=1e-12)
    assert np.allclose(batched["predicted_time_packed"], grid["predicted_time"], rtol=1e-12)
    assert np.allclose(batched["predicted_speedup"], grid["predicted_speedup"], rtol=1e-12)


def test_cost_surface_interpolates_between_batch_sizes():
    t_draft, t_verify = SURFACE.tables(8)
    assert t_draft[1] == 0.001 and t_draft[8] == 0.004 and t_draft[4] == pytest.approx(0.001 + 3 / 7 * 0.003)
    assert t_verify[8, 2] == pytest.approx(0.042)
    with pytest.raises(DsparkError, match="up to batch size 8"):
        SURFACE.tables(16)


def test_the_quorum_rule_cuts_drafts_and_keeps_the_output(llama_pair):
    target, draft = llama_pair
    config = DecodeConfig.of(metric="top1", threshold=0.6, gamma_max=5, min_draft_len=1, batch_quorum=0.75,
                          max_new_tokens=N)
    alone = [speculative_decode(target, draft, p, config) for p in PROMPTS]
    rows = batched_speculative(target, draft, PROMPTS, config, 4)
    assert [r.result.tokens for r in rows] == [a.tokens for a in alone]  # lossless, as every policy
    cut = [r for row in rows for r in row.result.rounds if r.stop_reason == "quorum"]
    assert cut and all(config.stopping.min_draft_len <= r.drafted < config.stopping.gamma_max for r in cut)
    assert [rounds_of(r.result) for r in rows] != [rounds_of(a) for a in alone]  # the batch changed the rounds
    with pytest.raises(DsparkError, match=r"batch_quorum must be in \[0, 1\] \(got 1.5\)"):
        config.replace(batch_quorum=1.5)


def test_first_divergence():
    from dspark_bench.harness.samples import first_divergence

    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 4], [1, 2, 3]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_the_cache_stays_as_wide_as_its_rows_need_while_prompts_come_and_go(llama_pair):
    target, draft = llama_pair
    config = DecodeConfig.of(threshold=0.3, gamma_max=4, max_new_tokens=N)
    prompts = PROMPTS * 3  # eighteen requests through two rows: many leave, many join
    for lms, step in (([BatchLM(target)], None), ([BatchLM(target), BatchLM(draft)], "speculative")):
        widths = []

        def watched(requests, inner=(SpeculativeStep(*lms, config, frozenset()) if step else
                                     AutoregressiveStep(lms[0], config, frozenset()))):
            inner(requests)
            widths.append((lms[0].mask.shape[1], max(lms[0].lengths)))

        serve(prompts, config, 2, lms, watched, frozenset())
        # Columns no row uses go; holes never pass a quarter (plus the compaction's slack).
        assert all(width <= 8 + longest * 5 // 4 + 6 for width, longest in widths[1:]), max(widths)

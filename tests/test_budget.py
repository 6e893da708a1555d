"""The budget schedule: one decision for the whole batch after every draft step (decoding/budget.py).

It is exact where it can be checked exactly: with one row it is goodput's rule, term for term; its
choice is the best of every subset of the drafting rows (brute force); replay's walk of its own
predicts the batched decoder's rounds round for round, in both layouts; and every row's output is
the target's own.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tiny
from test_batched import PROMPTS, Logged, N

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding import budget
from dspark_bench.decoding.batch_lm import BatchLM
from dspark_bench.decoding.batched import SpeculativeStep, batched_speculative, serve
from dspark_bench.decoding.budget import cost_tables, decide, draft_seconds, packed_verify
from dspark_bench.decoding.goodput import GoodputRule, load
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.errors import DsparkError
from dspark_bench.measure.recording import record
from dspark_bench.replay.batched import predict_batched
from dspark_bench.replay.cost import CostModel, CostSurface
from dspark_bench.replay.joint_walks import walk_budget
from dspark_bench.replay.simulate import simulate
from dspark_bench.replay.slots import unpriced
from dspark_bench.replay.step_prices import step_prices

EOS = frozenset({1})
# tiny.GOODPUT_MODEL's curves with cheap draft steps (its own costs stop nearly every batched draft
# at 1 token): the tiny pair then drafts 1 to 5 tokens a round, so the batch's decisions vary.
MODEL = Path(__file__).parent / "data" / "budget_goodput_model.json"
COSTS = load(str(MODEL)).costs


def chosen(*args) -> np.ndarray:
    """decide()'s answer (it writes it into its last argument)."""
    go = np.zeros(len(args[0]), dtype=np.bool_)
    decide(*args, go)
    return go


def budget_policy(**fields) -> DecodeConfig:
    return DecodeConfig.of(schedule="budget", max_new_tokens=N, goodput_model=str(MODEL), **fields)


def surface_of_model() -> CostSurface:
    """The cost surface the budget model's costs were timed as."""
    return CostSurface({b: CostModel(d, list(v), 10, b) for b, (d, v) in COSTS.items()})


def rate(expected, gain, chosen, length, steps_with, steps, packed, t_draft, t_verify):
    """The batch's expected tokens per second if exactly the rows `chosen` draft one more token."""
    b = len(expected)
    value = sum(expected) + sum(gain[i] for i in chosen)
    if not chosen:
        if packed:
            return value / (draft_seconds(steps_with, t_draft, 0)
                            + packed_verify(t_verify[b], int((length + 1).sum()), b))
        return value / (steps * t_draft[b] + t_verify[b, length.max()])
    if packed:
        cost = (draft_seconds(steps_with, t_draft, len(chosen))
                + packed_verify(t_verify[b], int((length + 1).sum()) + len(chosen), b))
    else:
        cost = (steps + 1) * t_draft[b] + t_verify[b, steps + 1]
    return value / cost


@pytest.mark.parametrize("packed", [False, True])
def test_the_choice_is_the_best_subset_of_the_drafting_rows(packed):
    t_draft, t_verify = cost_tables(COSTS, 8)
    rng = np.random.default_rng(3)
    stopped = 0
    for trial in range(300):
        n = int(rng.integers(1, 7))
        steps = int(rng.integers(1, 6))
        candidate = rng.random(n) < 0.7
        length = np.where(candidate, steps, rng.integers(0, steps + 1, n)).astype(np.int64)
        survival = rng.random(n) ** 2
        expected = 1 + survival * rng.integers(1, steps + 1, n)
        gain = survival * rng.random(n)
        steps_with = np.zeros(n + 1, dtype=np.int64)
        steps_with[max(int(candidate.sum()), 1)] = steps
        go = chosen(expected, gain, np.arange(n), candidate, np.zeros(n, bool), length, steps_with, steps, packed,
                    t_draft, t_verify)
        assert not (go & ~candidate).any()  # only a row that can draft on does
        if not candidate.any():
            continue
        free = np.flatnonzero(candidate)
        best = max(rate(expected, gain, list(s), length, steps_with, steps, packed, t_draft, t_verify)
                   for r in range(len(free) + 1) for s in itertools.combinations(free, r))
        got = rate(expected, gain, list(np.flatnonzero(go)), length, steps_with, steps, packed, t_draft, t_verify)
        assert got == pytest.approx(best, rel=1e-12), trial
        stopped += not go.any()
    assert 0 < stopped < 300  # the costs make it both go on and stop


def test_forced_rows_go_on_whatever_it_costs():
    t_draft, t_verify = cost_tables(COSTS, 8)
    n = 4
    args = (np.ones(n), np.zeros(n), np.arange(n), np.ones(n, bool), np.array([True, False, False, False]),
            np.ones(n, np.int64), np.array([0, 0, 0, 0, 1]), 1)
    assert chosen(*args, False, t_draft, t_verify).all()  # padded: the others' next tokens are free
    assert chosen(*args, True, t_draft, t_verify).tolist() == [True, False, False, False]  # packed: nothing gained


def test_one_row_is_goodput_term_for_term():
    """decide() with one row makes goodput's decision on the same numbers, in both layouts."""
    t_draft, t_verify = cost_tables(COSTS, 1)
    rule = GoodputRule(load(tiny.GOODPUT_MODEL).rule("top1", 1).curve, float(t_draft[1]), tuple(t_verify[1]))
    rng = np.random.default_rng(0)
    agreed = {True: 0, False: 0}
    for _ in range(2000):
        k = int(rng.integers(1, 8))
        alphas = rule.curve(rng.random(k) ** 0.5)  # mostly confident: it goes on and stops
        survival, expected = 1.0, 1.0
        for alpha in alphas:
            survival *= alpha
            expected += survival
        want = bool(rule.continues(k, alphas[-1], survival, expected))
        for packed in (False, True):
            steps_with = np.array([0, k])
            got = chosen(np.array([expected]), np.array([survival * alphas[-1]]), np.array([0]), np.array([True]),
                         np.array([False]), np.array([k]), steps_with, k, packed, t_draft, t_verify)[0]
            assert got == want
        agreed[want] += 1
    assert min(agreed.values()) > 100


@pytest.fixture(scope="module")
def budget_record(llama_pair):
    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=EOS)
    return record(pair, PROMPTS, N, 5, topk=5, eos_ids=EOS)


BATCH_POLICIES = [dict(metric=m, gamma_max=g, min_draft_len=d, budget_layout=layout, batch_size=b)
                  for (m, g, d), layout, b in itertools.product([("top1", 5, 0), ("entropy", 4, 1), ("margin", 5, 2)],
                                                                ["padded", "packed"], [3, 8])]


@pytest.mark.parametrize("fields", BATCH_POLICIES, ids=lambda f: "-".join(map(str, f.values())))
def test_the_walk_is_the_batched_decoder_round_for_round(llama_pair, budget_record, fields):
    target, draft = llama_pair
    config = budget_policy(**fields)
    rows = batched_speculative(target, draft, PROMPTS, config, config.batching.batch_size, EOS)
    greedy = [speculative_decode(target, draft, p,
                                 DecodeConfig.of(schedule="fixed", gamma_max=1, max_new_tokens=N), EOS)
              for p in PROMPTS]
    assert [r.result.tokens for r in rows] == [g.tokens for g in greedy]  # the target's own output
    surface = surface_of_model()
    prices = step_prices(surface, config.batching.batch_size)
    predicted, drafted_at = walk_budget(budget_record, config, prices, unpriced(len(PROMPTS)))
    for p, row in enumerate(rows):
        j, engine_rounds = 0, []
        for r in row.result.rounds:
            engine_rounds.append((j, r.drafted, r.accepted))
            j += r.emitted
        starts = np.flatnonzero(drafted_at[p] >= 0)
        assert [(int(s), int(drafted_at[p, s])) for s in starts] == [(j, d) for j, d, _ in engine_rounds], p
    assert len({r.drafted for row in rows for r in row.result.rounds}) >= 3  # the batch's decisions vary
    assert predicted["rounds"] == sum(len(r.result.rounds) for r in rows)
    assert predicted["drafted_total"] == sum(r.drafted for row in rows for r in row.result.rounds)
    assert predicted["accepted_total"] == sum(r.accepted for row in rows for r in row.result.rounds)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_the_walk_charges_the_decoder_s_own_steps(llama_pair, budget_record, layout):
    target, draft = llama_pair
    config = budget_policy(metric="top1", gamma_max=5, min_draft_len=0, budget_layout=layout, batch_size=3)
    surface = surface_of_model()
    predicted = predict_batched(budget_record, [config], surface).iloc[0]
    target_lm, draft_lm = BatchLM(target), BatchLM(draft)
    logged = Logged(SpeculativeStep(target_lm, draft_lm, config, EOS))
    serve(PROMPTS, config, 3, [target_lm, draft_lm], logged, EOS)
    t_draft, t_verify = surface.tables(3)
    padded = sum(s * t_draft[b] + t_verify[b, longest] for b, s, longest, _ in logged.steps)
    assert predicted.predicted_time == pytest.approx(padded, rel=1e-12)
    assert predicted.predicted_time_packed <= predicted.predicted_time


def test_the_batch_changes_the_rounds_and_the_layouts_differ(llama_pair, budget_record):
    target, draft = llama_pair
    alone = [speculative_decode(target, draft, p, budget_policy(gamma_max=5, min_draft_len=0), EOS) for p in PROMPTS]
    rounds = {}
    for layout in ("padded", "packed"):
        config = budget_policy(gamma_max=5, min_draft_len=0, budget_layout=layout, batch_size=8)
        rows = batched_speculative(target, draft, PROMPTS, config, 8, EOS)
        rounds[layout] = [[r.drafted for r in row.result.rounds] for row in rows]
    assert rounds["padded"] != [[r.drafted for r in a.rounds] for a in alone]
    assert rounds["padded"] != rounds["packed"]


def test_at_batch_one_the_budget_is_goodput_on_the_cost_table(llama_pair, budget_record):
    """Engine and replay at B = 1: the budget schedule's rounds are goodput's (its costs monotone)."""
    config = budget_policy(gamma_max=5, min_draft_len=0)
    goodput = config.replace(schedule="goodput")
    assert simulate(budget_record, config) == simulate(budget_record, goodput)
    target, draft = llama_pair
    for prompt in PROMPTS:
        assert speculative_decode(target, draft, prompt, config, EOS).rounds == \
            speculative_decode(target, draft, prompt, goodput, EOS).rounds


def test_bad_budget_policies_fail_in_one_line(budget_record):
    with pytest.raises(DsparkError, match="drop the batch quorum"):
        budget_policy(batch_quorum=0.5, batch_size=4)
    with pytest.raises(DsparkError, match="no engine rule variant"):
        budget_policy(semantics="llamacpp")
    with pytest.raises(DsparkError, match="needs a goodput model"):
        DecodeConfig.of(schedule="budget")
    with pytest.raises(DsparkError, match="unknown budget layout 'sparse'"):
        budget_policy(budget_layout="sparse")
    with pytest.raises(DsparkError, match="timed up to batch size 8, not 16"):
        budget.rule_for(budget_policy(batch_size=16))
    with pytest.raises(DsparkError, match="depend on the whole batch"):
        simulate(budget_record, budget_policy(batch_size=4))


def test_no_engine_expresses_it_so_export_takes_the_nearest():
    from dspark_bench.decoding.rules import expressible
    from dspark_bench.engines.export import FORMATS

    config = budget_policy(batch_size=8, budget_layout="packed")
    for fmt in FORMATS:
        assert "a budget schedule" in " ".join(expressible(config, fmt)), fmt
    assert config.label() == "top1 budget γ≤5 min1 · packed · B=8"
    assert budget_policy().replace(batch_size=1).stopping.budget_layout == "padded"

"""The headroom bound: the batch-1 oracle against brute force, perfect stopping against the rules."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dspark_bench.analysis.oracle import headroom, oracle, oracle_lengths, perfect_stopping, round_cost
from dspark_bench.config import DecodeConfig
from dspark_bench.replay.cost import CostModel
from dspark_bench.replay.rounds import match_lengths
from dspark_bench.replay.simulate import Record, simulate_grid


def small_record(seed: int, P: int = 3, n: int = 7, g: int = 3) -> Record:
    """Drafts that agree with the continuation for a random run at each position."""
    rng = np.random.default_rng(seed)
    continuation = rng.integers(10, 100, size=(P, n))
    runs = rng.integers(0, g + 1, size=(P, n))
    rollout = np.full((P, n, g), 5, dtype=np.int64)  # 5: never the continuation's
    for p, j, k in itertools.product(range(P), range(n), range(g)):
        if k < runs[p, j] and j + k < n:
            rollout[p, j, k] = continuation[p, j + k]
    confidences = {"top1": rng.random((P, n, g)).astype(np.float32)}
    return Record(continuation, np.full(P, n), rollout, confidences, (), {"max_new_tokens": n, "topk": 5})


def brute_force(rec: Record, cost: CostModel, gamma_max: int) -> float:
    """The least time over every sequence of draft lengths (drafting past the accepted run too)."""
    matches = match_lengths(rec)
    total = 0.0
    for p, length in enumerate(rec.lengths):
        def least(j: int) -> float:
            if j >= length:
                return 0.0
            cap = min(gamma_max, rec.max_new_tokens - j - 1)
            return min(round_cost(cost, k) + least(j + min(k, int(matches[p, j])) + 1) for k in range(cap + 1))
        total += least(0)
    return total


@pytest.mark.parametrize("seed", range(4))
def test_batch_one_oracle_is_the_brute_force_optimum(seed):
    rec = small_record(seed)
    cost = CostModel(t_draft=0.3, t_verify=[1.0, 1.1, 1.3, 1.8], context_tokens=10)
    rounds, seconds = oracle_lengths(rec, cost, 3)
    assert seconds == pytest.approx(brute_force(rec, cost, 3))
    matches = match_lengths(rec)
    for p, chosen in enumerate(rounds):  # every chosen draft is wholly accepted and covers the sequence
        j = 0
        for k in chosen:
            assert k <= matches[p, j]
            j += k + 1
        assert j == rec.lengths[p]


def test_the_oracle_bounds_every_policy_and_perfect_stopping_every_rule():
    rec = small_record(7, P=6, n=40, g=6)
    cost = CostModel(t_draft=0.05, t_verify=[1.0 + 0.05 * k for k in range(7)], context_tokens=10)
    bound = oracle(rec, cost, 6)["predicted_speedup"]
    rules = [DecodeConfig.of(threshold=t, gamma_max=g, min_draft_len=m, max_new_tokens=40)
             for t, g, m in itertools.product((0.1, 0.5, 0.9), (1, 3, 6), (0, 1))]
    rules += [DecodeConfig.of(schedule="fixed", gamma_max=g, max_new_tokens=40) for g in range(1, 7)]
    table = simulate_grid(rec, rules, cost)
    perfect = perfect_stopping(rec, range(1, 7), [1], cost)
    assert table["predicted_speedup"].max() <= perfect["predicted_speedup"].max() <= bound + 1e-12
    assert (perfect["acceptance_rate"] == 1.0).all()  # it never drafts a token the target rejects
    (row,) = headroom(table.assign(batch_size=1), rec, cost)
    assert row["oracle_speedup"] == pytest.approx(bound) and row["autoregressive"] == 1.0
    fixed, best = row["best_fixed_speedup"], row["best_scheduled_speedup"]
    assert row["captured"] == pytest.approx((best - fixed) / (bound - fixed))
    assert fixed == table[table["schedule"] == "fixed"]["predicted_speedup"].max()
    assert not math.isnan(row["captured"])


def test_perfect_stopping_bounds_every_rule_at_larger_batch_sizes_in_both_layouts():
    from dspark_bench.replay.batched import simulate_with_surface
    from dspark_bench.replay.cost import CostSurface

    rec = small_record(3, P=8, n=40, g=6)
    rec.info["prompt_tokens"] = [5] * 8
    models = {b: CostModel(t_draft=0.05 * (1 + 0.1 * b), t_verify=[1.0 + 0.1 * b + 0.05 * k * b for k in range(7)],
                           context_tokens=10, batch_size=b, t_prefill_target=0.01, t_prefill_draft=0.002)
              for b in (1, 4)}
    surface = CostSurface(models)
    rules = [DecodeConfig.of(threshold=t, gamma_max=g, batch_size=b, max_new_tokens=40)
             for t, g, b in itertools.product((0.1, 0.5, 0.9), (2, 4, 6), (1, 4))]
    rules += [DecodeConfig.of(schedule="fixed", gamma_max=g, batch_size=b, max_new_tokens=40)
              for g, b in itertools.product(range(1, 7), (1, 4))]
    table = simulate_with_surface(rec, rules, surface)
    perfect = perfect_stopping(rec, range(1, 7), [1, 4], surface.at(1), surface)
    rows = headroom(table, rec, surface.at(1), surface)
    assert [(r["batch_size"], r["layout"]) for r in rows] == [(1, "—"), (4, "padded"), (4, "packed")]
    at_one = table[table["batch_size"] == 1]["predicted_speedup"]  # the exact optimum, priced as the walk prices B = 1
    assert at_one.max() <= perfect[perfect["batch_size"] == 1]["predicted_speedup"].max() <= rows[0]["oracle_speedup"]
    for row in rows[1:]:
        column = "predicted_speedup" if row["layout"] == "padded" else "predicted_speedup_packed"
        at_b = table[table["batch_size"] == 4]
        assert at_b[column].max() <= row["oracle_speedup"]
        assert row["oracle_speedup"] == perfect[perfect["batch_size"] == 4][column].max()


def test_on_in_decode_prices_the_batch_one_bounds_are_priced_as_the_batch_one_policies():
    """A sweep over B on prices timed inside decodes prices its batch-1 policies on the batch-1
    decoder's own model, not a one-row live batch's step terms (replay/batched.batch_one_priced):
    the oracle and perfect stopping at B = 1, and a better signal's bound, are priced the same way,
    so no batch-1 policy reads faster than its own oracle (priced on the surface, they read below)."""
    from dspark_bench.analysis.signal_headroom import signal_headroom
    from dspark_bench.replay.batched import simulate_with_surface
    from dspark_bench.replay.cost import CostSurface, StepTerms

    rec = with_signal(small_record(3, P=8, n=40, g=6), 1)
    isolated = surface_for(rec)
    surface = CostSurface(isolated.models, StepTerms(rows=[0.0] * 5, plain_rows=[0.0] * 5, join=0.0))
    # The batch-1 decoder's own rounds: cheaper drafts and verifies than the surface's one-row batch.
    alone = CostModel(t_draft=0.01, t_verify=[1.0 + 0.01 * k for k in range(7)], context_tokens=10, batch_size=1)
    rules = [DecodeConfig.of(threshold=t, gamma_max=g, batch_size=b, max_new_tokens=40)
             for t, g, b in itertools.product((0.1, 0.5, 0.9), (2, 4, 6), (1, 4))]
    rules += [DecodeConfig.of(schedule="fixed", gamma_max=g, batch_size=b, max_new_tokens=40)
              for g, b in itertools.product(range(1, 7), (1, 4))]
    table = simulate_with_surface(rec, rules, surface, batch_one=surface.batch_one(alone))
    at_one = table[table["batch_size"] == 1]["predicted_speedup"]
    row = headroom(table, rec, alone, surface)[0]
    perfect = perfect_stopping(rec, range(1, 7), [1, 4], alone, surface)
    assert at_one.max() <= perfect[perfect["batch_size"] == 1]["predicted_speedup"].max() <= row["oracle_speedup"]
    assert row["oracle_speedup"] == pytest.approx(oracle(rec, alone, 6)["predicted_speedup"])
    on_surface = oracle(rec, alone, 6, surface=surface)["predicted_speedup"]
    assert on_surface < at_one.max()  # what the analysis read before: a policy above its own oracle
    bound = signal_headroom(rec, alone, surface, batch_sizes=(1, 4), gamma_max=6, betas=(0.0,))
    assert bound[bound["batch_size"] == 1]["oracle_speedup"].iloc[0] == pytest.approx(row["oracle_speedup"])


# --- how good a signal must be (analysis/signal_headroom.py) ---------------------------------------


def surface_for(rec: Record):
    from dspark_bench.replay.cost import CostSurface

    rec.info["prompt_tokens"] = [5] * len(rec.lengths)
    return CostSurface({b: CostModel(t_draft=0.05 * (1 + 0.1 * b),
                                     t_verify=[1.0 + 0.1 * b + 0.05 * k * b for k in range(7)],
                                     context_tokens=10, batch_size=b, t_prefill_target=0.01, t_prefill_draft=0.002)
                        for b in (1, 4)})


def with_signal(rec: Record, seed: int) -> Record:
    """The record with a `learned` signal that knows the verdicts somewhat: noisy log-odds around them."""
    from dspark_bench.analysis.signal_headroom import verdicts

    noise = np.random.default_rng(seed).normal(size=rec.rollout.shape)
    learned = 1 / (1 + np.exp(-(noise + 0.8 * (2 * verdicts(rec) - 1))))
    return Record(rec.continuation, rec.lengths, rec.rollout,
                  {**rec.confidences, "learned": learned.astype(np.float32)}, rec.eos_ids, rec.info, rec.available)


def test_better_signals_rank_better_and_a_perfect_one_reaches_perfect_stopping():
    from dspark_bench.analysis.signal_headroom import sharpened, signal_auc, signal_headroom

    rec = with_signal(small_record(5, P=8, n=40, g=6), 0)
    surface = surface_for(rec)
    aucs = [signal_auc(sharpened(rec, beta)) for beta in (0.0, 1.0, 3.0, math.inf)]
    assert aucs == sorted(aucs) and aucs[0] < 0.9 and aucs[-1] == 1.0
    assert signal_auc(sharpened(rec, 0.0)) == pytest.approx(signal_auc(rec, "learned"))

    table = signal_headroom(rec, surface.at(1), surface, batch_sizes=(1, 4), gamma_max=6, betas=(0.0, 1.0, math.inf))
    assert len(table) == 3 * 3  # (B = 1) + (B = 4 padded, packed), per signal
    perfect = perfect_stopping(rec, range(1, 7), [1, 4], surface.at(1), surface)
    best = table[table["beta"] == math.inf].set_index(["batch_size", "layout"])["best_rule_speedup"]
    # The verdict itself as the signal: the best rule is perfect stopping, at every B and layout.
    assert best[(1, "—")] == pytest.approx(perfect[perfect["batch_size"] == 1]["predicted_speedup"].max())
    assert best[(4, "padded")] == pytest.approx(perfect[perfect["batch_size"] == 4]["predicted_speedup"].max())
    assert best[(4, "packed")] == pytest.approx(perfect[perfect["batch_size"] == 4]["predicted_speedup_packed"].max())
    at_four = table[(table["batch_size"] == 4) & (table["beta"] == math.inf)]
    assert (at_four["captured"] == 1.0).all()  # at B > 1 the oracle is perfect stopping
    # No rule passes the exact optimum at B = 1 (at B > 1 padded one can pass per-row perfect stopping),
    # and the share is (rule − fixed) / (oracle − fixed).
    at_one = table[table["batch_size"] == 1]
    assert (at_one["best_rule_speedup"] <= at_one["oracle_speedup"] + 1e-12).all()
    # The best fixed γ is fixed γ's own best over 1..γ_max at that B, whatever the signal.
    from dspark_bench.replay.batched import simulate_with_surface

    fixed = simulate_with_surface(rec, [DecodeConfig.of(schedule="fixed", gamma_max=g, batch_size=4, max_new_tokens=40)
                                        for g in range(1, 7)], surface)
    packed = table[(table["batch_size"] == 4) & (table["layout"] == "packed")]["best_fixed_speedup"]
    assert (packed == fixed["predicted_speedup_packed"].max()).all()


def test_auc_needed_is_the_least_auc_that_captures_the_share():
    import pandas as pd

    from dspark_bench.analysis.signal_headroom import auc_needed

    table = pd.DataFrame({"batch_size": [1, 1, 1, 4, 4], "layout": ["—", "—", "—", "packed", "packed"],
                          "auc": [0.90, 0.95, 1.0, 0.90, 1.0], "captured": [0.2, 0.6, 0.9, 0.1, float("nan")]})
    needed = auc_needed(table, 0.5).set_index(["batch_size", "layout"])["auc_needed"]
    assert needed[(1, "—")] == 0.95 and math.isnan(needed[(4, "packed")])


def test_better_signals_add_evidence_only_where_a_verify_judges_the_token():
    from dspark_bench.analysis.signal_headroom import sharpened, verdicts
    from dspark_bench.replay.learned import used_steps

    rec = with_signal(small_record(6, P=4, n=30, g=6), 1)
    judged, accepted = used_steps(rec), verdicts(rec)
    learned = rec.confidences["learned"].astype(np.float64)
    better = sharpened(rec, 1.0).confidences["top1"].astype(np.float64)
    assert np.allclose(better[~judged], learned[~judged], atol=1e-6)  # past the first rejection: the real signal
    assert (better[judged & accepted] > learned[judged & accepted]).all()
    assert (better[judged & ~accepted] < learned[judged & ~accepted]).all()
    assert (~judged).any() and (judged & ~accepted).any()


def test_batch_sizes_past_one_need_a_cost_surface():
    from dspark_bench.analysis.signal_headroom import signal_headroom
    from dspark_bench.errors import DsparkError

    rec = with_signal(small_record(2, P=4, n=20, g=4), 0)
    cost = CostModel(t_draft=0.05, t_verify=[1.0 + 0.05 * k for k in range(5)], context_tokens=10)
    with pytest.raises(DsparkError, match="need a cost surface"):
        signal_headroom(rec, cost, None, batch_sizes=(1, 4), gamma_max=4)


def test_the_unsharpened_signal_is_replayed_as_the_rules_on_it_would_be():
    from dspark_bench.analysis.signal_headroom import rule_policies, signal_headroom

    rec = small_record(9, P=6, n=40, g=6)
    rec = Record(rec.continuation, rec.lengths, rec.rollout, {**rec.confidences, "learned": rec.confidences["top1"]},
                 rec.eos_ids, rec.info, rec.available)
    cost = CostModel(t_draft=0.05, t_verify=[1.0 + 0.05 * k for k in range(7)], context_tokens=10)
    (row,) = signal_headroom(rec, cost, gamma_max=6, betas=(0.0,)).to_dict(orient="records")
    direct = simulate_grid(rec, rule_policies([1], 6, 40), cost)  # the same rules on the record's own top1
    rules = [c.stopping.schedule != "fixed" for c in rule_policies([1], 6, 40)]
    assert row["best_rule_speedup"] == direct["predicted_speedup"][rules].max()
    assert row["oracle_speedup"] == pytest.approx(oracle(rec, cost, 6)["predicted_speedup"])


def test_a_record_without_the_signal_is_refused():
    from dspark_bench.analysis.signal_headroom import sharpened
    from dspark_bench.errors import DsparkError

    with pytest.raises(DsparkError, match="no learned signal"):
        sharpened(small_record(1), 1.0)

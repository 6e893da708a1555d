"""The plan's estimate (harness/plan.py): every decode pays its prompt's prefill, and timing our prices counts."""

from __future__ import annotations

import math

import pytest

from dspark_bench.harness.plan import (
    ASSUMED_SPEEDUP,
    DRAFT_SHARE,
    RECORD_COST,
    Pace,
    prices_seconds,
    replay_plan,
    run_plan,
)
from dspark_bench.measure.cost_model import COST_REPEATS, DEPTH_REPEATS, PREFILL_REPEATS, SURFACE_REPEATS


def test_each_decode_pays_its_prompt_s_prefill():
    pace = Pace(per_token=0.02, per_prompt_token=0.0003)  # 3,000 prompt tokens: 0.9 s, as 45 generated tokens
    line, total = replay_plan(pace, prompt_tokens=2 * 3000, prompts=2, tokens=64, policies=100, confirm=3, repeats=1,
                              recorded=False, prices_s=40.0)
    record = RECORD_COST * (0.0003 * 6000 + 0.02 * 128)
    confirm = 3 * (2 * 0.0003 * 6000 + 0.02 * 128 * (1 + 1 / ASSUMED_SPEEDUP))
    assert total == pytest.approx(record + confirm + 40.0)
    assert "time our prices ≈ 40 s" in line and "0.90 s a prompt's prefill" in line
    short, _ = replay_plan(Pace(0.02), 0, 2, 64, 100, 3, 1, recorded=True)
    assert "record cached" in short and "prefill" not in short
    # A sampled record records every path as a greedy record is: its prompt's prefill too.
    _, sampled = replay_plan(pace, 6000, 2, 64, 100, 0, 1, recorded=False, paths=4)
    assert sampled == pytest.approx(4 * record)


def test_a_run_s_plan_pays_each_decode_s_prefill():
    pace = Pace(per_token=0.02, per_prompt_token=0.0003)
    line, total = run_plan(pace, prompts=12, samples=36, configs=3, tokens=64, repeats=2, prompt_tokens=2000)
    pair = 2 * 0.0003 * 2000 + 0.02 * 64 * (1 + 1 / ASSUMED_SPEEDUP)  # both sides pay the prefill
    assert total == pytest.approx(36 * 2 * pair)
    assert "0.60 s a prompt's prefill" in line and "12 prompts × 3 configurations × 2 timed pairs" in line
    _, short = run_plan(pace, 12, 36, 3, 64, 2)
    assert short == pytest.approx(36 * 2 * 0.02 * 64 * (1 + 1 / ASSUMED_SPEEDUP))


def test_timing_our_prices_counts_each_batch_size_and_depth():
    pace = Pace(per_token=0.01, per_prompt_token=0.0002)
    alone = prices_seconds(pace, context=500, gamma=4, batch_sizes=[1], depths=())
    passes = 0.01 * (5 + DRAFT_SHARE)
    prefills = (PREFILL_REPEATS + 1) * (1 + DRAFT_SHARE) * 0.0002 * 500
    assert alone == pytest.approx((COST_REPEATS + 2) * passes + prefills)
    wider = prices_seconds(pace, 500, 4, [1, 4, 16], ())
    assert wider - alone == pytest.approx((SURFACE_REPEATS + 1) * passes * (math.sqrt(4) + math.sqrt(16)))
    deeper = prices_seconds(pace, 500, 4, [1], (256, 4096))
    each_token = (PREFILL_REPEATS + 2) * (1 + DRAFT_SHARE) * 0.0002  # the timed prefills, and the caches' own
    assert deeper - alone == pytest.approx((DEPTH_REPEATS + 2) * passes * 2 + each_token * (256 + 4096))


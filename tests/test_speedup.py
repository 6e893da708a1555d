"""Speedup means one thing in every mode: baseline seconds per token over speculative seconds per token."""

import numpy as np
import pandas as pd
import pytest
import tiny
import torch

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.harness.models import ModelPair
from dspark_bench.harness.runner import RunnerSettings, run
from dspark_bench.metrics import bootstrap_ratio, speedup_ratio, summarize
from dspark_bench.tasks.prompts import Prompt, encode


def samples(base_time, base_tokens, spec_time, spec_tokens) -> pd.DataFrame:
    """A samples table of one configuration with the given per-prompt times and lengths."""
    n = len(base_time)
    return pd.DataFrame({
        "config_id": 0, "config_label": "p", "rounds": 1, "drafted_total": 1, "accepted_total": 1,
        "emitted_total": 1, "full_blocks": 1, "new_tokens": spec_tokens, "baseline_new_tokens": base_tokens,
        "baseline_time_s": base_time, "spec_time_s": spec_time, "identical_to_baseline": [None] * n,
    })


def test_speedup_is_the_per_token_ratio_when_lengths_differ():
    # Prompt 1: the baseline's sample ended early (10 tokens), the speculative one ran to 20.
    table = samples([1.0, 2.0], [10, 40], [0.5, 1.0], [20, 20])
    row = summarize(table).iloc[0]
    per_token = (3.0 / 50) / (1.5 / 40)  # 1.6
    assert row["speedup"] == pytest.approx(per_token)
    assert row["speedup"] != pytest.approx(3.0 / 1.5)  # the old sum-of-times ratio, 2.0
    assert row["baseline_mean_new_tokens"] == 25.0 and row["spec_mean_new_tokens"] == 20.0
    assert row["baseline_tokens_per_s"] / row["spec_tokens_per_s"] == pytest.approx(1 / per_token)


def test_bootstrap_resamples_times_and_lengths_together():
    # Every prompt is exactly 1.5x faster per token, but sample lengths vary wildly: a
    # per-token ratio has no spread to report, a ratio of summed times a wide one.
    rng = np.random.default_rng(1)
    base_tokens, spec_tokens = rng.integers(5, 200, 12), rng.integers(5, 200, 12)
    base_time, spec_time = base_tokens * 0.03, spec_tokens * 0.02
    row = summarize(samples(base_time, base_tokens, spec_time, spec_tokens)).iloc[0]
    assert row["speedup"] == pytest.approx(1.5)
    assert row["speedup_low"] == pytest.approx(1.5) and row["speedup_high"] == pytest.approx(1.5)
    _, low, high = bootstrap_ratio(base_time, spec_time)
    assert high - low > 0.5


def test_greedy_speedup_equals_the_ratio_of_times():
    # Same lengths on both sides (greedy): the definition reduces to sum(base) / sum(spec),
    # interval included, so committed greedy baselines keep their numbers.
    base_time, spec_time, tokens = [1.0, 2.5, 0.7, 1.9], [0.6, 1.1, 0.5, 1.0], [30, 80, 17, 64]
    row = summarize(samples(base_time, tokens, spec_time, tokens)).iloc[0]
    point, low, high = bootstrap_ratio(base_time, spec_time)
    assert row["speedup"] == pytest.approx(point, rel=1e-12)
    assert (row["speedup_low"], row["speedup_high"]) == pytest.approx((low, high), rel=1e-12)
    assert speedup_ratio(2.0, 10, 1.0, 10) == pytest.approx(2.0)


def eos_pair(max_new_tokens: int) -> tuple[ModelPair, list[int], int]:
    """A tiny pair whose EOS is a token its greedy output reaches early."""
    target = tiny.llama(seed=3)
    tokenizer = tiny.tokenizer()
    ids = encode(tokenizer, "def add(a, b):", "none")
    free = autoregressive_decode(target, ids, DecodeConfig.of(max_new_tokens=max_new_tokens)).tokens
    target.generation_config.eos_token_id = free[5]
    pair = ModelPair(target, tiny.noisy_copy(target, 0.03), tokenizer, "t", "d", torch.device("cpu"), torch.float32)
    return pair, free, free.index(free[5]) + 1


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_ignore_eos_generates_exactly_max_new_tokens(temperature):
    pair, free, eos_stop = eos_pair(24)
    prompts = [Prompt("p0", "def add(a, b):")]
    config = DecodeConfig.of(max_new_tokens=24, temperature=temperature, seed=2)
    timed = RunnerSettings(repeats=1, warmup=0, chat_template="none", ignore_eos=True)
    rows = run(pair, prompts, [config], timed).samples.iloc[0]
    assert rows["new_tokens"] == 24 and rows["baseline_new_tokens"] == 24
    if temperature == 0.0:
        assert list(rows["output_ids"]) == free and rows["identical_to_baseline"]
        plain = run(pair, prompts, [config], RunnerSettings(repeats=1, warmup=0, chat_template="none")).samples
        assert plain["new_tokens"].iloc[0] == eos_stop < 24  # EOS ends it when not ignored

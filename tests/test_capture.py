"""Capture (decoding/capture.py): on CUDA a policy's passes run from captured graphs unless --eager,
and the run's metadata says how each ran. The CUDA branch is a decision on the device's type, so
it is tested here on a CPU with a `cuda` device object (nothing runs on it)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import tiny
import torch
from cli_helpers import invoke
from transformers import MistralConfig, MistralForCausalLM

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding import capture
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.cached_lm import static_blocker
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.errors import DsparkError
from dspark_bench.measure.cost_model import measure_cost

CUDA, CPU = torch.device("cuda"), torch.device("cpu")
POLICIES = [DecodeConfig.of(threshold=0.4, gamma_max=4), DecodeConfig.of(threshold=0.4, gamma_max=4, batch_size=4),
            DecodeConfig.of(drafter="lookup", schedule="fixed", gamma_max=3)]


def sliding_model():
    config = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=8)
    return MistralForCausalLM(config).eval()


def test_cuda_captures_what_it_can_and_says_why_not_the_rest():
    models = (tiny.llama(), tiny.llama(layers=1))
    on_cuda = capture.captured(POLICIES, CUDA, eager=False, models=models)
    assert [c.verification.compiled for c in on_cuda] == [True, True, False]  # B = 4 too: static_batch_lm.py
    described = capture.describe(on_cuda, CUDA, False, models)
    assert described["default"] == "cuda-graphs" and described["mode"] == "mixed"
    assert described["policies"] == {"cuda-graphs": 2, "eager": 1}
    assert described["eager_because"] == {"the lookup drafter": 1}


def test_eager_and_the_cpu_change_nothing():
    models = (tiny.llama(),)
    assert capture.captured(POLICIES, CUDA, eager=True, models=models) == POLICIES
    assert capture.captured(POLICIES, CPU, eager=False, models=models) == POLICIES
    described = capture.describe(POLICIES, CUDA, True, models)
    assert described == {"default": "cuda-graphs", "eager_flag": True, "mode": "eager", "policies": {"eager": 3}}
    explicit = [POLICIES[0].replace(compiled=True)]  # --compile on a CPU: compiled, no graphs
    assert capture.describe(explicit, CPU, False)["mode"] == "compiled"


def test_eager_with_compile_is_refused():
    with pytest.raises(DsparkError, match="--eager and --compile ask for opposite passes"):
        capture.captured([POLICIES[0].replace(compiled=True)], CPU, eager=True)


def test_a_model_without_a_static_cache_is_not_captured_and_asked_once(monkeypatch):
    from dspark_bench.decoding import cached_lm

    calls = []

    def broken(config, max_cache_len):
        calls.append(config)
        raise ValueError("no attention layers")

    monkeypatch.setattr(cached_lm, "StaticCache", broken)
    model = tiny.llama(seed=3)
    for _ in range(3):
        (kept,) = capture.captured(POLICIES[:1], CUDA, eager=False, models=(model,))
        assert not kept.verification.compiled
    assert static_blocker(model).startswith("a model without a static cache (ValueError") and len(calls) == 1


def test_a_sliding_window_model_is_not_captured():
    model = sliding_model()
    assert static_blocker(model) == "sliding-window attention layers"
    assert static_blocker(tiny.llama()) is None
    (kept,) = capture.captured(POLICIES[:1], CUDA, eager=False, models=(model,))
    assert not kept.verification.compiled
    assert capture.describe([kept], CUDA, False, (model,))["eager_because"] == {"sliding-window attention layers": 1}


def test_the_captured_path_decodes_the_targets_greedy_output(llama_pair, monkeypatch):
    """What CUDA runs by default, run on the CPU (dynamo's eager backend: the static cache, the
    traced forward and its guards, no code generation): the target's own greedy tokens."""
    from dspark_bench.decoding import cached_lm

    monkeypatch.setitem(cached_lm.COMPILE_OPTIONS, "backend", "eager")
    target, draft = llama_pair
    prompt = [5, 9, 2, 7, 11, 3]
    for config in (DecodeConfig.of(threshold=0.3, gamma_max=4, max_new_tokens=24),
                   DecodeConfig.of(schedule="fixed", gamma_max=3, max_new_tokens=24, draft_mode="verify-side")):
        (captured,) = capture.captured([config], CUDA, eager=False, models=(target, draft))
        assert captured.verification.compiled
        expected = autoregressive_decode(target, prompt, config).tokens
        assert speculative_decode(target, draft, prompt, captured).tokens == expected


def test_prices_of_compiled_passes_warm_each_shape_first(llama_pair, monkeypatch):
    """measure_cost(compiled=True) times the compiled decoder's passes; the first three of each
    shape (compile, then graph recording on CUDA) are not counted."""
    from dspark_bench.decoding import cached_lm

    monkeypatch.setitem(cached_lm.COMPILE_OPTIONS, "backend", "eager")
    calls = []
    real = cached_lm.compiled_forward
    monkeypatch.setattr(cached_lm, "compiled_forward", lambda model: calls.append(model) or real(model))
    target, draft = llama_pair
    pair = type("Pair", (), {"target": target, "draft": draft, "device": CPU})()
    model = measure_cost(pair, list(range(3, 40)), gamma=2, repeats=3, drafters=(), compiled=True)
    assert len(model.t_verify) == 3 and model.t_draft > 0
    # every timed pass went through the compiled forward: 3 + 3 warm-ups, for each k and each of a
    # round's γ = 2 draft steps, timed in turn
    assert calls.count(draft) == 2 * 6 and calls.count(target) == 3 * 6
    measure_cost(pair, list(range(3, 40)), gamma=2, repeats=3, drafters=())  # eager: none
    assert len(calls) == 30


@pytest.mark.parametrize("flag", [[], ["--eager"]])
def test_run_captures_where_capture_is_the_default_unless_eager(saved_pair, prompts_file, tmp_path, flag,
                                                                monkeypatch):
    """The CUDA default's wiring, on a CPU: with capture made the default here, `run` decodes the
    batch-1 policy and the B = 2 one (and their baselines) compiled, each still the target's own
    output, and run.json says how; --eager turns it off."""
    from dspark_bench.decoding import cached_lm

    monkeypatch.setitem(cached_lm.COMPILE_OPTIONS, "backend", "eager")
    monkeypatch.setattr(capture, "default_on", lambda device, eager: not eager)
    target, draft = saved_pair
    result = invoke("run", "--target", target, "--draft", draft, "--dataset", prompts_file, "--out", tmp_path,
                    "--threshold", "0.3", "--max-new-tokens", "8", "--limit", "2", "--batch-size", "1",
                    "--batch-size", "2", *flag)
    assert result.exit_code == 0, result.output
    (folder,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    info = json.loads((folder / "run.json").read_text())
    samples = pd.read_parquet(folder / "samples.parquet")
    assert samples["identical_to_baseline"].all()
    by_size = samples.groupby("batch_size")["compiled"].all().to_dict()
    if flag:
        assert by_size == {1: False, 2: False}
        assert info["capture"]["eager_flag"] is True and info["capture"]["policies"] == {"eager": 2}
    else:
        assert by_size == {1: True, 2: True}
        assert not samples["config_label"].str.contains("compiled").any()  # the labels asked for: callers match by them
        assert info["capture"]["policies"] == {"compiled": 2} and "eager_because" not in info["capture"]
    assert [c["compiled"] for c in info["configs"]] == [False, False]  # what was asked: a rerun asks it again
    decoded = invoke("decode", "def f(x):", "--target", target, "--draft", draft, "--max-new-tokens", "6", *flag)
    assert decoded.exit_code == 0, decoded.output
    assert ("compiled" in decoded.output) is not bool(flag)  # the policy it decoded with, as it ran

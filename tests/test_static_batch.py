"""The captured batched decoder (decoding/static_batch_lm.py): the padded layout on a static cache.

fp32 on a CPU, so its logits equal BatchLM's to rounding and its greedy rows equal each prompt
decoded alone exactly. The compiled forward runs on dynamo's "eager" backend (the static cache,
the traced forward and its guards, no code generation), as CUDA runs it by default.
"""

from __future__ import annotations

import random

import pytest
import tiny
import torch
from test_batched import PROMPTS, rounds_of

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding import cached_lm
from dspark_bench.decoding.batch_lm import BatchLM
from dspark_bench.decoding.batched import batched_autoregressive, batched_speculative
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.decoding.static_batch_lm import StaticBatchLM
from dspark_bench.errors import DsparkError
from dspark_bench.replay.cost import measure_surface

EOS = frozenset({1})


@pytest.fixture(autouse=True)
def no_codegen(monkeypatch):
    monkeypatch.setitem(cached_lm.COMPILE_OPTIONS, "backend", "eager")


@pytest.mark.parametrize("arch", ["llama_pair", "gpt2_pair"])
def test_the_static_layout_computes_what_the_padded_one_does(arch, request, monkeypatch):
    """Feeds of every length, rollbacks into holes, rows leaving and joining (a longer prompt
    than the cache's length included), and compaction when the columns run out: at every pass
    every row's logits equal BatchLM's."""
    target, _ = request.getfixturevalue(arch)
    compactions = []
    real = StaticBatchLM._compact
    monkeypatch.setattr(StaticBatchLM, "_compact", lambda lm: compactions.append(lm.columns) or real(lm))
    rng = random.Random(0)
    with torch.inference_mode():
        padded, static = BatchLM(target), StaticBatchLM(target, slots=4, capacity=64)
        for lm in (padded, static):
            for prompt in PROMPTS[:3]:
                lm.add(prompt[:-1])
        worst = 0.0
        for step in range(150):
            feeds = [[rng.randrange(2, 60) for _ in range(rng.randrange(0 if i else 1, 5))] for i in range(padded.rows)]
            a, b = padded.forward(feeds), static.forward(feeds)
            worst = max([worst] + [(a[i, : len(f)] - b[i, : len(f)]).abs().max().item()
                                   for i, f in enumerate(feeds) if f])
            back = [length - rng.randrange(0, len(f) + 1) for length, f in zip(padded.lengths, feeds)]
            for lm in (padded, static):
                lm.rollback(back)
                lm.tidy()
            if step in (40, 90):  # a row leaves, a longer one joins (its prefill passes the cache's length)
                for lm in (padded, static):
                    lm.remove(1)
                    lm.add(list(range(2, 2 + static.columns + 5)) if step == 40 else [7, 8])
            assert static.lengths == padded.lengths
            assert static.mask[static.slot_of].sum(dim=1).tolist() == static.lengths
    assert worst < 1e-4
    assert compactions and static.columns <= static.capacity  # the columns ran out and were compacted in place


@pytest.mark.parametrize("arch", ["llama_pair", "gpt2_pair"])
def test_captured_batches_decode_each_prompt_alone(arch, request):
    """Greedy, captured (compiled static caches) at B = 3 (rows join as others leave) and B = 8
    (more slots than prompts: free slots ride along): both sides give every prompt's batch-1
    tokens, and the speculative rows make the rounds the eager batched decoder makes."""
    target, draft = request.getfixturevalue(arch)
    for config in (DecodeConfig.of(threshold=0.4, gamma_max=4, max_new_tokens=20),
                   DecodeConfig.of(schedule="fixed", gamma_max=3, max_new_tokens=20, min_draft_len=1),
                   DecodeConfig.of(threshold=0.3, gamma_max=4, max_new_tokens=20, batch_quorum=0.5)):
        alone = [speculative_decode(target, draft, p, config, EOS) for p in PROMPTS]
        for batch_size in (3, 8):
            sized = config.replace(batch_size=batch_size)
            eager = batched_speculative(target, draft, PROMPTS, sized, batch_size, EOS)
            captured = batched_speculative(target, draft, PROMPTS, sized.replace(compiled=True), batch_size, EOS)
            plain = batched_autoregressive(target, PROMPTS, sized.replace(compiled=True), batch_size, EOS)
            assert [r.result.tokens for r in captured] == [r.tokens for r in alone]
            assert [r.result.tokens for r in plain] == [r.tokens for r in alone]
            assert [rounds_of(r.result) for r in captured] == [rounds_of(r.result) for r in eager]
    assert (("target", 8) not in cached_lm._STATIC[target]) and ("target", 6) in cached_lm._STATIC[target]


def test_captured_batches_sample_what_each_prompt_samples_alone(llama_pair):
    target, draft = llama_pair
    config = DecodeConfig.of(temperature=0.9, top_p=0.95, threshold=0.3, gamma_max=4, max_new_tokens=14)
    alone = [speculative_decode(target, draft, p, config).tokens for p in PROMPTS]
    captured = batched_speculative(target, draft, PROMPTS, config.replace(batch_size=3, compiled=True), 3)
    assert [r.result.tokens for r in captured] == alone


def test_one_static_cache_serves_one_batch_at_a_time():
    """Two batched decodes of one model and role would write the same cache: the second is refused
    while the first holds rows, and takes it over once the first has emptied."""
    model = tiny.llama(seed=5)
    with torch.inference_mode():
        first, second = StaticBatchLM(model, 2, 32), StaticBatchLM(model, 2, 32)
        first.add([3, 4])
        with pytest.raises(DsparkError, match="ran side by side"):
            second.add([5])
        first.remove(0)
        second.add([5])
        assert second.columns == 1 and second.rows == 1
        with pytest.raises(DsparkError, match="does not fit"):
            second.add(list(range(second.capacity + 1)))


def test_batched_prices_of_captured_passes(llama_pair, monkeypatch):
    """measure_surface(compiled=True) times B > 1 through the captured decoder's static caches,
    after three warm-ups a shape."""
    calls = []
    real = cached_lm.compiled_forward
    monkeypatch.setattr(cached_lm, "compiled_forward", lambda model: calls.append(model) or real(model))
    from dspark_bench.decoding import static_batch_lm
    monkeypatch.setattr(static_batch_lm, "compiled_forward", cached_lm.compiled_forward)
    target, draft = llama_pair
    pair = type("Pair", (), {"target": target, "draft": draft, "device": torch.device("cpu")})()
    surface = measure_surface(pair, list(range(3, 30)), gamma=2, batch_sizes=[3], repeats=2, drafters=(),
                              compiled=True)
    at3 = surface.at(3)
    assert at3.batch_size == 3 and len(at3.t_verify) == 3 and at3.t_draft > 0
    # B = 1 (measure_cost's 3 warm-ups + its 15 repeats a shape: the draft step, k = 0..2) and B = 3
    # (3 warm-ups + 2 repeats a shape, the same shapes): every timed pass went through the compiled forward
    assert calls.count(draft) == 18 + 5 and calls.count(target) == 3 * 18 + 3 * 5
    assert ("target", 3) in cached_lm._STATIC[target] and ("draft", 3) in cached_lm._STATIC[draft]

"""The captured batched decoder (decoding/static_batch_lm.py): the padded layout on a static cache.

fp32 on a CPU, so its logits equal BatchLM's to rounding and its greedy rows equal each prompt
decoded alone exactly. The compiled forward runs on dynamo's "eager" backend (the static cache,
the traced forward and its guards, no code generation), as CUDA runs it by default.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

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
from dspark_bench.measure.cost_model import measure_surface

EOS = frozenset({1})


@pytest.fixture(autouse=True)
def no_codegen(monkeypatch):
    monkeypatch.setitem(cached_lm.COMPILE_OPTIONS, "backend", "eager")


@pytest.mark.parametrize("arch", ["llama_pair", "gpt2_pair"])
def test_the_static_layout_computes_what_the_padded_one_does(arch, request, monkeypatch):
    """Feeds of every length (empty ones too), rollbacks into holes, rows leaving and joining (a
    prompt longer than the cache's length; a slot that stayed free through hundreds of passes),
    and compaction when the columns run out: at every pass every row's logits equal BatchLM's."""
    target, _ = request.getfixturevalue(arch)
    compacted = []  # (columns before, after) each time the columns ran out
    real = StaticBatchLM._compact
    monkeypatch.setattr(StaticBatchLM, "_compact", lambda lm: compacted.append((lm.columns, real(lm) or lm.columns)))
    rng = random.Random(0)
    with torch.inference_mode():
        padded, static = BatchLM(target), StaticBatchLM(target, slots=4, capacity=64)  # 256 columns: rounded up
        for lm in (padded, static):
            for prompt in PROMPTS[:3]:
                lm.add(prompt[:-1])
        worst = 0.0
        for step in range(500):
            feeds = [[rng.randrange(2, 60) for _ in range(rng.randrange(0 if i else 1, 5))] for i in range(padded.rows)]
            a, b = padded.forward(feeds), static.forward(feeds)
            worst = max([worst] + [(a[i, : len(f)] - b[i, : len(f)]).abs().max().item()
                                   for i, f in enumerate(feeds) if f])
            # Most drafts are rejected whole (holes), some keep a token: rows grow slower than columns.
            back = [length - len(f) + (len(f) > 0 and rng.random() < 0.3) for length, f in zip(padded.lengths, feeds)]
            for lm in (padded, static):
                lm.rollback(back)
                lm.tidy()
            if step in (40, 400):  # a row leaves, a longer one joins; at 400 a fourth into the slot free so far
                for lm in (padded, static):
                    lm.remove(1)
                    lm.add(list(range(2, 2 + static.columns + 5)) if step == 40 else [7, 8])
                    if step == 400:
                        lm.add([9, 10, 11])
            assert static.lengths == padded.lengths
            assert static.mask[static.slot_of].sum(dim=1).tolist() == static.lengths
            assert not static.mask[:, static.columns :].any()
    assert worst < 1e-4
    assert 3 in static.slot_of and static.rows == 4
    # The columns ran out and were compacted in place, down to the longest row.
    assert compacted and all(after < before for before, after in compacted)


def test_columns_past_every_rows_last_are_given_back(llama_pair):
    target, _ = llama_pair
    with torch.inference_mode():
        lm = StaticBatchLM(target, slots=2, capacity=32)
        lm.add([3, 4, 5])
        lm.add([6])
        lm.forward([[7, 8, 9], [10]])
        assert lm.columns == 6 and int(lm.cache.layers[0].cumulative_length) == 6
        lm.rollback([4, 2])  # row 0 keeps one of its three, row 1 its one: columns 4 and 5 are holes in both
        lm.tidy()
        assert lm.columns == 4 and int(lm.cache.layers[0].cumulative_length) == 4
        lm.remove(0)
        lm.tidy()  # row 1's tokens sit at columns 0 and 3
        assert lm.columns == 4 and lm.mask[lm.slot_of[0]].nonzero().flatten().tolist() == [0, 3]
        lm.forward([[12, 13]])
        # The free slot (row 0's) attends to its own new columns: no attention kernel sees a row
        # that sees nothing (what it gives differs by kernel: NaN in some, kept in the slot's cache).
        assert lm.mask[1 - lm.slot_of[0], 4:6].tolist() == [1, 1]


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
    """Two batched decodes of one model and role would write the same cache: one made while the
    first holds rows leaves them alone, is refused at its first row, and takes the cache over once
    the first has emptied."""
    model = tiny.llama(seed=5)
    with torch.inference_mode():
        first, padded = StaticBatchLM(model, 2, 32), BatchLM(model)
        for lm in (first, padded):
            lm.add([3, 4])
            lm.forward([[5, 6]])
        second = StaticBatchLM(model, 2, 32)
        assert torch.allclose(first.forward([[7]]), padded.forward([[7]]), atol=1e-5)  # its cache was not emptied
        with pytest.raises(DsparkError, match="ran side by side"):
            second.add([5])
        first.remove(0)
        second.add([5])
        assert second.columns == 1 and second.rows == 1
        with pytest.raises(DsparkError, match="does not fit"):
            second.add(list(range(second.capacity + 1)))


def test_batched_prices_of_captured_passes(llama_pair, monkeypatch):
    """measure_surface(compiled=True) times B > 1 through the captured decoder's static caches, as
    wide as the decodes' (`width`: a captured pass attends over every column), after three
    warm-ups a shape."""
    calls = []
    real = cached_lm.compiled_forward
    monkeypatch.setattr(cached_lm, "compiled_forward", lambda model: calls.append(model) or real(model))
    from dspark_bench.decoding import static_batch_lm
    monkeypatch.setattr(static_batch_lm, "compiled_forward", cached_lm.compiled_forward)
    target, draft = llama_pair
    pair = type("Pair", (), {"target": target, "draft": draft, "device": torch.device("cpu")})()
    surface = measure_surface(pair, list(range(3, 30)), gamma=2, batch_sizes=[3], repeats=2, drafters=(),
                              compiled=True, width=600)
    at3 = surface.at(3)
    assert at3.batch_size == 3 and len(at3.t_verify) == 3
    # B = 1 (measure_cost's 3 warm-ups + its 15 repeats a shape: a round's γ = 2 draft steps in turn,
    # k = 0..2) and B = 3 (3 warm-ups + 2 repeats a shape, one draft step): every timed pass went
    # through the compiled forward
    assert calls.count(draft) == 2 * 18 + 5 and calls.count(target) == 3 * 18 + 3 * 5
    assert cached_lm._STATIC[target]["target", 3][1] >= 600 and cached_lm._STATIC[draft]["draft", 3][1] >= 600


def test_a_warmed_captured_batch_compiles_nothing_more_when_it_runs():
    """runner.warm_static_batch meets every shape a captured batched run feeds, on caches as wide
    as its: the run itself (both sides) compiles no new graph, so none is compiled (or, on CUDA,
    captured) under its clock."""
    from torch._dynamo.utils import counters

    from dspark_bench.harness.runner import warm_static_batch

    target = tiny.llama(seed=7)
    draft = tiny.noisy_copy(target, 0.3)
    pair = SimpleNamespace(target=target, draft=draft)
    config = DecodeConfig.of(threshold=0.4, gamma_max=4, max_new_tokens=20, batch_size=3, compiled=True)
    warm_static_batch(pair, PROMPTS, config)
    graphs = counters["stats"]["unique_graphs"]
    rows = batched_speculative(target, draft, PROMPTS, config, 3, EOS)
    batched_autoregressive(target, PROMPTS, config, 3, EOS)
    assert counters["stats"]["unique_graphs"] == graphs
    assert any(r.accepted < r.drafted for request in rows for r in request.result.rounds)  # rollbacks happened

"""Fast checks of the offline reference pair pipeline (no real training)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from dspark_bench.reference import corpus
from dspark_bench.reference import train as T
from dspark_bench.reference.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer


def test_split_is_deterministic_and_by_file():
    keys = [f"stdlib/mod{i}.py" for i in range(2000)]
    splits = [corpus.split_of(k) for k in keys]
    assert splits == [corpus.split_of(k) for k in keys]
    held = splits.count("heldout") / len(splits)
    assert 0.02 < held < 0.09  # ~5 %
    # A file's docstrings follow the file, so held-out code never leaks via prose.
    assert all(corpus.split_of(k + "#docstrings") == s for k, s in zip(keys, splits))


@pytest.mark.parametrize("domain", corpus.DOMAINS)
def test_documents_non_empty_sorted_and_disjoint(domain):
    train = list(itertools.islice(corpus.iter_documents(domain, "train"), 30))
    held = list(itertools.islice(corpus.iter_documents(domain, "heldout"), 5))
    assert train and held
    assert all(d.text.strip() and d.domain == domain for d in train + held)
    assert [d.key for d in train] == sorted(d.key for d in train)
    assert all(corpus.split_of(d.key) == "train" for d in train)
    assert all(corpus.split_of(d.key) == "heldout" for d in held)
    assert not {d.key for d in train} & {d.key for d in held}
    assert all("/work/" not in d.key and not d.key.startswith("/") for d in train)


def test_code_keys_are_machine_independent():
    keys = {d.key for d in itertools.islice(corpus.iter_documents("code", "train"), 2000)}
    assert any(k.startswith("pkg/") for k in keys) or any(k.startswith("stdlib/") for k in keys)
    assert not any("/test/" in k or "/tests/" in k or "site-packages" in k for k in keys)


def _code_sample() -> str:
    doc = next(d for d in corpus.iter_documents("code", "train") if "    " in d.text and len(d.text) < 20_000)
    return doc.text


def test_tokenizer_round_trips_code(tmp_path):
    texts = [d.text for d in itertools.islice(corpus.iter_documents("code", "train"), 8)]
    tok = train_tokenizer(texts, vocab_size=300)
    save_tokenizer(tok, tmp_path / "tok")
    loaded = load_tokenizer(tmp_path / "tok")
    sample = _code_sample() + "\tx = 1  \n\n    \n"
    ids = loaded(sample, add_special_tokens=False)["input_ids"]
    assert loaded.decode(ids) == sample
    assert loaded.eos_token == loaded.bos_token == loaded.pad_token == "<|endoftext|>"


def test_batches_are_a_function_of_the_step():
    tokens = np.arange(10_000, dtype=np.uint16) % 300
    a = T.batch_at(tokens, 7, 4, 32, seed=1)
    assert torch.equal(a, T.batch_at(tokens, 7, 4, 32, seed=1))
    assert not torch.equal(a, T.batch_at(tokens, 8, 4, 32, seed=1))


def test_training_resumes_from_checkpoint(tmp_path):
    torch.set_num_threads(2)
    shape = T.Shape(layers=1, hidden=32, intermediate=64, heads=2)
    config = T.llama_config(shape, vocab_size=300)
    tokens = (np.arange(20_000) * 7 % 300).astype(np.uint16)
    cfg = T.TrainConfig(batch_size=2, seq_len=32, warmup_steps=2, ckpt_every_s=1e9)
    stage = tmp_path / "target"
    _, state = T.train_model(stage, config, tokens, budget_s=1e9, cfg=cfg, max_steps=6, stop_at_step=3)
    assert state["step"] == 3 and not state["done"]
    assert (stage / "ckpt.pt").exists()
    _, state = T.train_model(stage, config, tokens, budget_s=1e9, cfg=cfg, max_steps=6)
    assert state["step"] == 6 and state["done"]
    assert state["tokens_seen"] == 6 * 2 * 32  # resumed, not restarted from zero
    # Uninterrupted run reaches the same weights: resume is exact.
    m_resumed = torch.load(stage / "ckpt.pt", weights_only=False)["model"]
    _, _ = T.train_model(tmp_path / "straight", config, tokens, budget_s=1e9, cfg=cfg, max_steps=6)
    m_straight = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=False)["model"]
    for k in m_straight:
        torch.testing.assert_close(m_resumed[k], m_straight[k])


def test_distillation_step_runs(tmp_path):
    shape = T.Shape(layers=1, hidden=32, intermediate=64, heads=2)
    from transformers import LlamaForCausalLM

    teacher = LlamaForCausalLM(T.llama_config(shape, vocab_size=300)).eval()
    tokens = (np.arange(5_000) * 3 % 300).astype(np.uint16)
    cfg = T.TrainConfig(batch_size=2, seq_len=32, warmup_steps=1, ce_only_fraction=0.5)
    _, state = T.train_model(tmp_path / "draft", T.llama_config(shape, vocab_size=300), tokens,
                             budget_s=1e9, cfg=cfg, teacher=teacher, max_steps=4)
    assert state["done"] and np.isfinite(state["loss"])


def test_info_errors_clearly_when_not_built(monkeypatch, tmp_path):
    from dspark_bench.errors import DsparkError

    monkeypatch.setattr(T, "WEIGHTS_DIR", tmp_path)
    with pytest.raises(DsparkError, match="not built"):
        T.info()
    target, draft = T.default_pair_paths()
    assert target.parent == draft.parent == tmp_path

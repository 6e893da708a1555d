"""Build stages 1 and 2: the training sample and held-out text as JSONL, then the tokenizer
and the token arrays (.npy) cached beside them. Each stage is skipped when its output exists."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from dspark_bench.results import atomic_write, write_text

from . import corpus as corpus_mod
from .setup import TRAIN_BYTES, VAL_TOKENS, log
from .tokenizer import EOT, VOCAB_SIZE, load_tokenizer, save_tokenizer, train_tokenizer

# ---------------------------------------------------------------- stage 1: corpus


def _hash_order(key: str) -> bytes:
    return hashlib.sha256(b"order:" + key.encode()).digest()


def select_training_documents(byte_budget: dict[str, int]) -> list[corpus_mod.Document]:
    """A deterministic sample of the train split: documents in hash order up to a budget."""
    chosen = []
    for domain, budget in byte_budget.items():
        docs = sorted(corpus_mod.iter_documents(domain, "train"), key=lambda d: _hash_order(d.key))
        used = 0
        for doc in docs:
            if used >= budget:
                break
            chosen.append(doc)
            used += len(doc.text.encode())
    return chosen


def stage_corpus(out: Path, byte_budget: dict[str, int] = TRAIN_BYTES) -> dict:
    """Write the training sample and held-out texts as JSONL, plus a manifest."""
    manifest_path = out / "corpus_manifest.json"
    if manifest_path.exists():
        return json.loads(manifest_path.read_text())
    log("corpus: reading the local install (stdlib, package sources, docs)")
    train = select_training_documents(byte_budget)
    _write_jsonl(out / "corpus_train.jsonl", train)
    stats = {"train_selected": _domain_stats(train)}
    for domain in corpus_mod.DOMAINS:
        held = sorted(corpus_mod.iter_documents(domain, "heldout"), key=lambda d: _hash_order(d.key))
        _write_jsonl(out / f"corpus_heldout_{domain}.jsonl", held)
        stats[f"heldout_{domain}"] = _domain_stats(held)[domain]
        stats[f"train_all_{domain}"] = _domain_stats(corpus_mod.iter_documents(domain, "train"))[domain]
    manifest = {
        "byte_budget": byte_budget,
        "stats": stats,
        "fingerprints": {f"{d}/{s}": corpus_mod.corpus_fingerprint(d, s)
                         for d in corpus_mod.DOMAINS for s in corpus_mod.SPLITS},
    }
    write_text(manifest_path, json.dumps(manifest, indent=2, sort_keys=True))
    log(f"corpus: {json.dumps(stats)}")
    return manifest


def _domain_stats(docs) -> dict:
    stats: dict[str, dict] = {}
    for doc in docs:
        s = stats.setdefault(doc.domain, {"docs": 0, "bytes": 0})
        s["docs"] += 1
        s["bytes"] += len(doc.text.encode())
    return stats


def _write_jsonl(path: Path, docs) -> None:
    def write(partial: Path) -> None:
        with partial.open("w", encoding="utf-8") as f:
            for doc in docs:
                f.write(json.dumps({"key": doc.key, "domain": doc.domain, "text": doc.text}) + "\n")

    atomic_write(path, write)


def read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# ---------------------------------------------------------------- stage 2: tokenizer + token cache


def stage_tokenizer(out: Path, vocab_size: int = VOCAB_SIZE) -> dict:
    """Train the tokenizer on the training sample, then cache token arrays (.npy)."""
    tok_dir = out / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        log("tokenizer: training byte-level BPE")
        texts = [d["text"] for d in read_jsonl(out / "corpus_train.jsonl")]
        save_tokenizer(train_tokenizer(texts, vocab_size), tok_dir)
    tokenizer = load_tokenizer(tok_dir)
    counts = {}
    train_path = out / "tokens_train.npy"
    if not train_path.exists():
        docs = read_jsonl(out / "corpus_train.jsonl")
        _save_npy(train_path, encode_stream(tokenizer, [d["text"] for d in docs]))
    for domain in corpus_mod.DOMAINS:
        path = out / f"tokens_val_{domain}.npy"
        if not path.exists():
            docs = read_jsonl(out / f"corpus_heldout_{domain}.jsonl")
            _save_npy(path, encode_stream(tokenizer, [d["text"] for d in docs])[:VAL_TOKENS])
        counts[f"val_{domain}"] = int(np.load(path, mmap_mode="r").shape[0])
    counts["train"] = int(np.load(train_path, mmap_mode="r").shape[0])
    return counts


def encode_stream(tokenizer, texts: list[str]) -> np.ndarray:
    """Documents as one packed stream, each preceded by <|endoftext|> as a separator."""
    eot = tokenizer.convert_tokens_to_ids(EOT)
    backend = tokenizer.backend_tokenizer  # the Rust tokenizer: parallel, no length warnings
    parts = []
    for i in range(0, len(texts), 256):
        for enc in backend.encode_batch(texts[i:i + 256], add_special_tokens=False):
            parts.append(np.asarray([eot] + enc.ids, dtype=np.uint16))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def _save_npy(path: Path, array: np.ndarray) -> None:
    atomic_write(path, lambda partial: np.save(partial, array))  # the partial name ends in .npy too

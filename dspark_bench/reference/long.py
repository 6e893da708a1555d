"""The long-context reference pair: the shipped 256-token pair, trained on at 4,096 tokens.

Why a second pair and not a new first one: every measurement of the 256-token pair (docs,
`regress`'s baselines, the tests' numbers) stays reproducible, and a long-context question gets
a pair that can answer it. Same shapes, same tokenizer, so the two are compared position for
position, and the shipped files stay the size of the short pair's.

How: continued training, not a rebuild. The target starts from the shipped target's weights and
trains on windows of 4,096 tokens of long training documents (code files and prose pages of at
least LONG_DOC_BYTES), its RoPE unchanged (θ = 10,000): with 64-dimensional heads the slowest
rotary pair already has a 47 k-token wavelength, so "retrained at that length" needs no scaling,
and the short positions keep the frequencies they were trained on. The draft then starts from
the shipped draft and distils from the long target at the same length. Every stage checkpoints
(reference/train.py's `train_model`), so `dspark-bench models build --long` resumes after a kill.

What ships (weights/long/): the two fp16 folders and reference.json with held-out loss and
draft/target agreement per depth bucket (depth.DEPTH_EDGES) on held-out long documents, beside the
256-token pair's on the same windows.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from dspark_bench.depth import DEPTH_EDGES, depth_labels
from dspark_bench.errors import DsparkError
from dspark_bench.results import write_text

from . import corpus as corpus_mod
from .data import _hash_order, _save_npy, encode_stream
from .setup import CONTEXT, DRAFT_SHAPE, TARGET_SHAPE, TrainConfig, log, n_params
from .tokenizer import load_tokenizer

LONG_CONTEXT = 4096
LONG_DOC_BYTES = 12_000  # ~3,500 tokens of code: a document that fills most of a window
# Training text: long documents only, in hash order, up to these budgets. Prose pages that long
# are few, so they are all taken; code fills the rest.
LONG_TRAIN_BYTES = {"code": 16_000_000, "prose": 4_000_000}
VAL_WINDOWS = 24  # held-out windows of LONG_CONTEXT tokens per domain


def long_pair_paths() -> tuple[Path, Path]:
    """(target dir, draft dir) of the shipped long-context pair."""
    from .train import WEIGHTS_DIR

    return WEIGHTS_DIR / "long" / "target", WEIGHTS_DIR / "long" / "draft"


def long_config(shape, tokenizer):
    from .setup import llama_config

    config = llama_config(shape, len(tokenizer), tokenizer.eos_token_id)
    config.max_position_embeddings = LONG_CONTEXT
    return config


# ---------------------------------------------------------------- data


def long_documents(domain: str, split: str) -> list[corpus_mod.Document]:
    """The split's documents of at least LONG_DOC_BYTES, in hash order (the same on every machine)."""
    docs = [d for d in corpus_mod.iter_documents(domain, split) if len(d.text.encode()) >= LONG_DOC_BYTES]
    return sorted(docs, key=lambda d: _hash_order(d.key))


def stage_long_tokens(out: Path, tokenizer) -> dict:
    """tokens_long_train.npy (a packed stream of long training documents) and, per domain,
    tokens_long_val_<domain>.npy: VAL_WINDOWS windows of LONG_CONTEXT + 1 tokens, each from the
    start of its own held-out document (so a window's depth is the document's depth)."""
    counts = {}
    train_path = out / "tokens_long_train.npy"
    if not train_path.exists():
        log("long: reading long training documents")
        texts = []
        for domain, budget in LONG_TRAIN_BYTES.items():
            used = 0
            for doc in long_documents(domain, "train"):
                if used >= budget:
                    break
                texts.append(doc.text)
                used += len(doc.text.encode())
        order = sorted(range(len(texts)), key=lambda i: hashlib.sha256(texts[i].encode()).digest())
        _save_npy(train_path, encode_stream(tokenizer, [texts[i] for i in order]))
    counts["train"] = int(np.load(train_path, mmap_mode="r").shape[0])
    for domain in ("code", "prose"):
        path = out / f"tokens_long_val_{domain}.npy"
        if not path.exists():
            windows = []
            for doc in long_documents(domain, "heldout"):
                ids = encode_stream(tokenizer, [doc.text])  # EOT first: a document's own start
                if len(ids) > LONG_CONTEXT:
                    windows.append(ids[: LONG_CONTEXT + 1])
                if len(windows) == VAL_WINDOWS:
                    break
            if not windows:
                raise DsparkError(f"no held-out {domain} document of {LONG_CONTEXT} tokens in this install")
            _save_npy(path, np.stack(windows))
        counts[f"val_{domain}"] = int(np.load(path, mmap_mode="r").shape[0])
    return counts


# ---------------------------------------------------------------- evaluation by depth


def depth_buckets(edges=DEPTH_EDGES) -> list[str]:
    """The buckets a window of LONG_CONTEXT tokens fills: depth.DEPTH_LABELS up to 2k-4k."""
    return depth_labels(edges)[: len(edges) - 1]


@torch.inference_mode()
def loss_by_depth(model, windows: np.ndarray, draft=None, edges=DEPTH_EDGES) -> dict:
    """Mean next-token loss per depth bucket over held-out windows (and, given a draft, the share
    of positions where the draft's top-1 equals `model`'s: what greedy verification accepts).

    A model trained at a shorter context is read as it is (positions past its training length
    included): that is the point of comparing the two pairs here."""
    model.eval()
    n = min(windows.shape[1] - 1, edges[-1])
    loss_sum = np.zeros(n)
    agree_sum = np.zeros(n)
    for row in windows:
        ids = torch.from_numpy(np.asarray(row[: n + 1], dtype=np.int64))[None]
        logits = model(ids[:, :n]).logits[0].float()
        loss_sum += torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none").numpy()
        if draft is not None:
            agree_sum += (draft(ids[:, :n]).logits[0].argmax(-1) == logits.argmax(-1)).float().numpy()
    labels = depth_buckets(edges)
    result = {"loss": {}, "agreement_top1": {}}
    for label, lo, hi in zip(labels, edges[:-1], edges[1:]):
        hi = min(hi, n)
        result["loss"][label] = round(float(loss_sum[lo:hi].mean() / len(windows)), 4)
        if draft is not None:
            result["agreement_top1"][label] = round(float(agree_sum[lo:hi].mean() / len(windows)), 4)
    if draft is None:
        del result["agreement_top1"]
    return result


# ---------------------------------------------------------------- the build


def shipped_start(role: str):
    """The shipped 256-token model, in fp32, that the long one starts from."""
    from transformers import AutoModelForCausalLM

    from .train import default_pair_paths

    folder = default_pair_paths()[0 if role == "target" else 1]
    if not (folder / "config.json").is_file():
        raise DsparkError(f"the 256-token reference pair is not built ({folder} is missing): "
                          "run `dspark-bench models build` first")
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)


def build_long(out: Path = Path("build/long"), minutes: float = 40.0, export_to: Path | None = None) -> dict:
    """Run (or resume) the long pair's build: tokens, target, draft, export. Returns reference.json."""
    from .train import _fp16_roundtrip, train_model

    torch.set_num_threads(2)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    target_dir, _ = long_pair_paths()
    export_to = Path(export_to) if export_to is not None else target_dir.parent
    tokenizer = load_tokenizer(shipped_folder("target"))
    counts = stage_long_tokens(out, tokenizer)
    log(f"long: tokens {counts}")
    tokens = np.load(out / "tokens_long_train.npy")
    minutes_draft = min(12.0, 0.3 * minutes)
    cfg_target = TrainConfig(batch_size=2, seq_len=LONG_CONTEXT, lr=4e-4, warmup_steps=20, log_every_s=60.0)
    target, t_state = train_model(out / "target", long_config(TARGET_SHAPE, tokenizer), tokens,
                                  (minutes - minutes_draft) * 60, cfg_target, name="long target",
                                  init=shipped_start("target").state_dict())
    if not t_state["done"]:
        return {"interrupted": "long target", **t_state}
    teacher = _fp16_roundtrip(target)  # distil towards the target users will load
    for p in teacher.parameters():
        p.requires_grad_(False)
    cfg_draft = TrainConfig(batch_size=2, seq_len=LONG_CONTEXT, lr=6e-4, warmup_steps=20, log_every_s=60.0,
                            ce_only_fraction=0.0)
    draft, d_state = train_model(out / "draft", long_config(DRAFT_SHAPE, tokenizer), tokens, minutes_draft * 60,
                                 cfg_draft, teacher=teacher, name="long draft",
                                 init=shipped_start("draft").state_dict())
    if not d_state["done"]:
        return {"interrupted": "long draft", **d_state}
    return export_long(out, export_to, tokenizer, teacher, draft, {"target": t_state, "draft": d_state}, counts)


def shipped_folder(role: str) -> Path:
    from .train import default_pair_paths

    return default_pair_paths()[0 if role == "target" else 1]


def export_long(out: Path, export_to: Path, tokenizer, target, draft, states: dict, counts: dict) -> dict:
    """fp16 folders in `export_to`, and its reference.json: sizes, training, loss and agreement by
    depth for the long pair and, on the same windows, the 256-token pair."""
    import transformers
    from transformers import AutoModelForCausalLM

    from .export import _clone_half
    from .tokenizer import save_tokenizer

    for name, model in (("target", target), ("draft", draft)):
        folder = export_to / name
        folder.mkdir(parents=True, exist_ok=True)
        half = _clone_half(model)
        half.config.dtype = torch.float16
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            setattr(half.generation_config, key, tokenizer.eos_token_id)
        half.save_pretrained(str(folder), safe_serialization=True)
        save_tokenizer(tokenizer, folder)
    load = lambda folder: AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()  # noqa: E731
    long_pair = {n: load(export_to / n) for n in ("target", "draft")}
    short_pair = {n: load(shipped_folder(n)) for n in ("target", "draft")}
    by_depth = {}
    for domain in ("code", "prose"):
        windows = np.load(out / f"tokens_long_val_{domain}.npy")
        log(f"long: evaluating {domain} by depth ({len(windows)} windows)")
        by_depth[domain] = {
            "long target": loss_by_depth(long_pair["target"], windows, long_pair["draft"]),
            "long draft": loss_by_depth(long_pair["draft"], windows),
            "256-token target": loss_by_depth(short_pair["target"], windows, short_pair["draft"]),
            "256-token draft": loss_by_depth(short_pair["draft"], windows),
        }
    report = {
        "context": LONG_CONTEXT,
        "started_from": "the shipped 256-token pair (weights/target, weights/draft)",
        "rope": "unchanged (theta 10,000), trained at 4,096 tokens",
        "models": {n: {"layers": s.layers, "hidden": s.hidden, "params": n_params(long_pair[n]),
                       "train_minutes": round(states[n]["elapsed_s"] / 60, 2), "train_steps": states[n]["step"],
                       "tokens_seen": states[n]["tokens_seen"]}
                   for n, s in (("target", TARGET_SHAPE), ("draft", DRAFT_SHAPE))},
        "depth_buckets": depth_buckets(),
        "heldout_by_depth": by_depth,
        "tokens": counts,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "short_context": CONTEXT,
    }
    write_text(export_to / "reference.json", json.dumps(report, indent=2, sort_keys=True))
    log(f"long: exported to {export_to}")
    return report

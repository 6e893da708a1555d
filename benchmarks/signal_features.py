"""Would other inputs make the learned signal better? Held-out AUC of the learned signal's fit with
candidate features added, on a replay sweep's record (5-fold GroupKFold by prompt, as
replay/learned.py evaluates it).

Candidates, each what an engine could know when it drafts the token:
- the target's own confidence at the last token it verified before the round (top-1, margin,
  entropy of its distribution there), and its top-1 and entropy averaged over the last four
  verified tokens — one softmax of a verify pass's last row;
- the draft's signals at the *next* rollout step (top1, margin, lookup agreement), which only a
  rule that drafts on before deciding (verify-side) could read.

    python benchmarks/signal_features.py results/<a replay sweep's folder>

It loads the sweep's models and prompts (one target and one draft forward per prompt) and prints
one line per candidate. Not in the signal: none adds more than 0.003 on the code task's 40
held-out prompts (docs/sweeps-and-replay.md, "How good a signal would have to be").
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

from dspark_bench.prompts import encode
from dspark_bench.replay.acceptance import roc_auc
from dspark_bench.replay.learned import drafted, folds, make_model, used_steps
from dspark_bench.replay.record import Record, resolve_record
from dspark_bench.tuning.replay_sweep import prepare
from dspark_bench.tuning.spec import old_keys, parse_spec


@torch.inference_mode()
def target_confidence(pair, ids: list[list[int]], rec: Record) -> dict[str, np.ndarray]:
    """[P, N] per continuation position: the target's top-1, margin and entropy there."""
    P, N = rec.continuation.shape
    out = {name: np.full((P, N), np.nan) for name in ("top1", "margin", "entropy")}
    for p in range(P):
        n = int(rec.lengths[p])
        sequence = torch.tensor([ids[p] + rec.continuation[p, :n].tolist()], device=pair.target.device)
        probs = pair.target(sequence).logits[0, len(ids[p]) - 1 : len(ids[p]) - 1 + n].float().softmax(-1)
        top = probs.topk(2, -1).values.cpu()
        out["top1"][p, :n] = top[:, 0].numpy()
        out["margin"][p, :n] = (top[:, 0] - top[:, 1]).numpy()
        out["entropy"][p, :n] = -(probs * probs.clamp_min(1e-12).log()).sum(-1).cpu().numpy()
    return out


def held_out_auc(tokens, features: np.ndarray) -> float:
    predicted = np.empty(len(tokens.accepted))
    for train, test in folds(tokens):
        predicted[test] = make_model().fit(features[train], tokens.accepted[train]).predict_proba(features[test])[:, 1]
    return roc_auc(predicted, tokens.accepted)


def candidates(rec: Record, target: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each candidate's column(s) over the learned signal's tokens (learned.drafted's order)."""
    used = used_steps(rec)
    P, N, G = rec.rollout.shape
    prompt = np.broadcast_to(np.arange(P)[:, None, None], used.shape)[used]
    start = np.broadcast_to(np.arange(N)[None, :, None], used.shape)[used]

    def before(name: str, back: int) -> np.ndarray:  # the target's value `back` tokens before the round
        at = start - back
        return np.where(at >= 0, target[name][prompt, np.maximum(at, 0)], np.nan)

    def filled(values: np.ndarray) -> np.ndarray:  # the first round of a prompt has no history: the mean
        return np.nan_to_num(values, nan=float(np.nanmean(values)))

    last4 = {name: np.stack([before(name, b) for b in range(1, 5)], axis=1) for name in ("top1", "entropy")}
    out = {f"target {name} at the last verified token": filled(before(name, 1)) for name in ("top1", "margin", "entropy")}
    with warnings.catch_warnings():  # a prompt's first round has none of the four: NaN, filled below
        warnings.simplefilter("ignore", RuntimeWarning)
        out |= {f"target {name}, mean of the last four": filled(np.nanmean(v, axis=1)) for name, v in last4.items()}
    nxt = []
    for name in ("top1", "margin", "lookup_agrees"):
        value = rec.confidences[name].astype(np.float64)
        nxt.append(filled(np.concatenate([value[:, :, 1:], np.full((P, N, 1), np.nan)], axis=2)[used]))
    out["the draft's next step (top1, margin, lookup agreement)"] = np.stack(nxt, axis=1)
    out["all of the target's"] = np.column_stack([v for k, v in out.items() if k.startswith("target")])
    return out


def main(folder: Path) -> None:
    summary = json.loads((folder / "summary.json").read_text())
    info = json.loads((folder / "run.json").read_text())
    record_dir = resolve_record(folder, summary["record"])
    if record_dir is None:
        sys.exit(f"the sweep's record {summary['record']} is gone")
    rec = Record.load(record_dir)
    spec = parse_spec(old_keys(info["spec"]), str(folder))
    prepared = prepare(spec)
    ids = [encode(prepared.pair.tokenizer, p.text, spec.chat_template) for p in prepared.prompts]
    if [len(i) for i in ids] != list(rec.info.get("prompt_tokens", [])):
        sys.exit("the sweep's prompts no longer encode as its record's: run the sweep again")
    tokens = drafted(rec)
    base = held_out_auc(tokens, tokens.features)
    print(f"learned signal's own features: held-out AUC {base:.4f} ({len(tokens.accepted):,} drafted tokens)")
    for name, column in candidates(rec, target_confidence(prepared.pair, ids, rec)).items():
        column = column.reshape(len(tokens.accepted), -1)
        auc = held_out_auc(tokens, np.column_stack([tokens.features, column]))
        print(f"+ {name}: {auc:.4f} ({auc - base:+.4f})")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not (Path(sys.argv[1]) / "summary.json").is_file():
        sys.exit("usage: python benchmarks/signal_features.py SWEEP_FOLDER (a finished replay sweep's folder)")
    main(Path(sys.argv[1]))

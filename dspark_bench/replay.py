"""Replay: the outcome of every greedy policy from one recorded decoding pass.

Under greedy verification the output is the target's greedy continuation whatever the policy,
and a round starting after j generated tokens drafts the draft's own greedy rollout from that
point. So one record — the continuation, and at every position j the draft's rollout of
`gamma_record` tokens with every confidence metric — fixes every policy's rounds:

    a round at j drafts L(j) tokens (the schedule applied to the recorded confidences),
    the target accepts a(j) = min(L(j), M(j)) where M(j) is how far the rollout matches the
    continuation, and the next round starts at j + a(j) + 1.

`simulate` walks that round by round and yields the engine's own per-round rows;
`simulate_grid` does the same walk for thousands of policies at once, as array operations.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dspark_bench import confidence
from dspark_bench.baselines import autoregressive_decode
from dspark_bench.config import DecodeConfig
from dspark_bench.engine import Round
from dspark_bench.errors import DsparkError
from dspark_bench.metrics import rates
from dspark_bench.schedule import threshold_at

NEVER = 1 << 14  # "no such position" in int arrays (beyond any gamma)


@dataclass
class Record:
    """Arrays over prompts p, positions j (tokens generated so far) and rollout steps k."""

    continuation: np.ndarray  # [P, N] target greedy tokens, -1 past the end
    lengths: np.ndarray  # [P] tokens in each continuation (EOS included)
    rollout: np.ndarray  # [P, N, G] the draft's greedy proposal at step k from position j
    confidences: dict[str, np.ndarray]  # metric -> [P, N, G] confidence of that proposal
    eos_ids: tuple[int, ...]
    info: dict  # max_new_tokens, gamma_record, topk, fingerprints, prompt ids and categories

    @property
    def max_new_tokens(self) -> int:
        return int(self.info["max_new_tokens"])

    @property
    def gamma_record(self) -> int:
        return self.rollout.shape[2]

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {"continuation": self.continuation, "lengths": self.lengths, "rollout": self.rollout}
        arrays.update({f"confidence_{name}": values for name, values in self.confidences.items()})
        np.savez_compressed(folder / "record.npz", **arrays)
        (folder / "record.json").write_text(json.dumps({**self.info, "eos_ids": list(self.eos_ids)}, indent=2) + "\n")

    @classmethod
    def load(cls, folder: Path) -> "Record":
        folder = Path(folder)
        if not (folder / "record.npz").is_file() or not (folder / "record.json").is_file():
            raise DsparkError(f"{str(folder)!r} holds no replay record (record.npz + record.json)")
        try:
            info = json.loads((folder / "record.json").read_text())
            arrays = np.load(folder / "record.npz")
            confidences = {m: arrays[f"confidence_{m}"] for m in confidence.METRICS}
            return cls(arrays["continuation"], arrays["lengths"], arrays["rollout"], confidences,
                       tuple(info.pop("eos_ids")), info)
        except (OSError, KeyError, ValueError, json.JSONDecodeError) as err:
            raise DsparkError(f"replay record in {str(folder)!r} is unreadable: {err}") from None

    def check_matches(self, models: dict, prompts_fingerprint: str) -> None:
        """Refuse a record made with other models or prompts."""
        for key in ("target_fingerprint", "draft_fingerprint"):
            if self.info["models"].get(key) != models.get(key):
                raise DsparkError(f"replay record was made with another {key.split('_')[0]} model "
                                  f"({self.info['models'].get(key)} vs {models.get(key)}); record again")
        if self.info["prompts_fingerprint"] != prompts_fingerprint:
            raise DsparkError(f"replay record was made with other prompts ({self.info['prompts_fingerprint']} "
                              f"vs {prompts_fingerprint}); record again")


# --- recording -------------------------------------------------------------------------------


@torch.inference_mode()
def draft_rollouts(draft: torch.nn.Module, sequence: list[int], prompt_len: int, positions: int, steps: int,
                   topk: int, batch: int = 64):
    """The draft's greedy rollout of `steps` tokens from every position, batched.

    Row j's context is sequence[:prompt_len + j]; rows are left-padded to one length so a
    batch of positions runs together (they are independent).
    """
    device = next(draft.parameters()).device
    tokens = np.zeros((positions, steps), dtype=np.int64)
    scores = {m: np.zeros((positions, steps), dtype=np.float32) for m in confidence.METRICS}
    for start in range(0, positions, batch):
        rows = [sequence[: prompt_len + j] for j in range(start, min(start + batch, positions))]
        width = max(map(len, rows))
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows], device=device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
        cache = _new_cache()
        for step in range(steps):
            out = draft(input_ids=ids, attention_mask=mask, position_ids=position_ids, **_cache_kwargs(draft, cache))
            probs = torch.softmax(out.logits[:, -1].float(), dim=-1)
            choice = out.logits[:, -1].argmax(dim=-1)
            tokens[start : start + len(rows), step] = choice.cpu().numpy()
            for name, values in confidence.all_metrics(probs, topk).items():
                scores[name][start : start + len(rows), step] = values.cpu().numpy()
            ids = choice[:, None]
            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
            position_ids = position_ids[:, -1:] + 1
    return tokens, scores


def _new_cache():
    from transformers import DynamicCache

    return DynamicCache()


def _cache_kwargs(model, cache) -> dict:
    from dspark_bench.cache import _forward_kwargs

    name, _ = _forward_kwargs(model)
    return {name: cache, "use_cache": True}


def record(pair, prompt_ids: list[list[int]], max_new_tokens: int, gamma_record: int, topk: int = 5,
           info: dict | None = None, progress=None) -> Record:
    """Record the target's greedy continuation and the draft's rollouts for every prompt."""
    config = DecodeConfig(max_new_tokens=max_new_tokens)
    P, N, G = len(prompt_ids), max_new_tokens, gamma_record
    continuation = np.full((P, N), -1, dtype=np.int64)
    lengths = np.zeros(P, dtype=np.int64)
    rollout = np.full((P, N, G), -1, dtype=np.int64)
    scores = {m: np.zeros((P, N, G), dtype=np.float32) for m in confidence.METRICS}
    for p, ids in enumerate(prompt_ids):
        generated = autoregressive_decode(pair.target, ids, config, pair.eos_ids).tokens
        continuation[p, : len(generated)] = generated
        lengths[p] = len(generated)
        tokens, values = draft_rollouts(pair.draft, ids + generated, len(ids), len(generated), G, topk)
        rollout[p, : len(generated)] = tokens
        for name in scores:
            scores[name][p, : len(generated)] = values[name]
        if progress:
            progress()
    meta = {"max_new_tokens": N, "gamma_record": G, "topk": topk, **(info or {})}
    return Record(continuation, lengths, rollout, scores, tuple(sorted(pair.eos_ids)), meta)


# --- simulation, one policy at a time ---------------------------------------------------------


def match_lengths(rec: Record) -> np.ndarray:
    """M[p, j]: how many rollout tokens from j agree with the continuation, consecutively."""
    P, N, G = rec.rollout.shape
    ahead = np.full((P, N, G), -2, dtype=np.int64)
    for k in range(G):  # rollout step k from j proposes the continuation's token j + k
        ahead[:, : max(N - k, 0), k] = rec.continuation[:, k:]
    agree = rec.rollout == ahead
    return np.where(agree.all(axis=2), G, np.argmin(agree, axis=2))


def eos_positions(rec: Record) -> np.ndarray:
    """E[p, j]: the 1-based rollout step that proposes EOS, NEVER if none."""
    is_eos = np.isin(rec.rollout, rec.eos_ids) if rec.eos_ids else np.zeros(rec.rollout.shape, bool)
    return np.where(is_eos.any(axis=2), np.argmax(is_eos, axis=2) + 1, NEVER)


def check_replayable(rec: Record, config: DecodeConfig) -> None:
    if not config.greedy:
        raise DsparkError("replay needs greedy verification; sampling always runs the real decoder")
    if config.max_new_tokens != rec.max_new_tokens:
        raise DsparkError(f"max_new_tokens {config.max_new_tokens} differs from the record's {rec.max_new_tokens}")
    if config.gamma_max > rec.gamma_record:
        raise DsparkError(f"gamma_max {config.gamma_max} exceeds the record's {rec.gamma_record}; record deeper")
    if config.metric == "topk_mass" and config.topk != rec.info["topk"]:
        raise DsparkError(f"the record has topk_mass for k={rec.info['topk']}, not k={config.topk}")


def first_failures(rec: Record, config: DecodeConfig) -> np.ndarray:
    """T[p, j]: the 1-based step whose proposal the schedule drops, NEVER if none."""
    signal = rec.confidences[config.metric].astype(np.float64)
    # float32 storage, float64 products: the engine multiplies Python floats of float32 values.
    if config.schedule == "cumulative":
        signal = np.cumprod(signal, axis=2)
    thresholds = np.array([threshold_at(config, k) for k in range(1, rec.gamma_record + 1)])
    kept = signal >= thresholds
    kept[:, :, : config.min_draft_len] = True
    return np.where(kept.all(axis=2), NEVER, np.argmin(kept, axis=2) + 1)


def round_plan(rec: Record, config: DecodeConfig):
    """Per (p, j): drafted L, draft forwards s and stop reason code, vectorised over positions."""
    P, N, _ = rec.rollout.shape
    budget = config.max_new_tokens - np.arange(N) - 1
    limit = np.minimum(config.gamma_max, budget)[None, :].repeat(P, axis=0)
    fail, eos = first_failures(rec, config), eos_positions(rec)
    by_threshold = fail <= np.minimum(eos, limit)
    by_eos = ~by_threshold & (eos <= limit)
    drafted = np.where(by_threshold, fail - 1, np.where(by_eos, eos, limit))
    forwards = np.where(by_threshold, fail, drafted)
    reason = np.where(by_threshold, 0, np.where(by_eos, 2, np.where(limit == config.gamma_max, 1, 3)))
    return drafted, forwards, reason


REASONS = ("threshold", "gamma_max", "eos", "budget")


def simulate(rec: Record, config: DecodeConfig) -> list[list[Round]]:
    """The engine's rounds for every prompt, from the record alone (greedy only)."""
    check_replayable(rec, config)
    drafted, forwards, reason = round_plan(rec, config)
    matches = match_lengths(rec)
    eos = set(rec.eos_ids)
    result = []
    for p in range(len(rec.lengths)):
        rounds, j, n = [], 0, int(rec.lengths[p])
        while j < n:
            L = int(drafted[p, j])
            a = min(L, int(matches[p, j]))
            proposal = rec.rollout[p, j, :L].tolist()
            ended_in_draft = a > 0 and proposal[a - 1] in eos
            target_token = -1 if ended_in_draft else int(rec.continuation[p, j + a])
            s = int(forwards[p, j])
            conf = rec.confidences[config.metric][p, j, :s].astype(np.float64).tolist()
            rounds.append(Round(L, a, a if ended_in_draft else a + 1, REASONS[reason[p, j]], proposal, conf,
                                target_token, s))
            j += a if ended_in_draft else a + 1
        result.append(rounds)
    return result


# --- simulation of a whole grid at once -------------------------------------------------------

GRID_CHUNK = 512  # policies walked together; bounds memory at about chunk × P × N × 4 bytes


def _failure_key(config: DecodeConfig) -> tuple:
    """Policies with equal keys drop the same draft positions; gamma_max only caps them
    (except for the ramp, whose thresholds are spread over gamma_max)."""
    knobs = {"threshold": (config.threshold,), "cumulative": (config.threshold,), "fixed": (),
             "ramp": (config.threshold_start, config.threshold_end, config.gamma_max)}[config.schedule]
    return config.metric, config.schedule, config.min_draft_len, knobs


def _plans(rec: Record, configs: list[DecodeConfig], eos: np.ndarray, failures: dict) -> tuple[np.ndarray, np.ndarray]:
    """drafted and draft forwards [C, P, N] (int16), the same rule as `round_plan`, for all
    policies at once: policies differing only in gamma_max share their failure positions."""
    P, N, G = rec.rollout.shape
    keys = [_failure_key(c) for c in configs]
    for key, config in zip(keys, configs):
        if key not in failures:
            failures[key] = np.minimum(first_failures(rec, config), G + 1).astype(np.int16)
    order = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    fail = np.stack([failures[key] for key in order])[[order[k] for k in keys]]  # [C, P, N]
    gamma = np.array([c.gamma_max for c in configs], dtype=np.int16)[:, None, None]
    budget = (rec.max_new_tokens - np.arange(N) - 1).astype(np.int16)
    cap = np.minimum(np.minimum(eos, G + 1).astype(np.int16)[None], np.minimum(gamma, budget[None, None, :]))
    by_threshold = fail <= cap
    return np.where(by_threshold, fail - 1, cap), np.where(by_threshold, fail, cap)


def _round_starts(rec: Record, step: np.ndarray) -> np.ndarray:
    """[C, P, N] bool: where a round starts, following j -> j + step(j) from 0 for every
    (policy, prompt) at once."""
    C, P, N = step.shape
    sink = N  # one column past the end, where a finished sequence stays
    nxt = np.full((C, P, N + 1), sink, dtype=np.int16)
    np.add(np.arange(N, dtype=np.int16), step, out=nxt[:, :, :N])
    np.putmask(nxt[:, :, :N], nxt[:, :, :N] >= rec.lengths[None, :, None], sink)
    nxt = nxt.ravel()
    visited = np.zeros(C * P * (N + 1), dtype=bool)
    base = np.arange(C * P) * (N + 1)
    pos = np.where(np.tile(rec.lengths, C) > 0, 0, sink)
    for iteration in itertools.count(1):
        index = base + pos
        visited[index] = True  # finished sequences mark their sink column, which is dropped
        pos = nxt[index]
        if iteration % 16 == 0:  # drop finished sequences now and then, not every step
            alive = pos != sink
            if not alive.any():
                break
            base, pos = base[alive], pos[alive]
    return visited.reshape(C, P, N + 1)[:, :, :N]


def simulate_grid(rec: Record, configs: list[DecodeConfig], cost: "CostModel | None" = None) -> pd.DataFrame:
    """Totals, metrics and (with a cost model) predicted speedup for every policy, vectorised."""
    for config in configs:
        check_replayable(rec, config)
    P, N, G = rec.rollout.shape
    if rec.max_new_tokens >= np.iinfo(np.int16).max:
        raise DsparkError("replay grids handle at most 32,766 new tokens per prompt")
    matches, eos = match_lengths(rec).astype(np.int16), eos_positions(rec)
    is_eos = np.isin(rec.rollout, rec.eos_ids) if rec.eos_ids else np.zeros(rec.rollout.shape, bool)
    eos_cells = np.nonzero(is_eos.any(axis=2))  # the few (p, j) whose rollout proposes EOS
    verify_cost = np.asarray(cost.t_verify if cost else np.zeros(G + 1))
    failures: dict = {}
    rows = []
    for start in range(0, len(configs), GRID_CHUNK):
        chunk = configs[start : start + GRID_CHUNK]
        drafted, forwards = _plans(rec, chunk, eos, failures)
        accepted = np.minimum(drafted, matches)
        step = accepted + 1
        if eos_cells[0].size:
            # An accepted EOS inside the draft ends the sequence without the target's extra token.
            took = accepted[:, eos_cells[0], eos_cells[1]]
            ended = is_eos[eos_cells[0], eos_cells[1], np.maximum(took - 1, 0)] & (took > 0)
            step[:, eos_cells[0], eos_cells[1]] -= ended
        visited = _round_starts(rec, step)
        flat = visited.reshape(len(chunk), -1)

        def total(values: np.ndarray) -> np.ndarray:
            # A product with the mask then a sum: several times faster than sum(where=mask).
            return (values.reshape(len(chunk), -1) * flat).sum(axis=1, dtype=np.int64)

        totals = {
            "rounds": np.count_nonzero(flat, axis=1), "drafted": total(drafted), "accepted": total(accepted),
            "full": total(accepted == drafted), "forwards": total(forwards),
            # Σ over rounds of t_verify(L) = Σ over L of (rounds drafting L) × t_verify(L)
            "verify": sum(total(drafted == k) * verify_cost[k] for k in range(G + 1) if verify_cost[k]),
        }
        for c, config in enumerate(chunk):
            rows.append(_grid_row(start + c, config, {k: (v[c] if np.ndim(v) else v) for k, v in totals.items()},
                                  rec, cost))
    return pd.DataFrame(rows)


def _grid_row(config_id: int, config: DecodeConfig, totals: dict, rec: Record, cost) -> dict:
    tokens = int(rec.lengths.sum())
    summed = {"rounds": int(totals["rounds"]), "drafted_total": int(totals["drafted"]),
              "accepted_total": int(totals["accepted"]), "emitted_total": tokens, "full_blocks": int(totals["full"])}
    knobs = {name: getattr(config, name) for name in config.__dataclass_fields__}  # asdict is slow here
    row = {"config_id": config_id, "config_label": config.label(), **knobs, **summed, **rates(summed),
           "draft_forwards": int(totals["forwards"]), "new_tokens": tokens,
           "draft_forwards_per_token": int(totals["forwards"]) / max(tokens, 1)}
    if cost is not None:
        row["predicted_speedup"] = tokens * cost.t_verify[0] / (totals["forwards"] * cost.t_draft + totals["verify"])
    return row


# --- cost model -------------------------------------------------------------------------------


@dataclass
class CostModel:
    """Measured seconds: one draft step, and one target pass over k + 1 new positions."""

    t_draft: float
    t_verify: list[float]  # index k = 0 .. gamma: draft length verified
    context_tokens: int  # cache length the timings were taken at

    def to_dict(self) -> dict:
        return {"t_draft": self.t_draft, "t_verify": list(self.t_verify), "context_tokens": self.context_tokens}

    @classmethod
    def from_dict(cls, data: dict) -> "CostModel":
        return cls(float(data["t_draft"]), [float(t) for t in data["t_verify"]], int(data["context_tokens"]))

    def predict(self, rounds: list[Round], tokens: int) -> float:
        """DESIGN.md: N * t_verify(0) / sum over rounds of (s_r * t_draft + t_verify(L_r))."""
        spent = sum(r.draft_forwards * self.t_draft + self.t_verify[r.drafted] for r in rounds)
        return tokens * self.t_verify[0] / spent


@torch.inference_mode()
def measure_cost(pair, context: list[int], gamma: int, repeats: int = 15) -> CostModel:
    """Median timings with the caches holding `context`, interleaved across k to share drift."""
    from dspark_bench.cache import CachedLM
    from dspark_bench.runner import synchronize

    import statistics
    import time

    target, draft = CachedLM(pair.target), CachedLM(pair.draft)
    target.prefill(context)
    draft.prefill(context)
    samples = {k: [] for k in range(-1, gamma + 1)}  # -1: the draft step
    filler = context[-gamma - 1 :] * (gamma + 1)

    def clock(lm, tokens):
        synchronize(pair.device)
        start = time.perf_counter()
        lm.forward(tokens, keep=len(tokens))  # the engine reads logits of every verified position
        synchronize(pair.device)
        lm.rollback(len(context))
        return time.perf_counter() - start

    for _ in range(repeats + 2):  # the first two passes warm up
        samples[-1].append(clock(draft, filler[:1]))
        for k in range(gamma + 1):
            samples[k].append(clock(target, filler[: k + 1]))
    median = {k: statistics.median(v[2:]) for k, v in samples.items()}
    return CostModel(median[-1], [median[k] for k in range(gamma + 1)], len(context))

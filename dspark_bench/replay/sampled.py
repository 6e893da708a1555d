"""Replay under sampling: every policy at a temperature > 0 from one sampled record, exact in
distribution (docs/policy-and-metrics.md#replay-under-sampling has the argument).

Speculative sampling's output is distributed as the target's own samples. So take K sampled
paths y of the target per prompt, and record at every position m of each:

- a_m = min(1, q_m(y_m) / p_m(y_m)): given that the output at m is y_m, the chance that a token
  the draft proposed there, on the path, was accepted (P(accepted, output = y) = min(p(y), q(y)));
- every confidence signal of the draft's distribution q_m there: what the schedule reads;
- one post-rejection rollout: the rejected token r_m ~ norm(max(q_m - p_m, 0)), then the draft's
  own sampled continuation after it with its confidences: what the rest of a round that was
  rejected at m drafts.

p and q are those the verifier compares, after the same temperature and top-p
(decoding/sampling.py). A replicate draws one coin u_m per position, shared by every policy
(common random numbers): a round from j stays on the path while u_m < a_m, and its draft steps
after the first rejection read the rollout from there. That is a greedy-shaped Record — the
rollout and confidences each round start sees, and how many tokens the coins accept
(Record.matches) — which simulate.py's walk replays for every policy as it is. At temperature 0
(p and q one-hot) a replicate is the greedy record. The lookup drafter proposes the same tokens
whatever it is shown (q one-hot): its sampled record is a greedy-shaped one over the paths.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dspark_bench.config import DecodeConfig, Drafting
from dspark_bench.decoding import confidence
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.sampling import distribution, draw
from dspark_bench.errors import DsparkError
from dspark_bench.metrics import rates
from dspark_bench.replay.record import Record, draft_rollouts, record
from dspark_bench.results import provenance

# K, the sampled paths per prompt: each costs a plain pass to sample and a draft rollout pass to
# record. Four give the expectation's interval three degrees of freedom (paths are the
# replicates; prompts within a path are not independent draws of a policy's speed) at four times
# a greedy record's cost.
PATHS = 4
DRAWS = 4  # coin draws per path: they narrow the coins' share of the noise, not the paths'
SEED_STRIDE = 7919  # prompt p's path k is sampled with seed + SEED_STRIDE · p + k


def sampling_of(config: DecodeConfig, paths: int = PATHS, draws: int = DRAWS) -> dict:
    """What a sampled record was sampled with (record.json's "sampling"): replay refuses another."""
    return {"temperature": config.verification.temperature, "top_p": config.verification.top_p,
            "seed": config.verification.seed, "paths": paths, "draws": draws}


@dataclass
class SampledRecord:
    """Arrays over rows r (prompt r // K, its path r % K), positions m and rollout steps k."""

    paths: np.ndarray  # [R, N] the target's sampled tokens, -1 past the end
    lengths: np.ndarray  # [R]
    p_token: np.ndarray  # [R, N] float64: p_m(y_m), the target's probability of its own token
    q_token: np.ndarray  # [R, N] float64: q_m(y_m), the draft's, on the path
    rollout: np.ndarray  # [R, N, G]: r_m, then the draft's sampled continuation after it
    confidences: dict[str, np.ndarray]  # signal -> [R, N, G] of the rollout's steps (step 0: q_m's, on the path)
    eos_ids: tuple[int, ...]
    info: dict  # as a Record's, with "sampling" (sampling_of) and rows' prompt tokens

    drafter = Record.drafter
    max_new_tokens = Record.max_new_tokens
    check_matches = Record.check_matches

    @property
    def gamma_record(self) -> int:
        return self.rollout.shape[2]

    @property
    def continuation(self) -> np.ndarray:
        """The paths, as a greedy record's continuation: what the cost model is timed on."""
        return self.paths

    @property
    def accept(self) -> np.ndarray:
        """a_m = min(1, q_m(y_m) / p_m(y_m)) [R, N] (1 where the path has ended: never read)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.p_token > 0, np.minimum(1.0, self.q_token / self.p_token), 1.0)

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {"paths": self.paths, "lengths": self.lengths, "p_token": self.p_token, "q_token": self.q_token,
                  "rollout": self.rollout, **{f"confidence_{n}": v for n, v in self.confidences.items()}}
        np.savez_compressed(folder / "record.npz", **arrays)
        (folder / "record.json").write_text(json.dumps({**self.info, "eos_ids": list(self.eos_ids)}, indent=2) + "\n")


def load(folder: Path) -> Record | SampledRecord:
    """A replay record of either kind: greedy (or a lookup's over sampled paths), or sampled."""
    folder = Path(folder)
    if not (folder / "record.npz").is_file():
        return Record.load(folder)  # which says, in one line, that there is none
    try:
        with np.load(folder / "record.npz") as arrays:
            sampled = "paths" in arrays.files
    except (OSError, ValueError) as err:
        raise DsparkError(f"replay record in {str(folder)!r} is unreadable: {err}") from None
    if not sampled:
        return Record.load(folder)
    try:
        info = json.loads((folder / "record.json").read_text())
        arrays = np.load(folder / "record.npz")
        confidences = {name.removeprefix("confidence_"): arrays[name] for name in arrays.files
                       if name.startswith("confidence_")}
        return SampledRecord(arrays["paths"], arrays["lengths"], arrays["p_token"], arrays["q_token"],
                             arrays["rollout"], confidences, tuple(info.pop("eos_ids")), info)
    except (OSError, KeyError, ValueError, json.JSONDecodeError) as err:
        raise DsparkError(f"replay record in {str(folder)!r} is unreadable: {err}") from None


# --- recording -------------------------------------------------------------------------------


@dataclass
class PathRecord:
    """One sampled path of one prompt and what replay needs at each of its positions."""

    path: list[int]
    p_token: np.ndarray
    q_token: np.ndarray
    tokens: np.ndarray  # [n, G] r_m and the rollout after it
    scores: dict[str, np.ndarray]  # signal -> [n, G]


def one_hot_if_greedy(logits: torch.Tensor, config: DecodeConfig) -> torch.Tensor:
    """The distribution a token is drawn from: the processed one, or greedy's one-hot argmax."""
    if config.greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).double()
    return distribution(logits, config).double()


@torch.inference_mode()
def record_path(pair, ids: list[int], config: DecodeConfig, gamma: int, topk: int, seed: int,
                eos_ids: frozenset[int]) -> PathRecord:
    """Sample the target's path (a plain decode at the config's temperature and top-p, `seed`),
    read p and q along it (one forward of each model), draw each position's rejected token from
    the residual and roll the draft out from it (record.draft_rollouts, sampling)."""
    path = autoregressive_decode(pair.target, ids, config.replace(seed=seed), eos_ids).tokens
    n, device = len(path), next(pair.draft.parameters()).device
    context = torch.tensor([ids + path[:-1]], device=device)
    p = one_hot_if_greedy(pair.target(input_ids=context).logits[0, len(ids) - 1 :], config)
    q = one_hot_if_greedy(pair.draft(input_ids=context).logits[0, len(ids) - 1 :], config)
    y = torch.tensor(path, device=device)[:, None]
    residual = (q - p).clamp_min(0.0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, q)  # p == q: never rejected
    generator = torch.Generator(device=device).manual_seed(seed + 1)
    rejected = draw(residual, generator)

    def choose(step: int, rows: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if step == 0:
            return rejected[rows]
        return logits.argmax(dim=-1) if config.greedy else draw(distribution(logits, config), generator)

    tokens, scores = draft_rollouts(pair.draft, ids + path, len(ids), n, gamma, topk, choose=choose,
                                    probs_of=lambda logits: distribution(logits, config))
    return PathRecord(path, p.gather(1, y)[:, 0].cpu().numpy(), q.gather(1, y)[:, 0].cpu().numpy(), tokens, scores)


def record_sampled(pair, prompt_ids: list[list[int]], config: DecodeConfig, gamma: int, topk: int = 5,
                   paths: int = PATHS, info: dict | None = None, progress=None, eos_ids: frozenset[int] | None = None,
                   drafter: Drafting | None = None) -> Record | SampledRecord:
    """`paths` sampled paths of every prompt at `config`'s temperature and top-p, recorded for
    replay: a SampledRecord for the draft model, a greedy-shaped Record over the paths for the
    lookup drafter (its proposals do not depend on what was accepted)."""
    eos_ids = pair.eos_ids if eos_ids is None else frozenset(eos_ids)
    drafter = drafter or Drafting()
    if drafter.drafter == "heads":
        raise DsparkError("sampled replay records the draft model and the lookup drafter; the heads drafter at "
                          "temperature > 0 is timed (--evaluation real)")
    seeds = [[config.verification.seed + SEED_STRIDE * p + k for k in range(paths)] for p in range(len(prompt_ids))]
    rows = [ids for ids in prompt_ids for _ in range(paths)]
    meta = {**(info or {}), "sampling": sampling_of(config, paths), "path_seeds": seeds, "paths_of": len(prompt_ids)}
    if drafter.drafter == "lookup":
        drawn = []
        for ids, row_seeds in zip(prompt_ids, seeds):
            drawn += [autoregressive_decode(pair.target, ids, config.replace(seed=seed), eos_ids).tokens
                      for seed in row_seeds]
            if progress:
                progress()
        return record(pair, rows, config.verification.max_new_tokens, gamma, topk, meta, None, eos_ids, drafter,
                      continuations=drawn)
    parts = []
    for ids, row_seeds in zip(prompt_ids, seeds):
        for seed in row_seeds:
            parts.append(record_path(pair, ids, config, gamma, topk, seed, eos_ids))
        if progress:
            progress()
    return assemble(parts, rows, config.verification.max_new_tokens, gamma, topk, eos_ids, drafter, meta)


def assemble(parts: list[PathRecord], rows: list[list[int]], max_new_tokens: int, gamma: int, topk: int,
             eos_ids: frozenset[int], drafter: Drafting, info: dict) -> SampledRecord:
    R, N, G = len(parts), max_new_tokens, gamma
    paths, lengths = np.full((R, N), -1, dtype=np.int64), np.zeros(R, dtype=np.int64)
    p_token, q_token = np.ones((R, N)), np.ones((R, N))
    rollout = np.full((R, N, G), -1, dtype=np.int64)
    scores = {m: np.zeros((R, N, G), dtype=np.float32) for m in confidence.SIGNALS}
    for r, part in enumerate(parts):
        n = len(part.path)
        paths[r, :n], lengths[r], p_token[r, :n], q_token[r, :n] = part.path, n, part.p_token, part.q_token
        rollout[r, :n] = part.tokens
        for name, values in part.scores.items():
            scores[name][r, :n] = values
    meta = {"max_new_tokens": N, "gamma_record": G, "topk": topk, **provenance(), **info,
            "prompt_tokens": [len(ids) for ids in rows], "drafter": dataclasses.asdict(drafter)}
    return SampledRecord(paths, lengths, p_token, q_token, rollout, scores, tuple(sorted(eos_ids)), meta)


# --- replicates: what a sampled record replays as ---------------------------------------------


def coins(rec, draws: int, seed: int) -> np.ndarray:
    """[draws, R, N] uniforms, one per position: shared by every policy replayed on `rec`."""
    return np.random.default_rng(seed).random((draws, len(rec.lengths), rec.max_new_tokens))


def on_coins(rec: SampledRecord, rows: np.ndarray, u: np.ndarray, accept: np.ndarray | None = None) -> Record:
    """The greedy-shaped Record of `rows` under the coins `u` [len(rows), N]: at round start j,
    rollout step k is the path's token y_{j+k} while the coins accept (k < M_j), then the rollout
    recorded after the first rejection at j + M_j; M_j is how many the target accepts."""
    paths, n, accept = rec.paths[rows], rec.lengths[rows], (rec.accept if accept is None else accept)[rows]
    R, N, G = len(rows), rec.max_new_tokens, rec.gamma_record
    position = np.arange(N)
    rejected = (u >= accept) | (position[None, :] >= n[:, None])  # past the end: nothing to accept
    first = np.minimum.accumulate(np.where(rejected, position, N)[:, ::-1], axis=1)[:, ::-1]  # j + M_j
    matched = first - position  # M_j
    step = np.arange(G)[None, None, :]
    on_path = step < matched[:, :, None]
    at = np.minimum(position[None, :, None] + step, N - 1)  # the path's position of step k, on the path
    after = np.clip(step - matched[:, :, None], 0, G - 1)  # the step of the rollout from j + M_j
    where = np.minimum(first, N - 1)[:, :, None]
    r = np.arange(R)[:, None, None]
    rolled = rec.rollout[rows]
    ended = (first >= n[:, None])[:, :, None]  # accepted to the path's end: its rollout is never read
    tokens = np.where(on_path, paths[r, at], np.where(ended, -1, rolled[r, where, after]))
    scores = {}
    for name, values in rec.confidences.items():
        mine = values[rows]  # indexed once per signal
        scores[name] = np.where(on_path, mine[r, at, 0], mine[r, where, after]).astype(np.float32)
    info = {**rec.info, "prompt_tokens": [rec.info["prompt_tokens"][i] for i in rows]}
    return Record(paths, n, tokens, scores, rec.eos_ids, info, matches=np.minimum(matched, G))


def rows_of(rec: Record, rows: np.ndarray) -> Record:
    """Some rows of a greedy-shaped record (the lookup's over sampled paths: one path's rows)."""
    info = {**rec.info, "prompt_tokens": [rec.info["prompt_tokens"][i] for i in rows]}
    return Record(rec.continuation[rows], rec.lengths[rows], rec.rollout[rows],
                  {name: values[rows] for name, values in rec.confidences.items()}, rec.eos_ids, info,
                  rec.available[rows])


def replicates(rec, seed: int = 0) -> list[Record]:
    """What a sampled record replays as: per path k, one Record of every prompt's k-th path
    under each of the record's coin draws (stacked); a greedy record is its own one replicate."""
    sampling = rec.info.get("sampling")
    if sampling is None:
        return [rec]
    K = sampling["paths"]
    if isinstance(rec, Record):  # the lookup's: its proposals are the same whatever the coins
        return [rows_of(rec, np.arange(k, len(rec.lengths), K)) for k in range(K)]
    u, accept = coins(rec, sampling["draws"], seed), rec.accept  # a_m once, for every path and draw
    out = []
    for k in range(K):
        rows = np.arange(k, len(rec.lengths), K)
        parts = [on_coins(rec, rows, u[d, rows], accept) for d in range(len(u))]
        out.append(stack(parts))
    return out


def stack(parts: list[Record]) -> Record:
    """Records of the same shape as one, rows after rows."""
    first = parts[0]
    matches = None if first.matches is None else np.concatenate([p.matches for p in parts])
    return Record(np.concatenate([p.continuation for p in parts]), np.concatenate([p.lengths for p in parts]),
                  np.concatenate([p.rollout for p in parts]),
                  {name: np.concatenate([p.confidences[name] for p in parts]) for name in first.confidences},
                  first.eos_ids, {**first.info, "prompt_tokens": sum((p.info["prompt_tokens"] for p in parts), [])},
                  np.concatenate([p.available for p in parts]), matches)


def as_one(rec) -> Record:
    """Every replicate of `rec` as one greedy-shaped Record (a greedy record: itself): what
    reads rounds rather than expectations (the goodput fit, same-work detection) reads."""
    return rec if rec.info.get("sampling") is None else stack(replicates(rec))


# --- expectations over replicates --------------------------------------------------------------

TOTALS = ["rounds", "drafted_total", "accepted_total", "emitted_total", "full_blocks", "draft_forwards", "new_tokens"]
INTERVALS = ["tokens_per_round", "acceptance_rate", "avg_draft_len", "predicted_speedup"]
# Student's t at 97.5 % for 1..30 degrees of freedom; beyond, the normal's 1.96.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def expected(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """One row per policy from its replicates' rows (one table per replicate, rows in the same
    order): totals summed, the rates of the sums, predicted speedups pooled over tokens (the
    total plain time over the total predicted time), and a 95 % interval (`<metric>_low`,
    `_high`: Student's t over the replicates) of the headline metrics."""
    if len(tables) == 1:
        return tables[0]
    out = tables[0].copy()
    times = [c for c in out if c.startswith(("predicted_time", "predicted_baseline_time"))]
    for column in TOTALS + times:
        if column in out:
            out[column] = sum(t[column].to_numpy() for t in tables)
    out = out.assign(**rates(out))
    out["draft_forwards_per_token"] = out["draft_forwards"] / out["new_tokens"].clip(lower=1)
    for column in [c for c in out if c.startswith("predicted_speedup")]:
        time = column.replace("speedup", "time")
        if "predicted_baseline_time" in out and time in out:  # a batched table: its baseline over its time
            out[column] = out["predicted_baseline_time"] / out[time]
        else:  # Σ plain time over Σ predicted time, the plain time in tokens (each table's speedup says its ratio)
            out[column] = out["new_tokens"] / sum((t["new_tokens"] / t[column]).to_numpy() for t in tables)
    t = T975[min(len(tables) - 1, len(T975)) - 1] if len(tables) <= 31 else 1.96
    for column in [c for c in INTERVALS if c in out]:
        values = np.stack([table[column].to_numpy(dtype=float) for table in tables])
        half = t * values.std(axis=0, ddof=1) / np.sqrt(len(tables))
        out[f"{column}_low"], out[f"{column}_high"] = out[column] - half, out[column] + half
    out["replicates"] = len(tables)
    return out

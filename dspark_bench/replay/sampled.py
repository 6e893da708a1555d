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
Sampled and recorded by measure/sampled_recording.py (the models run there), path by path
(`PathRecord`) assembled here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dspark_bench.config import DecodeConfig, Drafting
from dspark_bench.decoding import confidence
from dspark_bench.metrics import rates
from dspark_bench.paired import t_quantile
from dspark_bench.replay.record import Record, RecordBase, read_files
from dspark_bench.results import provenance

# K, the sampled paths per prompt, is the sweep's `paths` knob (tuning/spec.py says what it buys).
DRAWS = 4  # coin draws per path: they narrow the coins' share of the noise, not the paths'
SEED_STRIDE = 7919  # prompt p's path k is sampled with seed + SEED_STRIDE · p + k


def sampling_of(config: DecodeConfig, paths: int, draws: int = DRAWS) -> dict:
    """What a sampled record was sampled with (record.json's "sampling"): replay refuses another."""
    return {"temperature": config.verification.temperature, "top_p": config.verification.top_p,
            "seed": config.verification.seed, "paths": paths, "draws": draws}


@dataclass
class SampledRecord(RecordBase):
    """Arrays over rows r (prompt r // K, its path r % K), positions m and rollout steps k. What it
    shares with a greedy Record (the info's reading, the check against models and prompts, the
    two files) is record.RecordBase's; it is no Record: `replicates` makes those of it."""

    paths: np.ndarray  # [R, N] the target's sampled tokens, -1 past the end
    lengths: np.ndarray  # [R]
    p_token: np.ndarray  # [R, N] float64: p_m(y_m), the target's probability of its own token
    q_token: np.ndarray  # [R, N] float64: q_m(y_m), the draft's, on the path
    rollout: np.ndarray  # [R, N, G]: r_m, then the draft's sampled continuation after it
    confidences: dict[str, np.ndarray]  # signal -> [R, N, G] of the rollout's steps (step 0: q_m's, on the path)
    eos_ids: tuple[int, ...]
    info: dict  # as a Record's, with "sampling" (sampling_of) and rows' prompt tokens

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
        self.write_files(folder, {"paths": self.paths, "lengths": self.lengths, "p_token": self.p_token,
                                  "q_token": self.q_token, "rollout": self.rollout})

    @classmethod
    def from_files(cls, arrays, info: dict) -> SampledRecord:
        """The SampledRecord of a saved one's open npz `arrays` and its json `info`."""
        confidences = {name.removeprefix("confidence_"): arrays[name] for name in arrays.files
                       if name.startswith("confidence_")}
        return cls(arrays["paths"], arrays["lengths"], arrays["p_token"], arrays["q_token"], arrays["rollout"],
                   confidences, tuple(info.pop("eos_ids")), info)


def load(folder: Path) -> Record | SampledRecord:
    """A replay record of either kind: greedy (or a lookup's over sampled paths), or sampled (its
    arrays hold the paths); a folder without one, or a file that does not read, refused in one line."""

    def either(arrays, info: dict) -> Record | SampledRecord:
        return (SampledRecord if "paths" in arrays.files else Record).from_files(arrays, info)

    return read_files(folder, either)


# --- a sampled record, assembled from its paths -----------------------------------------------


@dataclass
class PathRecord:
    """One sampled path of one prompt and what replay needs at each of its positions."""

    path: list[int]
    p_token: np.ndarray
    q_token: np.ndarray
    tokens: np.ndarray  # [n, G] r_m and the rollout after it
    scores: dict[str, np.ndarray]  # signal -> [n, G]


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
    recorded after the first rejection at j + M_j; M_j is how many the target accepts.

    In three steps: which path positions the coins reject (`rejected_positions`), the first of
    them at or after each round start (`next_rejection`: j + M_j), and from that where each of a
    round's draft steps reads its token and confidences (`RoundSteps`)."""
    accept = (rec.accept if accept is None else accept)[rows]  # [R, N] a_m; R = len(rows)
    paths, lengths = rec.paths[rows], rec.lengths[rows]
    rejection = next_rejection(rejected_positions(u, accept, lengths))  # [R, N] j + M_j
    accepted = rejection - np.arange(rec.max_new_tokens)  # [R, N] M_j
    steps = RoundSteps.of(rejection, accepted, lengths, rec.gamma_record)
    tokens = steps.read(paths, rec.rollout[rows], past_the_end=-1)
    scores = {}
    for name, values in rec.confidences.items():
        mine = values[rows]  # indexed once per signal
        # On the path, step k's confidence is that of the rollout's first step at j + k: q_{j+k}'s.
        scores[name] = steps.read(mine[:, :, 0], mine).astype(np.float32)
    info = {**rec.info, "prompt_tokens": [rec.info["prompt_tokens"][i] for i in rows]}
    return Record(paths, lengths, tokens, scores, rec.eos_ids, info, matches=np.minimum(accepted, rec.gamma_record))


def rejected_positions(u: np.ndarray, accept: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """[R, N] bool: whether a token drafted at path position m would be rejected: its coin says so
    (u_m >= a_m), or the path has ended there (nothing left to accept)."""
    position = np.arange(u.shape[1])
    return (u >= accept) | (position[None, :] >= lengths[:, None])


def next_rejection(rejected: np.ndarray) -> np.ndarray:
    """[R, N]: for every round start j, the first rejected position m >= j (N where none is):
    j + M_j. A running minimum of the rejected positions, taken from the right."""
    N = rejected.shape[1]
    position = np.where(rejected, np.arange(N), N)  # [R, N] m where rejected, else N
    return np.minimum.accumulate(position[:, ::-1], axis=1)[:, ::-1]


@dataclass
class RoundSteps:
    """Where step k of the round that starts at path position j reads from, as index arrays that
    broadcast to [R, N, G]: while the coins accept (k < M_j), the path at j + k; after, the rollout
    recorded at the round's rejection j + M_j, at its step k - M_j (step 0: the rejected token).
    Positions and steps that are not read are clipped into range, so that one gather serves both."""

    row: np.ndarray  # [R, 1, 1]
    on_path: np.ndarray  # [R, N, G] bool: k < M_j
    path_position: np.ndarray  # [1, N, G] j + k (at most N - 1; beyond, the step is never on the path)
    rejection: np.ndarray  # [R, N, 1] j + M_j, clipped to N - 1 (it is N where an N-token path is accepted to its end)
    rollout_step: np.ndarray  # [R, N, G] k - M_j (0 while on the path)
    # [R, N, 1] no rejection before the path's end: the round is accepted to the end, and the
    # rollout "after the rejection" is never read (there is none: it reads as -1 tokens)
    to_the_end: np.ndarray

    @classmethod
    def of(cls, rejection: np.ndarray, accepted: np.ndarray, lengths: np.ndarray, G: int) -> RoundSteps:
        """From each round start's first rejection j + M_j [R, N], M_j [R, N] and the paths' lengths [R]."""
        R, N = rejection.shape
        step = np.arange(G)[None, None, :]
        return cls(row=np.arange(R)[:, None, None], on_path=step < accepted[:, :, None],
                   path_position=np.minimum(np.arange(N)[None, :, None] + step, N - 1),
                   rejection=np.minimum(rejection, N - 1)[:, :, None],
                   rollout_step=np.clip(step - accepted[:, :, None], 0, G - 1),
                   to_the_end=(rejection >= lengths[:, None])[:, :, None])

    def read(self, on_path: np.ndarray, rollout: np.ndarray, past_the_end=None) -> np.ndarray:
        """[R, N, G]: `on_path` [R, N] (a value per path position) on the path, `rollout` [R, N, G]
        (a value per rollout step recorded at each position) after the rejection; `past_the_end`
        there instead where the round is accepted to the path's end (None: the clipped read)."""
        after = rollout[self.row, self.rejection, self.rollout_step]
        if past_the_end is not None:
            after = np.where(self.to_the_end, past_the_end, after)
        return np.where(self.on_path, on_path[self.row, self.path_position], after)


def rows_of(rec: Record, rows: np.ndarray) -> Record:
    """Some rows of a greedy-shaped record, in `rows`' order, a row as often as it names it (the
    lookup's over sampled paths: one path's rows; replay under load: its requests' rows)."""
    info = {**rec.info, "prompt_tokens": [rec.info["prompt_tokens"][i] for i in rows]}
    return Record(rec.continuation[rows], rec.lengths[rows], rec.rollout[rows],
                  {name: values[rows] for name, values in rec.confidences.items()}, rec.eos_ids, info,
                  rec.available[rows], None if rec.matches is None else rec.matches[rows])


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
                  first.eos_ids, {**first.info, "prompt_tokens": [n for p in parts for n in p.info["prompt_tokens"]]},
                  np.concatenate([p.available for p in parts]), matches)


def as_one(rec) -> Record:
    """Every replicate of `rec` as one greedy-shaped Record (a greedy record: itself): what
    reads rounds rather than expectations (the goodput fit, same-work detection) reads."""
    return rec if rec.info.get("sampling") is None else stack(replicates(rec))


# --- expectations over replicates --------------------------------------------------------------

TOTALS = ["rounds", "drafted_total", "accepted_total", "emitted_total", "full_blocks", "draft_forwards", "new_tokens"]
INTERVALS = ["tokens_per_round", "acceptance_rate", "avg_draft_len", "predicted_speedup"]


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
    t = t_quantile(len(tables) - 1)  # the replicates are the independent draws
    for column in [c for c in INTERVALS if c in out]:
        values = np.stack([table[column].to_numpy(dtype=float) for table in tables])
        half = t * values.std(axis=0, ddof=1) / np.sqrt(len(tables))
        out[f"{column}_low"], out[f"{column}_high"] = out[column] - half, out[column] + half
    out["replicates"] = len(tables)
    return out


LABELS = {"predicted_speedup": "predicted speedup", "tokens_per_round": "tokens per round",
          "acceptance_rate": "acceptance", "avg_draft_len": "draft length"}


def precision(table: pd.DataFrame, sampling: dict) -> dict:
    """What a sampled record's K paths bought: each headline metric's 95 % half-width relative to
    its value (expected()'s interval), the median over the replayed policies, and a sentence."""
    replayed = table[table["source"] == "replay"] if "source" in table else table
    widths = {}
    for column in [c for c in LABELS if f"{c}_high" in replayed]:
        values = replayed[column].to_numpy(dtype=float)
        relative = (replayed[f"{column}_high"].to_numpy(dtype=float) - values)[values > 0] / values[values > 0]
        if len(relative):  # a metric that is 0 for every policy has no relative width
            widths[column] = float(np.median(relative))
    said = ", ".join(f"{LABELS[c]} ±{w:.1%}" for c, w in widths.items())
    sentence = (f"replay's 95 % interval over {sampling['paths']} sampled paths per prompt (× {sampling['draws']} coin "
                f"draws): {said} (median over {len(replayed):,} policies). --paths K narrows it as t(K-1)/√K, each "
                "path a plain decode and a rollout pass more to record; a real run's own noise comes on top when "
                "the two are held against each other (docs/policy-and-metrics.md#which-temperatures-are-validated).")
    return {"half_width": widths, "policies": len(replayed), "sentence": sentence}

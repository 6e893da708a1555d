"""Replay's record: one greedy decoding pass, kept so that every policy can be simulated from it.

For every prompt: the target's greedy continuation and, at every position of it, the drafter's
greedy proposal of up to `gamma_record` tokens with every confidence metric (the draft model's
rollout; the heads' segment; the lookup's continuation — `available` says how many it had) (see
replay/simulate.py for why that fixes every greedy policy's rounds). Saved as record.npz +
record.json (with the models' and prompts' fingerprints and how it was made) and refused for
other models or prompts. Made by measure/recording.py (the models run there), a prompt at a time
(`PromptRecord`) assembled here.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dspark_bench.config import Drafting
from dspark_bench.decoding import confidence
from dspark_bench.decoding.learned_signal import CONTEXT
from dspark_bench.errors import DsparkError
from dspark_bench.results import provenance


class RecordBase:
    """What both kinds of replay record share — a greedy `Record` and replay/sampled.py's
    `SampledRecord`: the info they carry (`info`: max_new_tokens, gamma_record, topk,
    fingerprints, the drafter), their rollouts [rows, N, G] (`rollout`), the check against the
    models and prompts in use, and the two files they are saved as (record.npz + record.json,
    read back by `read_files`). A base of the two, not a record itself: a SampledRecord is no
    Record (replay/sampled.py tells the two apart)."""

    @property
    def drafter(self) -> dict:
        """What drafted: {"drafter": ..., "ngram_min": ..., "ngram_max": ...} (the draft model if unsaid)."""
        return {"drafter": "model", "ngram_min": 1, "ngram_max": 3, **self.info.get("drafter", {})}

    @property
    def max_new_tokens(self) -> int:
        return int(self.info["max_new_tokens"])

    @property
    def gamma_record(self) -> int:
        return self.rollout.shape[2]

    def write_files(self, folder: Path, arrays: dict[str, np.ndarray]) -> None:
        """record.npz (`arrays`, the confidences added as confidence_<signal>) and record.json
        (the info, with the EOS ids) in `folder`."""
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {**arrays, **{f"confidence_{name}": values for name, values in self.confidences.items()}}
        np.savez_compressed(folder / "record.npz", **arrays)
        (folder / "record.json").write_text(json.dumps({**self.info, "eos_ids": list(self.eos_ids)}, indent=2) + "\n")

    def check_matches(self, models: dict, prompts_fingerprint: str) -> None:
        """Refuse a record made with other models or prompts."""
        recorded = dict(self.info["models"])
        if self.drafter["drafter"] == "model":  # a record made before drafters were named: its drafter is the draft
            recorded.setdefault("drafter_fingerprint", recorded.get("draft_fingerprint"))
        keys = ["target_fingerprint", "drafter_fingerprint"] if "drafter_fingerprint" in models else \
            ["target_fingerprint", "draft_fingerprint"]
        for key in keys:
            if recorded.get(key) != models.get(key):
                raise DsparkError(f"replay record was made with another {key.split('_')[0]} model "
                                  f"({self.info['models'].get(key)} vs {models.get(key)}); record again")
        if self.info["prompts_fingerprint"] != prompts_fingerprint:
            raise DsparkError(f"replay record was made with other prompts ({self.info['prompts_fingerprint']} "
                              f"vs {prompts_fingerprint}); record again")


@dataclass
class Record(RecordBase):
    """Arrays over prompts p, positions j (tokens generated so far) and rollout steps k."""

    continuation: np.ndarray  # [P, N] target greedy tokens, -1 past the end
    lengths: np.ndarray  # [P] tokens in each continuation (EOS included)
    rollout: np.ndarray  # [P, N, G] the draft's greedy proposal at step k from position j
    # metric -> [P, N, G] confidence of that proposal; a draft model's record also holds the
    # learned signal's context features (learned_signal.CONTEXT) of each proposed token
    confidences: dict[str, np.ndarray]
    eos_ids: tuple[int, ...]
    info: dict  # max_new_tokens, gamma_record, topk, fingerprints, prompt ids and categories, drafter
    available: np.ndarray | None = None  # [P, N] proposals the drafter had at j (None: all G, a draft model)
    # [P, N] how many of the rollout's tokens from j are accepted, where token equality does not
    # say it: a sampled record's replicate (replay/sampled.py), whose coins decide. None: greedy,
    # the rollout against the continuation (rounds.match_lengths).
    matches: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.available is None:
            self.available = np.full(self.rollout.shape[:2], self.rollout.shape[2], dtype=np.int64)

    def save(self, folder: Path) -> None:
        self.write_files(folder, {"continuation": self.continuation, "lengths": self.lengths, "rollout": self.rollout,
                                  "available": self.available})

    @classmethod
    def load(cls, folder: Path) -> Record:
        return read_files(folder, cls.from_files)

    @classmethod
    def from_files(cls, arrays, info: dict) -> Record:
        """The Record of a saved record's open npz `arrays` and its json `info`."""
        confidences = {m: arrays[f"confidence_{m}"] for m in confidence.METRICS}
        confidences.update({m: arrays[f"confidence_{m}"] for m in (*confidence.SIGNALS, *CONTEXT)  # newer records
                            if f"confidence_{m}" in arrays.files})
        available = arrays["available"] if "available" in arrays.files else None  # older records: a draft model
        return cls(arrays["continuation"], arrays["lengths"], arrays["rollout"], confidences,
                   tuple(info.pop("eos_ids")), info, available)


def read_files(folder: Path, build):
    """`build(arrays, info)` of the record saved in `folder`: record.json's info (its "eos_ids"
    still in it) and record.npz's arrays, each file opened once and the npz closed after `build`
    (which reads what it needs from it). A folder without the two files, or a file that does not
    read, is refused in one line."""
    folder = Path(folder)
    if not (folder / "record.npz").is_file() or not (folder / "record.json").is_file():
        raise DsparkError(f"{str(folder)!r} holds no replay record (record.npz + record.json)")
    try:
        info = json.loads((folder / "record.json").read_text())
        with np.load(folder / "record.npz") as arrays:
            return build(arrays, info)
    except (OSError, KeyError, ValueError, json.JSONDecodeError) as err:
        raise DsparkError(f"replay record in {str(folder)!r} is unreadable: {err}") from None


def resolve_record(folder: Path, recorded: str) -> Path | None:
    """A replay record's folder, as a sweep's summary names it: as written (absolute or from the
    sweep's working directory), else in the records/ folder beside the sweep (the default layout)."""
    path = Path(recorded)
    for candidate in (path, folder.parent / "records" / path.name, folder.parent.parent / path):
        if (candidate / "record.npz").is_file():
            return candidate
    return None


@dataclass
class PromptRecord:
    """One prompt's share of a record: the target's continuation and the drafter's proposals at
    each of its positions (tokens [j, k], scores per signal, available [j])."""

    generated: list[int]
    tokens: np.ndarray
    scores: dict[str, np.ndarray]
    available: np.ndarray


def assemble(parts, prompt_ids: list[list[int]], max_new_tokens: int, gamma_record: int, topk: int,
             eos_ids: frozenset[int], drafter: Drafting, info: dict | None = None) -> Record:
    """A Record from every prompt's PromptRecord (an iterable, in the prompts' order)."""
    P, N, G = len(prompt_ids), max_new_tokens, gamma_record
    continuation = np.full((P, N), -1, dtype=np.int64)
    lengths = np.zeros(P, dtype=np.int64)
    rollout = np.full((P, N, G), -1, dtype=np.int64)
    scores = {m: np.zeros((P, N, G), dtype=np.float32) for m in confidence.SIGNALS}
    available = np.zeros((P, N), dtype=np.int64)
    for p, part in enumerate(parts):
        n = len(part.generated)
        continuation[p, :n] = part.generated
        lengths[p] = n
        rollout[p, :n] = part.tokens
        available[p, :n] = part.available
        for name, values in part.scores.items():
            scores.setdefault(name, np.zeros((P, N, G), dtype=np.float32))[p, :n] = values
    meta = {"max_new_tokens": N, "gamma_record": G, "topk": topk, **provenance(), **(info or {}),
            "prompt_tokens": [len(ids) for ids in prompt_ids],  # what each prefill costs, at batch size B
            "drafter": dataclasses.asdict(drafter)}
    return Record(continuation, lengths, rollout, scores, tuple(sorted(eos_ids)), meta, available)

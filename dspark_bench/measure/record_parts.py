"""A record made a prompt at a time into a parts folder: resumable after a kill, and split across
machines by shards of prompts whose parts merge into one record.

Where the target's continuations come from an engine's file (replay/continuations.py), what is
left to compute here is the drafter's proposals, prompt by prompt and independent of each other.
Each finished prompt is saved at once as `<parts>/<index>.npz` (written beside and renamed, so
a kill leaves no half part), and a prompt whose part exists is never computed again. Shard i/n
computes the prompts whose index is i-1 modulo n; parts copied into one folder (or one shared
folder) assemble into the very record a single machine makes. Memory stays one prompt's while
the parts are made; the assembled record is the record's own size.
"""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path

import numpy as np

from dspark_bench.config import Drafting
from dspark_bench.errors import DsparkError
from dspark_bench.measure.recording import record_prompt
from dspark_bench.replay.record import PromptRecord, Record, assemble


def parse_shard(text: str | None) -> tuple[int, int]:
    """'2/4' -> (2, 4); None -> (1, 1): every prompt."""
    if text is None:
        return 1, 1
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise DsparkError(f"--shard must be I/N with 1 <= I <= N, e.g. 2/4 (got {text!r})")
    return int(match.group(1)), int(match.group(2))


def shard_indexes(count: int, shard: tuple[int, int]) -> list[int]:
    index, of = shard
    return list(range(index - 1, count, of))


def part_path(parts: Path, p: int) -> Path:
    return Path(parts) / f"{p:07d}.npz"


def save_part(path: Path, part: PromptRecord) -> None:
    arrays = {"generated": np.asarray(part.generated, dtype=np.int64), "tokens": part.tokens,
              "available": np.asarray(part.available)}
    arrays.update({f"score_{name}": values for name, values in part.scores.items()})
    partial = path.with_name(f".{path.stem}.{os.getpid()}.partial.npz")
    try:
        np.savez(partial, **arrays)
        partial.replace(path)  # atomic: a part is whole or absent
    except FileNotFoundError:  # the folder went: another process assembled the record meanwhile
        raise DsparkError(f"{str(path.parent)!r} was removed while this shard recorded: the record is whole "
                          "already (another process assembled it)") from None


def load_part(path: Path) -> PromptRecord:
    try:
        with np.load(path) as arrays:
            scores = {name[len("score_"):]: arrays[name] for name in arrays.files if name.startswith("score_")}
            return PromptRecord(arrays["generated"].tolist(), arrays["tokens"], scores, arrays["available"])
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise DsparkError(f"record part {str(path)!r} is unreadable ({err}): delete it and record again") from None


def record_parts(pair, drafter: Drafting, prompt_ids: list[list[int]], continuation, parts: Path,
                 gamma_record: int, topk: int, shard: tuple[int, int] = (1, 1), progress=None) -> int:
    """Make the parts of this shard's prompts that `parts` does not hold yet; returns how many
    were made. `continuation(p)`: the target's continuation of prompt p (read on demand)."""
    parts = Path(parts)
    parts.mkdir(parents=True, exist_ok=True)
    made = 0
    for p in shard_indexes(len(prompt_ids), shard):
        path = part_path(parts, p)
        if not path.is_file():
            save_part(path, record_prompt(pair, drafter, prompt_ids[p], continuation(p), gamma_record, topk))
            made += 1
        if progress:
            progress()
    return made


def missing_parts(parts: Path, count: int) -> list[int]:
    return [p for p in range(count) if not part_path(parts, p).is_file()]


def assemble_parts(parts: Path, prompt_ids: list[list[int]], max_new_tokens: int, gamma_record: int, topk: int,
                   eos_ids: frozenset[int], drafter: Drafting, info: dict | None = None) -> Record:
    """The record of every prompt's part; one line naming what is missing if any is."""
    missing = missing_parts(parts, len(prompt_ids))
    if missing:
        raise DsparkError(f"{len(missing)} of {len(prompt_ids)} prompts are not recorded in {str(parts)!r} yet "
                          f"(first: prompt #{missing[0] + 1}): run the shards that hold them, or drop --shard")
    loaded = (load_part(part_path(parts, p)) for p in range(len(prompt_ids)))
    return assemble(loaded, prompt_ids, max_new_tokens, gamma_record, topk, eos_ids, drafter, info)

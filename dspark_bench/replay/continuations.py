"""Continuations files: the target's greedy continuations of a set of prompts, as the engine that
serves it produced them, so that a record takes the target's half from there instead of
decoding it here (docs/sweeps-and-replay.md#records-from-your-engines-continuations).

JSON Lines, streamed (a file of any number of prompts is read a line at a time). The first
line is the header, every further line one prompt:

    {"format": "dspark-bench continuations", "format_version": 1,
     "engine": {"name": "vllm", "version": "0.11.0"}, "model": "what the engine loaded",
     "sampling": {"temperature": 0.0}, "max_new_tokens": 128, "ignore_eos": false}
    {"id": "code-3", "prompt_token_ids": [...], "token_ids": [...], "finish_reason": "stop"}

`token_ids` are the generated tokens as the engine produced them, the EOS token included where
it stopped there ("stop"); "length" where it reached max_new_tokens. Before anything is
recorded, every prompt the record needs is checked against the file: present, tokenized as
here (`prompt_token_ids`: another tokenizer, chat template or prompt text shows there), token
ids inside the vocabulary, complete (its EOS or max_new_tokens reached), from a greedy engine
with the same EOS handling. Anything else is refused in one line.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from dspark_bench.errors import DsparkError

FORMAT = "dspark-bench continuations"
FORMAT_VERSION = 1
FINISH_REASONS = ("stop", "length")


def header(engine: dict, model: str, max_new_tokens: int, ignore_eos: bool, sampling: dict | None = None) -> dict:
    """The first line of a continuations file (greedy sampling unless said)."""
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "engine": engine, "model": model,
            "sampling": sampling or {"temperature": 0.0}, "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos}


def line(prompt_id: str, prompt_ids: list[int], token_ids: list[int], finish_reason: str) -> dict:
    return {"id": prompt_id, "prompt_token_ids": [int(t) for t in prompt_ids],
            "token_ids": [int(t) for t in token_ids], "finish_reason": finish_reason}


def write(path: Path, head: dict, lines) -> Path:
    """Write a continuations file from its header and an iterable of lines (line()), streamed."""
    return write_lines(path, itertools.chain([head], lines))


def write_lines(path: Path, lines) -> Path:
    """JSON Lines into a temporary file renamed at the end: a failure (a refused prompt, Ctrl-C)
    leaves no half-written file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        with partial.open("w") as sink:
            for entry in lines:
                sink.write(json.dumps(entry) + "\n")
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path


def greedy(sampling: dict) -> bool:
    """Greedy decoding, as engines say it: temperature 0, or top-k 1."""
    return sampling.get("temperature") == 0 or sampling.get("top_k") == 1


@dataclass
class Continuations:
    """Opened, checked continuations files: the target's continuation of each needed prompt, read
    from its line on demand (the files are not held in memory)."""

    paths: list[Path]
    head: dict  # the first file's header (every file's agrees on what a record depends on)
    offsets: dict[str, tuple[int, int]]  # prompt id -> (which file, the byte offset of its line)
    sha256: str
    max_new_tokens: int
    eos_ids: frozenset[int]

    @property
    def fingerprint(self) -> str:
        return self.sha256[:16]

    @property
    def engine(self) -> str:
        engine = self.head.get("engine") or {}
        name = engine.get("name", "?") if isinstance(engine, dict) else str(engine)
        version = engine.get("version") if isinstance(engine, dict) else None
        return f"{name} {version}" if version else name

    def describe(self) -> dict:
        """What a record made from these files says of them."""
        return {"files": [str(p) for p in self.paths], "sha256": self.sha256, "engine": self.head.get("engine"),
                "model": self.head.get("model"), "sampling": self.head.get("sampling")}

    def continuation(self, prompt_id: str) -> list[int]:
        """The target's continuation of `prompt_id`: at most max_new_tokens, ending at its first EOS."""
        which, offset = self.offsets[prompt_id]
        with self.paths[which].open("rb") as source:
            source.seek(offset)
            return cut(json.loads(source.readline())["token_ids"], self.max_new_tokens, self.eos_ids)


def cut(tokens: list[int], max_new_tokens: int, eos_ids: frozenset[int]) -> list[int]:
    """What the target decodes here with these settings: the first max_new_tokens, up to its first EOS."""
    tokens = [int(t) for t in tokens[:max_new_tokens]]
    for i, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: i + 1]
    return tokens


def open_for(paths, prompts: list, prompt_ids: list[list[int]], max_new_tokens: int, eos_ids: frozenset[int],
             vocab_size: int, say=None, ignore_eos: bool = False) -> Continuations:
    """The continuations file at `paths` (one path, or several: one per task, say), checked line by
    line against the prompts a record needs (Prompt objects and their token ids as encoded
    here); one line saying what is wrong otherwise."""
    paths = [Path(p).expanduser() for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    needed = {p.id: ids for p, ids in zip(prompts, prompt_ids)}
    offsets, digest, heads = {}, hashlib.sha256(), []
    for which, path in enumerate(paths):
        heads.append(read_file(path, which, needed, offsets, digest, max_new_tokens, eos_ids, vocab_size, ignore_eos))
    missing = [pid for pid in needed if pid not in offsets]
    if missing:
        where = f"continuations file {paths[0].name}" if len(paths) == 1 else "the continuations files"
        raise DsparkError(f"{where} hold{'s' if len(paths) == 1 else ''} no continuation for {len(missing)} of the "
                          f"{len(needed)} prompts (first: {missing[0]!r}): written for other prompts, or cut short")
    found = Continuations(paths, heads[0], offsets, digest.hexdigest(), max_new_tokens, frozenset(eos_ids))
    if say:
        say(f"the target's continuations: {found.engine}, from {', '.join(map(str, paths))} ({len(needed)} prompts; "
            "not decoded here)")
    return found


def check_files(paths, ignore_eos: bool = False) -> None:
    """Each continuations file exists and its first line is a greedy continuations header (with
    EOS treated as this sweep does): the checks that need no prompt, model or length, made before
    any of those load. open_for checks the rest."""
    for path in [Path(p).expanduser() for p in ([paths] if isinstance(paths, (str, Path)) else paths)]:
        if not path.is_file():
            raise DsparkError(f"continuations file {str(path)!r} does not exist")
        with path.open("rb") as source:
            check_header(parse(source.readline(), f"continuations file {path.name}", 1),
                         f"continuations file {path.name}", 0, ignore_eos)


def read_file(path: Path, which: int, needed: dict, offsets: dict, digest, max_new_tokens: int,
              eos_ids: frozenset[int], vocab_size: int, ignore_eos: bool) -> dict:
    """Check one file's header and lines, noting where each prompt's line is; its header."""
    if not path.is_file():
        raise DsparkError(f"continuations file {str(path)!r} does not exist")
    where = f"continuations file {path.name}"
    with path.open("rb") as source:
        first = source.readline()
        head = parse(first, where, 1)
        digest.update(first)  # the headers and the needed prompts' lines: what the record depends on
        check_header(head, where, max_new_tokens, ignore_eos)
        number, offset = 1, source.tell()
        for raw in iter(source.readline, b""):
            number += 1
            if raw.strip():
                entry = parse(raw, where, number)
                prompt_id = check_line(entry, where, number)
                if prompt_id in offsets:
                    raise DsparkError(f"{where}, line {number}: prompt {prompt_id!r} appears twice")
                offsets[prompt_id] = (which, offset)
                if prompt_id in needed:
                    digest.update(raw)
                    check_prompt(entry, needed[prompt_id], where, max_new_tokens, eos_ids, vocab_size)
            offset = source.tell()
    return head


def parse(raw: bytes, where: str, number: int) -> dict:
    try:
        entry = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise DsparkError(f"{where}, line {number} is not JSON (a file cut short?)") from None
    if not isinstance(entry, dict):
        raise DsparkError(f"{where}, line {number} is not a JSON object")
    return entry


def check_header(head: dict, where: str, max_new_tokens: int, ignore_eos: bool) -> None:
    if head.get("format") != FORMAT:
        raise DsparkError(f"{where} is not a continuations file (its first line's format is "
                          f"{head.get('format')!r}, not {FORMAT!r})")
    if head.get("format_version") != FORMAT_VERSION:
        raise DsparkError(f"{where} has format_version {head.get('format_version')!r}; "
                          f"this version reads {FORMAT_VERSION}")
    for key in ("engine", "sampling", "max_new_tokens", "ignore_eos"):
        if key not in head:
            raise DsparkError(f"{where}: its header has no {key!r}")
    sampling = head["sampling"]
    if not isinstance(sampling, dict) or not greedy(sampling):
        raise DsparkError(f"{where} was not decoded greedily (sampling {sampling}): a record needs the target's "
                          "greedy continuations (temperature 0)")
    made = head["max_new_tokens"]
    if not isinstance(made, int) or isinstance(made, bool) or made < max_new_tokens:
        raise DsparkError(f"{where} was generated with max_new_tokens {made!r}; the record needs {max_new_tokens}")
    if bool(head["ignore_eos"]) != ignore_eos:
        said = "ignored" if head["ignore_eos"] else "stopped at"
        raise DsparkError(f"{where}: the engine {said} EOS; this record {'ignores' if ignore_eos else 'stops at'} "
                          "it (--ignore-eos must match)")


def check_line(entry: dict, where: str, number: int) -> str:
    for key, kind in (("id", str), ("prompt_token_ids", list), ("token_ids", list)):
        if not isinstance(entry.get(key), kind):
            raise DsparkError(f"{where}, line {number}: {key!r} is missing or not a {kind.__name__}")
    if entry.get("finish_reason") not in FINISH_REASONS:
        raise DsparkError(f"{where}, line {number}: finish_reason {entry.get('finish_reason')!r} is not one of "
                          f"{', '.join(FINISH_REASONS)}")
    return entry["id"]


def check_prompt(entry: dict, ids: list[int], where: str, max_new_tokens: int, eos_ids: frozenset[int],
                 vocab_size: int) -> None:
    """One needed prompt's line: the same prompt tokens as here, ids in the vocabulary, complete."""
    name, seen, tokens = entry["id"], entry["prompt_token_ids"], entry["token_ids"]
    if seen != ids:
        at = next((i for i, (a, b) in enumerate(zip(seen, ids)) if a != b), min(len(seen), len(ids)))
        raise DsparkError(f"{where}: prompt {name!r} was tokenized differently there ({len(seen)} tokens vs "
                          f"{len(ids)} here, first difference at token {at}): another tokenizer, chat template "
                          "or prompt text")
    outside = [t for t in tokens if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size]
    if outside:
        raise DsparkError(f"{where}: prompt {name!r} has token id {outside[0]!r}, outside this tokenizer's "
                          f"vocabulary of {vocab_size}: another tokenizer")
    kept = cut(tokens, max_new_tokens, eos_ids)
    if len(kept) < max_new_tokens and not (kept and kept[-1] in eos_ids):
        why = ("stopped ('stop') without its EOS token in token_ids (a stop string, or an engine that drops "
               "the EOS id: write it)" if entry["finish_reason"] == "stop" else "no EOS")
        raise DsparkError(f"{where}: prompt {name!r} is truncated: {len(kept)} of {max_new_tokens} tokens, {why}")

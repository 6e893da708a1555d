"""A user's prompts through `datasets`: local JSONL / JSON / CSV / Parquet / text, or a hub id.

Compressed files load as they ship (`HumanEval.jsonl.gz`): `datasets` decompresses .gz, .bz2,
.xz and .zst itself; the checks below read the first three through the standard library.

Multi-turn files in the Spec-Bench / MT-Bench shape ({"question_id", "category", "turns"})
load as they are: the first turn is the prompt, the rest are kept for `--turns all`.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from dspark_bench.errors import DsparkError, first_line
from dspark_bench.tasks.hub import hub_reachable
from dspark_bench.tasks.prompts import Prompt

BUILDER_BY_SUFFIX = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma", ".zst": None}  # None: datasets reads it unchecked
PROMPT_FIELDS = ("turns", "prompt", "text", "question", "instruction", "input", "query", "content")
CATEGORY_FIELDS = ("category", "domain", "task", "type")
ID_FIELDS = ("question_id", "task_id", "id", "prompt_id")


def file_kind(path: Path) -> tuple[str | None, str | None]:
    """(the format's suffix, the compression's suffix or None): x.jsonl.gz -> (".jsonl", ".gz")."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        return (suffixes[-2] if len(suffixes) > 1 else None), suffixes[-1]
    return (suffixes[-1] if suffixes else None), None


def read_bytes(path: Path) -> bytes:
    """The file's bytes, decompressed where the standard library can."""
    _, compression = file_kind(path)
    if compression is None:
        return path.read_bytes()
    try:
        return importlib.import_module(COMPRESSIONS[compression]).open(path).read()
    except (OSError, EOFError, ValueError) as err:
        raise DsparkError(f"{path}: not a readable {compression} file ({first_line(err)})") from None


def _check_jsonl(path: Path, text: str) -> None:
    """datasets' own error for a bad line is opaque; name the line instead."""
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                json.loads(line)
            except json.JSONDecodeError as err:
                raise DsparkError(f"{path}: line {number} is not valid JSON ({err.msg})") from None


def _check_text(path: Path) -> str:
    """An empty or non-UTF-8 file fails deep inside datasets; say what is wrong instead (else: its text)."""
    data = read_bytes(path)
    if not data.strip():
        raise DsparkError(f"{path}: the file is empty; it holds no prompts")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DsparkError(f"{path}: not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start}); "
                          "save it as UTF-8 JSONL, JSON, CSV or text") from None


def _check_parquet(path: Path) -> None:
    """datasets logs pyarrow's complaint about a corrupt file before raising; read it first."""
    import pyarrow.parquet as pq

    try:
        pq.read_schema(path)
    except Exception as err:  # pyarrow raises several types for a file that is not Parquet
        raise DsparkError(f"{path}: not a readable Parquet file ({first_line(err)})") from None


def _load(source: str, split: str):
    import datasets

    datasets.disable_progress_bars()
    path = Path(source).expanduser()
    if path.is_dir():
        raise DsparkError(f"{path} is a folder; pass a prompts file (JSONL, JSON, CSV, Parquet or text)")
    if path.exists():
        kind, compression = file_kind(path)
        builder = BUILDER_BY_SUFFIX.get(kind)
        if builder is None or (compression and builder == "parquet"):
            raise DsparkError(f"{path}: unsupported file type; use {', '.join(BUILDER_BY_SUFFIX)}, the text ones "
                              f"optionally compressed ({', '.join(COMPRESSIONS)})")
        checked = compression is None or COMPRESSIONS[compression] is not None
        if builder == "parquet":
            _check_parquet(path)
        elif checked:
            text = _check_text(path)
            if kind == ".jsonl":
                _check_jsonl(path, text)
        try:
            return datasets.load_dataset(builder, data_files=str(path), split="train")
        except Exception as err:  # datasets raises many types for a corrupt file
            raise DsparkError(f"{path}: cannot read as {builder} ({first_line(err)})") from None
    if source.startswith((".", "/", "~")) or file_kind(Path(source))[0] in BUILDER_BY_SUFFIX:
        raise DsparkError(f"dataset file {source!r} does not exist")
    if not hub_reachable():
        raise DsparkError(f"cannot reach the hub to load dataset {source!r}; offline, pass a local file instead")
    try:
        return datasets.load_dataset(source, split=split)
    except Exception as err:
        first = first_line(err, 160)
        raise DsparkError(
            f"cannot load dataset {source!r} from the hub ({first}); offline, pass a local file instead"
        ) from None


def _pick(columns: list[str], wanted: str | None, guesses: tuple[str, ...], what: str) -> str | None:
    if wanted is not None:
        if wanted not in columns:
            raise DsparkError(f"{what} field {wanted!r} is not in the dataset; its fields are: {', '.join(columns)}")
        return wanted
    return next((name for name in guesses if name in columns), None)


def load_dataset_prompts(
    source: str,
    split: str = "train",
    prompt_field: str | None = None,
    category_field: str | None = None,
    limit: int | None = None,
) -> list[Prompt]:
    if limit is not None and limit < 1:
        raise DsparkError(f"--limit must be at least 1 (got {limit})")
    table = _load(source, split)
    columns = list(table.column_names)
    text_field = _pick(columns, prompt_field, PROMPT_FIELDS, "prompt")
    if text_field is None:
        raise DsparkError(f"no prompt field found; pass --prompt-field, one of: {', '.join(columns)}")
    category = _pick(columns, category_field, CATEGORY_FIELDS, "category")
    id_field = next((name for name in ID_FIELDS if name in columns), None)
    prompts = []
    for index, row in enumerate(table):
        value = row[text_field]
        turns = [str(t) for t in value] if isinstance(value, list) else [str(value)]
        if not turns or not turns[0].strip():
            continue
        prompt_id = str(row[id_field]) if id_field else str(index)
        prompts.append(Prompt(prompt_id, turns[0], str(row[category]) if category else "default", tuple(turns[1:])))
        if limit and len(prompts) >= limit:
            break
    if not prompts:
        raise DsparkError(f"dataset {source!r} has no prompts")
    return prompts

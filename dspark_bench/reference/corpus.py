"""Offline corpora for the reference model pair, read only from the local install.

No hub is reachable, so the training and evaluation text is whatever every machine
with this package installed already has: the standard library's sources, the pure
Python sources of our dependencies, the pydoc topic pages, and small structured
files (JSON/CSV/INI/TOML/cfg) shipped inside packages.

Keys never contain machine paths, so the split and fingerprints are the same on
every machine with the same Python and package versions.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

DOMAINS = ("code", "prose", "structured")
SPLITS = ("train", "heldout")

# Dependencies whose pure-Python sources join the code domain (when installed).
CODE_PACKAGES = (
    "transformers", "torch", "pandas", "optuna", "datasets", "numpy",
    "matplotlib", "typer", "rich", "yaml", "tokenizers", "safetensors",
)
SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__"})
MAX_CODE_BYTES = 200_000
MAX_STRUCT_BYTES = 100_000
MIN_DOCSTRING_CHARS = 40
STRUCT_SUFFIXES = (".json", ".csv", ".ini", ".toml", ".cfg")

# Per-mille held out; structured files are few and serve evaluation, so more of them.
HELDOUT_PER_MILLE = {"code": 50, "prose": 50, "structured": 200}


@dataclass(frozen=True)
class Document:
    key: str
    domain: str
    text: str


def _domain_of_key(key: str) -> str:
    if key.startswith("struct/"):
        return "structured"
    if key.startswith("pydoc/") or key.endswith("#docstrings"):
        return "prose"
    return "code"


def split_of(key: str) -> str:
    """'train' or 'heldout', from a hash of the key.

    The docstrings of a code file hash by the file's key, so a held-out file never
    leaks into training through its own docstrings.
    """
    base = key.split("#", 1)[0]
    bucket = int.from_bytes(hashlib.sha256(base.encode()).digest()[:8], "big") % 1000
    return "heldout" if bucket < HELDOUT_PER_MILLE[_domain_of_key(key)] else "train"


def _walk(root: Path, suffixes: tuple[str, ...], max_bytes: int) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        # Pruning in place keeps os.walk from descending into tests and caches.
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".dist-info")]
        for name in filenames:
            if name.endswith(suffixes):
                path = Path(dirpath, name)
                try:
                    if path.is_file() and path.stat().st_size <= max_bytes:
                        yield path
                except OSError:
                    continue


def _package_root(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


@functools.lru_cache(maxsize=1)
def _code_files() -> dict[str, Path]:
    """key -> path for every code file, e.g. 'stdlib/json/decoder.py'."""
    files: dict[str, Path] = {}
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in _walk(stdlib, (".py",), MAX_CODE_BYTES):
        files["stdlib/" + path.relative_to(stdlib).as_posix()] = path
    for name in CODE_PACKAGES:
        root = _package_root(name)
        if root is None:
            continue
        for path in _walk(root, (".py",), MAX_CODE_BYTES):
            files[f"pkg/{name}/" + path.relative_to(root).as_posix()] = path
    return files


def _site_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = {Path(paths["purelib"]), Path(paths["platlib"])}
    return sorted(r for r in roots if r.is_dir())


@functools.lru_cache(maxsize=1)
def _struct_files() -> dict[str, Path]:
    """key -> path, e.g. 'struct/matplotlib/mpl-data/...json' or 'struct/stdlib/...'."""
    files: dict[str, Path] = {}
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in _walk(stdlib, STRUCT_SUFFIXES, MAX_STRUCT_BYTES):
        files["struct/stdlib/" + path.relative_to(stdlib).as_posix()] = path
    for site in _site_roots():
        for path in _walk(site, STRUCT_SUFFIXES, MAX_STRUCT_BYTES):
            rel = path.relative_to(site).as_posix()
            if "/" in rel:  # top-level loose files belong to no package
                files["struct/" + rel] = path
    return files


@functools.lru_cache(maxsize=None)
def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # a few legacy files are latin-1; byte-faithful training needs utf-8


def _docstrings(source: str) -> str:
    """Module, class and function docstrings of a source file, blank-line separated."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    nodes = [tree] + [n for n in ast.walk(tree)
                      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    parts = []
    for node in nodes:
        doc = ast.get_docstring(node, clean=True)
        if doc and doc.strip():
            parts.append(doc.strip())
    text = "\n\n".join(parts)
    return text + "\n" if len(text) >= MIN_DOCSTRING_CHARS else ""


def _pydoc_topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return {}
    return {f"pydoc/{name}": text for name, text in topics.items() if text.strip()}


def _prose_sources() -> dict[str, object]:
    """key -> either the text (pydoc) or the code file path whose docstrings it is."""
    sources: dict[str, object] = dict(_pydoc_topics())
    for key, path in _code_files().items():
        sources[key + "#docstrings"] = path
    return sources


def iter_documents(domain: str, split: str) -> Iterator[Document]:
    """Documents of one domain and split, sorted by key, read lazily."""
    if domain not in DOMAINS:
        raise ValueError(f"domain must be one of {DOMAINS}, got {domain!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if domain == "prose":
        sources = _prose_sources()
    elif domain == "code":
        sources = _code_files()
    else:
        sources = _struct_files()
    for key in sorted(sources):
        if split_of(key) != split:
            continue
        text = _text_of(domain, sources[key])
        if text and text.strip():
            yield Document(key=key, domain=domain, text=text)


def _text_of(domain: str, source: object) -> str | None:
    if isinstance(source, str):
        return source
    text = _read(source)
    if text is None:
        return None
    return _docstrings_of(source) if domain == "prose" else text


@functools.lru_cache(maxsize=None)
def _docstrings_of(path: Path) -> str:
    # Parsing every source file takes ~a minute; the build walks prose several times.
    return _docstrings(_read(path) or "")


@functools.lru_cache(maxsize=None)
def corpus_fingerprint(domain: str, split: str) -> str:
    """Short sha256 over sorted keys and text hashes: changes when any document does."""
    h = hashlib.sha256()
    for doc in iter_documents(domain, split):
        h.update(doc.key.encode())
        h.update(b"\0")
        h.update(hashlib.sha256(doc.text.encode()).digest())
    return h.hexdigest()[:16]

"""Finds "engine" used for our own decoder: the glossary's test (docs/architecture.md).

An engine is a serving engine (llama.cpp, vLLM, SGLang, TensorRT-LLM, HF); ours is "our
decoder". This lists every line, in the package, its tests, benchmarks, tools and docs, where
"engine" names ours: "our engine", "the batched engine", a module or name that calls ours an
engine, or "ours" listed among the engines. Run it from the repository root:

    python tools/engine_words.py          # every such line, then the count
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHERE = ("dspark_bench", "tests", "benchmarks", "tools", "docs", "notebooks", "sweeps", "README.md")
SUFFIXES = {".py", ".md", ".sh", ".yaml", ".ipynb", ".toml"}

# Words of a phrase may be split across lines (a comment's or a docstring's) or joined by "_" (a
# name's): GAP joins them; A and Z stand where a word starts and ends, "_" and digits aside.
GAP = r"(?:[ \t_]|\n[ \t]*(?:#[ \t]*)?)+"
A, Z = r"(?<![A-Za-z])", r"(?![A-Za-z])"
# Each pattern is one way of calling our decoder an engine (case-insensitive).
PATTERNS = [
    rf"{A}our(?:{GAP}own)?{GAP}engines?{Z}",  # "our engine", "our own engine", test_…_our_engines_…
    rf"{A}(?:batched|batch[- ]1|speculative|eager|compiled|pytorch){GAP}engines?{Z}",  # ours by its shape
    r"\bdecoding[./]engine\b",  # the module that was decoding/engine.py
    r"\bengine\w*['\"]?[ \t]*(?:[:=]|\bin\b)[ \t]*\(?[^)\n]{0,30}['\"]ours['\"]",  # ours among the engines
]
FOUND = re.compile("|".join(f"(?:{p})" for p in PATTERNS), re.IGNORECASE)
# Where only our decoder runs (decoding/, replay's walk), "the engine" can only mean ours; an
# engine's *rule* (`--semantics`) is a serving engine's, and stays.
OURS_ONLY = ("dspark_bench/decoding/", "dspark_bench/replay/simulate.py", "dspark_bench/replay/rounds.py",
             "dspark_bench/replay/batched.py", "dspark_bench/replay/record.py", "dspark_bench/replay/sampled.py",
             "dspark_bench/replay/learned.py", "dspark_bench/replay/acceptance.py", "dspark_bench/measure/recording.py",
             "dspark_bench/measure/sampled_recording.py", "dspark_bench/measure/record_parts.py")
THE_ENGINE = re.compile(rf"{A}(?:the|real){GAP}engine{Z}(?! rule)(?!'s rule)(?:_s)?(?!_rule)", re.IGNORECASE)


def files(root: Path = ROOT):
    """The text files the glossary holds over, this tool itself excepted (its patterns name the words)."""
    for name in WHERE:
        path = root / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        for candidate in candidates:
            if candidate.suffix in SUFFIXES and candidate.is_file() and candidate.resolve() != Path(__file__).resolve():
                yield candidate


def engine_for_ours(path: Path, root: Path = ROOT) -> list[int]:
    """The line numbers of `path` where "engine" names our decoder (where a phrase starts)."""
    text = path.read_text(errors="replace")
    ours_only = path.relative_to(root).as_posix().startswith(OURS_ONLY)
    found = [*FOUND.finditer(text), *(THE_ENGINE.finditer(text) if ours_only else ())]
    return sorted({text.count("\n", 0, match.start()) + 1 for match in found})


def count(root: Path = ROOT) -> list[str]:
    """Every offending line as `path:line: text`."""
    found = []
    for path in files(root):
        lines = engine_for_ours(path, root)
        text = path.read_text(errors="replace").splitlines() if lines else []  # read again only where found
        found += [f"{path.relative_to(root)}:{i}: {text[i - 1].strip()}" for i in lines]
    return found


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    lines = count(root)
    print("\n".join(lines))
    print(f"{len(lines)} lines call our decoder an engine")

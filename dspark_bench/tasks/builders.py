"""Prompt builders over the held-out part of the reference pair's corpus (never its training part).

Each builder returns every candidate prompt on this machine, sorted by id; the task picks a
seeded sample of them. Prompts are cut to `max_chars` so that prompt + 128 new tokens fit the
reference pair's 256-token context.
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap

from dspark_bench.prompts import Prompt


def _documents(domain: str):
    from dspark_bench.reference.corpus import iter_documents  # reference/__init__ loads torch: kept off `tasks ls`

    return iter_documents(domain, "heldout")


@functools.lru_cache(maxsize=3)
def training_text(domain: str) -> str:
    """All training-split text of a domain, to refuse prompts that also occur there.

    Held-out files are split by name, but installed packages copy code between files
    (transformers' modular_* files, vendored modules), so a held-out prompt can still be
    training text; such prompts are skipped.
    """

    from dspark_bench.reference.corpus import iter_documents  # reference/__init__ loads torch: kept off `tasks ls`

    return "\n".join(doc.text for doc in iter_documents(domain, "train"))


def tail(text: str, max_chars: int) -> str:
    """The last lines of `text` that fit in max_chars (whole lines only when possible)."""
    if len(text) <= max_chars:
        return text
    cut = text[-max_chars:]
    newline = cut.find("\n")
    return cut[newline + 1 :] if 0 <= newline < len(cut) - 1 else cut


def _function_cuts(source: str) -> list[tuple[str, int]]:
    """(function name, index just after its docstring) for functions with a real body."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    line_starts = [0]
    for line in source.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    cuts = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(node.body) < 2:
            continue
        first = node.body[0]
        has_doc = isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
            and isinstance(first.value.value, str)
        if has_doc and first.end_lineno < len(line_starts):
            cuts.append((node.name, line_starts[first.end_lineno]))
    return sorted(cuts, key=lambda cut: cut[1])


@functools.lru_cache(maxsize=4)
def heldout_code(max_chars: int) -> list[Prompt]:
    prompts = []
    for doc in _documents("code"):
        for name, cut in _function_cuts(doc.text):
            prompts.append(Prompt(f"{doc.key}::{name}@{cut}", tail(doc.text[:cut], max_chars), "code"))
    return prompts


_SENTENCE_END = re.compile(r"[.!?:]\s")


@functools.lru_cache(maxsize=4)
def heldout_prose(max_chars: int) -> list[Prompt]:
    """A passage of each held-out document, cut after a sentence so the model continues it."""
    prompts = []
    for doc in _documents("prose"):
        for i, paragraph in enumerate(p for p in re.split(r"\n\s*\n", doc.text) if len(p) >= 200):
            head = paragraph[: max_chars]
            ends = [m.end() for m in _SENTENCE_END.finditer(head)]
            if ends:
                prompts.append(Prompt(f"{doc.key}#p{i}", head[: ends[-1]], "prose"))
    return prompts


STRUCTURED_WINDOWS = 6  # held-out structured files are few: take several windows of each


@functools.lru_cache(maxsize=4)
def heldout_structured(max_chars: int) -> list[Prompt]:
    """Windows of each held-out structured file, starting and ending at line ends."""
    prompts = []
    for doc in _documents("structured"):
        step = max(max_chars, len(doc.text) // STRUCTURED_WINDOWS)
        for start in range(0, len(doc.text) - max_chars // 2, step):
            start = 0 if start == 0 else doc.text.find("\n", start) + 1
            window = doc.text[start : start + max_chars]
            newline = window.rfind("\n")
            if start >= 0 and newline >= 40:
                prompts.append(Prompt(f"{doc.key}@{start}", window[: newline + 1], "structured"))
    return prompts


def _functions(source: str, shortest: int, longest: int) -> list[tuple[str, str]]:
    """(name, source) of every function whose source is shortest..longest characters, dedented."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.decorator_list:
            text = ast.get_source_segment(source, node, padded=True)
            if text and shortest <= len(text) <= longest:
                out.append((node.name, textwrap.dedent(text)))
    return sorted(out)


@functools.lru_cache(maxsize=4)
def heldout_edit(max_chars: int) -> list[Prompt]:
    """"Repeat this function with one change": a held-out function, a copy of it under a new
    name, then the start of a third copy under another. The answer copies the prompt: what
    prompt lookup is for. (Shown one copy, the reference target rarely copies; shown two, it
    mostly does.)"""
    training = training_text("code")
    prompts = []
    for doc in _documents("code"):
        for name, text in _functions(doc.text, max_chars // 6, max_chars // 3):
            if text in training:  # installed packages copy code between files (see training_text)
                continue
            text = text.rstrip()
            signature = re.search(rf"def\s+{re.escape(name)}\b", text)  # the name where it is defined
            again = text[: signature.end()] + "_v2" + text[signature.end() :]
            head = text[: signature.end()] + "_v3("
            prompts.append(Prompt(f"{doc.key}::{name}", f"{text}\n\n\n{again}\n\n\n{head}", "code"))
    return prompts


BUILDERS = {"heldout_code": heldout_code, "heldout_prose": heldout_prose, "heldout_structured": heldout_structured,
            "heldout_edit": heldout_edit}
CORPUS_DOMAIN = {"heldout_code": "code", "heldout_prose": "prose", "heldout_structured": "structured",
                 "heldout_edit": "code"}

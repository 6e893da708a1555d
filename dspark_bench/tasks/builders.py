"""Prompt builders over the held-out part of the reference pair's corpus (never its training part).

Each builder returns every candidate prompt on this machine, sorted by id; the task picks a
seeded sample of them. Prompts are cut to `max_chars` so that prompt + 128 new tokens fit the
reference pair's 256-token context. The long builders (`LONG_BUILDERS`) instead bound a prompt
in tokens of the reference tokenizer, for the long-context pair: a held-out document's text up
to a cut deep inside it, its category the depth bucket of its length.
"""

from __future__ import annotations

import ast
import bisect
import functools
import random
import re
import textwrap

from dspark_bench.depth import DEPTH_LABELS, depth_bucket, depth_label
from dspark_bench.tasks.prompts import Prompt


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


@functools.lru_cache(maxsize=4096)
def in_training(domain: str, text: str) -> bool:
    """Whether `text` occurs in the domain's training text: a search of all of it (~0.1 s for code),
    so each prompt's answer is kept."""
    return text in training_text(domain)


def document_of(prompt_id: str) -> str:
    """The corpus key of the document a builder's prompt comes from ("key::name@cut", "key@cut")."""
    return prompt_id.split("::")[0].rsplit("@", 1)[0]


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


@functools.lru_cache(maxsize=1)
def reference_tokenizer():
    """The reference pairs' tokenizer (the 256-token and the long pair share it): what the long
    tasks' prompts are counted in."""
    from dspark_bench.reference import default_pair_paths  # reference/__init__ loads torch: kept off `tasks ls`
    from dspark_bench.reference.tokenizer import load_tokenizer  # transformers: only when a long task loads

    return load_tokenizer(default_pair_paths()[0])


@functools.lru_cache(maxsize=4096)
def prompt_tokens(text: str) -> int:
    """A prompt's length in reference tokens, counted as a run encodes it (prompts.encode: the
    reference tokenizer has no chat template)."""
    return len(reference_tokenizer()(text, add_special_tokens=True)["input_ids"])


CHARS_PER_TOKEN = 8  # a document is tokenized up to 8 characters a token of the longest prompt (code runs ~4)


def _long_prompts(domain: str, min_tokens: int, max_tokens: int, cuts_of) -> list[Prompt]:
    """For each held-out document and each depth bucket its cuts reach: the document's text up to
    one of its cuts (`cuts_of(text)`: (name, index) pairs in order), min_tokens..max_tokens tokens
    long, its category that length's bucket (depth.depth_label). Which cut of a bucket: a choice
    seeded by the document's key, the same on every machine."""
    tokenizer = reference_tokenizer()
    docs = [doc for doc in _documents(domain) if len(doc.text) >= min_tokens]  # a token is at least a character
    heads = [doc.text[: max_tokens * CHARS_PER_TOKEN] for doc in docs]
    offsets = tokenizer(heads, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    picked = []
    for doc, head, spans in zip(docs, heads, offsets):
        starts = [start for start, _ in spans]
        by_bucket: dict[int, list[tuple[str, int]]] = {}
        for name, cut in cuts_of(doc.text):
            before = bisect.bisect_left(starts, cut)  # the tokens that start before the cut
            if cut <= len(head) and min_tokens <= before <= max_tokens:
                by_bucket.setdefault(int(depth_bucket(before)), []).append((name, cut))
        for bucket, cuts in sorted(by_bucket.items()):
            name, cut = random.Random(f"{doc.key}|{DEPTH_LABELS[bucket]}").choice(cuts)
            picked.append((f"{doc.key}::{name}@{cut}" if name else f"{doc.key}@{cut}", doc.text[:cut]))
    lengths = [prompt_tokens(text) for _, text in picked]  # recounted: a prefix may tokenize otherwise at its cut
    return sorted((Prompt(key, text, depth_label(n)) for (key, text), n in zip(picked, lengths)
                   if min_tokens <= n <= max_tokens), key=lambda prompt: prompt.id)


@functools.lru_cache(maxsize=2)
def heldout_long_code(min_tokens: int, max_tokens: int) -> list[Prompt]:
    """A long held-out Python file from its start, cut after a function's signature and docstring
    deep inside it."""
    return _long_prompts("code", min_tokens, max_tokens, _function_cuts)


def _sentence_cuts(text: str) -> list[tuple[str, int]]:
    return [("", match.start() + 1) for match in _SENTENCE_END.finditer(text)]  # just after the mark


@functools.lru_cache(maxsize=2)
def heldout_long_prose(min_tokens: int, max_tokens: int) -> list[Prompt]:
    """A long held-out document (a pydoc topic, a module's docstrings) from its start, cut after a
    sentence deep inside it."""
    return _long_prompts("prose", min_tokens, max_tokens, _sentence_cuts)


BUILDERS = {"heldout_code": heldout_code, "heldout_prose": heldout_prose, "heldout_structured": heldout_structured,
            "heldout_edit": heldout_edit}
# Builders bounded in tokens, not characters: builder(min_tokens, max_tokens).
LONG_BUILDERS = {"heldout_long_code": heldout_long_code, "heldout_long_prose": heldout_long_prose}
CORPUS_DOMAIN = {"heldout_code": "code", "heldout_prose": "prose", "heldout_structured": "structured",
                 "heldout_edit": "code", "heldout_long_code": "code", "heldout_long_prose": "prose"}

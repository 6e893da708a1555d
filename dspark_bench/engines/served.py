"""Which target a deployed engine serves, held against the pair a sweep was made on, before
`observe --against` reads a window (docs/observe.md#against-a-sweep-as-predicted-or-drifted; issue 66).

The speculative counters do not name the models, but the engine does, where it can be asked:

- a metrics URL: `GET /v1/models` beside it, which vLLM, llama-server, SGLang and trtllm-serve all
  answer (OpenAI's list: each model's `id`; vLLM's `root`, the path it loaded; llama-server's
  `models[].aliases` and `data[].meta.n_params`, its GGUF file's parameter count); where that
  answers nothing, the scrape's own `model_name` labels;
- a saved scrape: its `model_name` labels (vLLM's and SGLang's series carry them);
- a `.jsonl` of responses: each response's `model`.

A parameter count, where the engine reports one, decides: it names the weights, not a file. It
agrees with the sweep's target within COUNT_TOLERANCE (a GGUF carries a few tensors of its own,
RoPE factors among them). Otherwise a name matches the sweep's target by its fingerprint, by its
last two path parts (a hub id `org/name`, or a folder and its parent), or by its last part alone
where that part says which model it is (`target`, `model` and their like name no model: the
shipped pair's and the long pair's targets are both `…/target`). A user whose engine names the
target otherwise says so with `--served-model NAME`. Where the engine says nothing, nothing is
checked: the draft, which no engine names, is not checked either (a different draft shows as
drift, or as a draft length that is not the export's).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from dspark_bench.engines.counters import is_url, samples, scrape
from dspark_bench.errors import DsparkError

COUNT_TOLERANCE = 0.001  # relative: a GGUF's own tensors beside the checkpoint's
# Last path parts that name no particular model (a folder of weights is often called so).
GENERIC = frozenset({"target", "draft", "model", "models", "weights", "checkpoint", "main", "base", "default"})


@dataclass(frozen=True)
class Served:
    """What an engine says of the model it serves: its names, and its parameter count where it reports one."""

    names: tuple[str, ...]
    params: int | None = None


def models_url(url: str) -> str:
    """The /v1/models URL beside a metrics URL (same scheme, host and port)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/v1/models", "", ""))


def from_model_list(answer: dict) -> Served:
    """An OpenAI-style /v1/models answer: ids, vLLM's roots, llama-server's aliases and n_params."""
    names, params = [], None
    for entry in answer.get("data") or []:
        if isinstance(entry, dict):
            names += [str(entry[key]) for key in ("id", "root") if entry.get(key)]
            count = (entry.get("meta") or {}).get("n_params")
            params = int(count) if isinstance(count, (int, float)) and count > 0 else params
    for entry in answer.get("models") or []:  # llama-server's own list beside OpenAI's
        if isinstance(entry, dict):
            names += [str(entry[key]) for key in ("name", "model") if entry.get(key)]
            names += [str(alias) for alias in entry.get("aliases") or []]
    return Served(tuple(dict.fromkeys(names)), params)


def asked(url: str, timeout: float = 5.0) -> Served | None:
    """What the engine behind a metrics URL answers at /v1/models; None where it answers nothing
    usable (an engine without the endpoint, a proxy in front): an answer is not required."""
    try:
        with urllib.request.urlopen(models_url(url), timeout=timeout) as response:
            served = from_model_list(json.loads(response.read().decode(errors="replace")))
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError, AttributeError, OSError):
        return None
    return served if served.names or served.params else None


def labelled(text: str, where: str) -> Served:
    """The `model_name` labels of a scrape's series."""
    names = [labels["model_name"] for series in samples(text, where).values() for labels, _ in series
             if labels.get("model_name")]
    return Served(tuple(dict.fromkeys(names)))


def responded(text: str) -> Served:
    """The `model` of each response in a .jsonl (lines that are not JSON are the counter reader's to refuse)."""
    names = []
    for line in text.splitlines():
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("model"), str) and row["model"]:
            names.append(row["model"])
    return Served(tuple(dict.fromkeys(names)))


def served_by(sources: list[str]) -> Served:
    """What observe's sources say of the served model, together."""
    said = [one_source(source) for source in sources]
    names = tuple(dict.fromkeys(name for served in said for name in served.names))
    return Served(names, next((served.params for served in said if served.params), None))


def one_source(source: str) -> Served:
    """What `source` (a metrics URL, a saved scrape, a .jsonl) says of the served model; empty where
    it says nothing (the counters' own reader refuses a bad source)."""
    if is_url(source):
        return asked(source) or labelled(scrape(source), source)
    path = Path(source)
    if not path.is_file():
        return Served(())
    text = path.read_text(errors="replace")
    if path.suffix == ".jsonl":
        return responded(text)
    try:
        return labelled(text, source)
    except DsparkError:
        return Served(())


def parts(name: str) -> list[str]:
    """A model's name as lower-case path parts, a `.gguf` and a trailing slash dropped."""
    return [p for p in re.split(r"[/\\]+", name.strip().lower().removesuffix(".gguf")) if p]


def same_name(name: str, models: dict) -> bool:
    """Whether an engine's name for its model is the sweep's target (module docstring)."""
    if name in {models.get("target_fingerprint"), models.get("target_gguf_sha256")} - {None, ""}:
        return True
    mine, theirs = parts(str(models.get("target") or "")), parts(name)
    if not mine or not theirs:
        return False
    if len(mine) >= 2 and len(theirs) >= 2:
        return mine[-2:] == theirs[-2:]
    return mine[-1] == theirs[-1] and mine[-1] not in GENERIC


def check_target(served: Served, models: dict, folder: Path, served_model: str | None = None) -> None:
    """Refuse, in one line, a window from an engine that serves another target than the sweep's."""
    target, count = models.get("target") or "its target", models.get("target_params")
    if served.params and count:
        if abs(served.params - count) > COUNT_TOLERANCE * count:
            named = ", ".join(served.names) or "unnamed"
            raise DsparkError(f"the engine serves a {served.params:,}-parameter target ({named}); {folder} was swept "
                              f"on {target} ({count:,} parameters): give a sweep of the deployed pair")
        return
    if not served.names or served_model in served.names or any(same_name(n, models) for n in served.names):
        return
    hint = (f"--served-model {served_model} is not among them" if served_model else
            "or --served-model NAME where the engine names the target otherwise")
    raise DsparkError(f"the engine serves {', '.join(served.names)}; {folder} was swept on {target}: give a sweep of "
                      f"the deployed pair ({hint})")

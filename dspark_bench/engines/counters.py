"""What a deployed engine counted of its speculation: its Prometheus counters read, a window taken
between two scrapes, and what they say per draft position (docs/observe.md; issue 66).

Each engine counts, over the rounds that carried a draft: the rounds, the draft tokens, the
accepted draft tokens (the target's own bonus token never among them) and, per draft position
i, the rounds that accepted at least i + 1 tokens (a survival count). The names, read from each
engine's source (vLLM 0.34.0 vllm/v1/spec_decode/metrics.py SpecDecodingProm; llama.cpp's
tools/server/server-task.cpp after PR #26389, which the build this project makes carries;
TensorRT-LLM's trtllm-serve /prometheus/metrics):

- vLLM: `vllm:spec_decode_num_drafts_total`, `…_num_draft_tokens_total`, `…_num_accepted_tokens_total`,
  `…_num_accepted_tokens_per_pos_total{position}` (one series per engine index: summed);
- llama.cpp (`llama-server --metrics`): the same four under `llamacpp:`, counted when a request
  finishes (a request still running at a scrape is not in it);
- TensorRT-LLM: `trtllm_spec_decode_num_draft_tokens_total`, `…_num_accepted_tokens_total`, and per
  position `trtllm_spec_decode_drafted_tokens_total` / `…_accepted_tokens_total{token_position}`;
  its rounds are the rounds that drafted position 0.

SGLang exports no such counters (only gauges over its last 40 batches): its Prometheus text is
refused in one line, and its per-request counts are read from a JSONL of its responses instead
(`read_requests`).
A sample named `…_created` (prometheus_client's creation time) is not a count and is skipped.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from dspark_bench.errors import DsparkError


@dataclass(frozen=True)
class Names:
    """One engine's counter names (samples, `_total` included) and its position label."""

    drafts: str | None  # None: the rounds are the rounds that drafted position 0 (`drafted`)
    draft_tokens: str
    accepted: str
    per_position: str
    position_label: str
    drafted: str | None = None  # rounds that drafted each position, where the engine exports it


ENGINES = {
    "vllm": Names("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                  "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                  "position"),
    "llamacpp": Names("llamacpp:spec_decode_num_drafts_total", "llamacpp:spec_decode_num_draft_tokens_total",
                      "llamacpp:spec_decode_num_accepted_tokens_total",
                      "llamacpp:spec_decode_num_accepted_tokens_per_pos_total", "position"),
    "trtllm": Names(None, "trtllm_spec_decode_num_draft_tokens_total", "trtllm_spec_decode_num_accepted_tokens_total",
                    "trtllm_spec_decode_accepted_tokens_total", "token_position",
                    drafted="trtllm_spec_decode_drafted_tokens_total"),
}
SGLANG_MARK = "sglang:spec_accept_length"
DEFAULT_WINDOW_S = 60.0  # observe --window, where one metrics URL is scraped twice


@dataclass(frozen=True)
class Counts:
    """An engine's speculative counters at one scrape, or their change over a window: rounds that
    carried a draft, draft tokens, accepted draft tokens, and per position the rounds that accepted
    at least i + 1 (and, where the engine exports it, the rounds that drafted position i)."""

    engine: str
    rounds: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...]
    drafted: tuple[int, ...] | None = None

    def since(self, earlier: "Counts") -> "Counts":
        """The counts of the window from `earlier` to these; refused where any went backwards (the
        server restarted inside the window, so the difference counts nothing real)."""
        if earlier.engine != self.engine:
            raise DsparkError(f"the two scrapes are of different engines ({earlier.engine}, {self.engine})")
        pairs = {"rounds": (self.rounds, earlier.rounds), "draft tokens": (self.draft_tokens, earlier.draft_tokens),
                 "accepted tokens": (self.accepted, earlier.accepted)}
        width = max(len(self.per_position), len(earlier.per_position))
        now, then = padded(self.per_position, width), padded(earlier.per_position, width)
        pairs |= {f"accepted at position {i}": (a, b) for i, (a, b) in enumerate(zip(now, then))}
        gone = [name for name, (after, before) in pairs.items() if after < before]
        if gone:
            raise DsparkError(f"the engine's {gone[0]} counter went backwards between the scrapes ({pairs[gone[0]][1]} "
                              f"then {pairs[gone[0]][0]}): it restarted inside the window; take the window again")
        drafted = None
        if self.drafted is not None and earlier.drafted is not None:
            drafted = tuple(a - b for a, b in zip(padded(self.drafted, width), padded(earlier.drafted, width)))
        return Counts(self.engine, self.rounds - earlier.rounds, self.draft_tokens - earlier.draft_tokens,
                      self.accepted - earlier.accepted, tuple(a - b for a, b in zip(now, then)), drafted)

    def to_dict(self) -> dict:
        return {"engine": self.engine, "rounds": self.rounds, "draft_tokens": self.draft_tokens,
                "accepted": self.accepted, "accepted_per_position": list(self.per_position),
                **({"drafted_per_position": list(self.drafted)} if self.drafted is not None else {})}


def padded(values: tuple[int, ...], width: int) -> tuple[int, ...]:
    return tuple(values) + (0,) * (width - len(values))


def samples(text: str, where: str) -> dict[str, list[tuple[dict, float]]]:
    """Every sample of a Prometheus text exposition by its name (labels, value)."""
    found: dict[str, list[tuple[dict, float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                found.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    except ValueError as error:
        raise DsparkError(f"{where} is not a Prometheus text exposition ({error})") from None
    return found


def engine_of(found: dict, where: str) -> str:
    """The engine whose counters `found` holds; one line where none's are there."""
    for engine, names in ENGINES.items():
        if names.accepted in found:
            return engine
    if SGLANG_MARK in found:
        raise DsparkError(f"{where} is SGLang's: it exports no counts of drafted or accepted tokens, only gauges over "
                          f"its last 40 batches; give a .jsonl of its responses (meta_info) instead")
    raise DsparkError(f"{where} has no speculative decoding counters (vLLM's vllm:spec_decode_*, llama-server's "
                      f"llamacpp:spec_decode_* with --metrics, TensorRT-LLM's trtllm_spec_decode_*): is speculation "
                      f"on, and has a speculative request finished?")


def total(found: dict, name: str) -> int:
    """The sum of every series of a counter (vLLM's engine indices, ranks), 0 where it is absent."""
    return int(round(sum(value for _, value in found.get(name, []))))


def by_position(found: dict, name: str, label: str, where: str) -> tuple[int, ...]:
    """A per-position counter summed over its other labels, position 0 .. the highest seen."""
    sums: dict[int, float] = {}
    for labels, value in found.get(name, []):
        try:
            position = int(labels[label])
        except (KeyError, ValueError):
            raise DsparkError(f"{where}: a {name} series has no whole-number {label} label") from None
        sums[position] = sums.get(position, 0.0) + value
    return tuple(int(round(sums.get(i, 0.0))) for i in range(max(sums) + 1)) if sums else ()


def read_scrape(text: str, where: str = "the scrape") -> Counts:
    """The speculative counters of one scrape of an engine's /metrics."""
    found = samples(text, where)
    engine = engine_of(found, where)
    names = ENGINES[engine]
    per_position = by_position(found, names.per_position, names.position_label, where)
    drafted = by_position(found, names.drafted, names.position_label, where) if names.drafted else None
    rounds = total(found, names.drafts) if names.drafts else (drafted[0] if drafted else 0)
    return Counts(engine, rounds, total(found, names.draft_tokens), total(found, names.accepted), per_position,
                  drafted)


def scrape(url: str, timeout: float = 10.0) -> str:
    """The text an engine's metrics URL answers; one line where it does not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        raise DsparkError(f"{url} answered HTTP {error.code}") from None
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise DsparkError(f"{url} cannot be reached ({reason})") from None


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def read_source(source: str) -> Counts:
    """The counters of a metrics URL (scraped now), a saved scrape's file, or a file of per-request
    responses (`read_requests`: a .jsonl)."""
    if is_url(source):
        return read_scrape(scrape(source), source)
    path = Path(source)
    if not path.is_file():
        raise DsparkError(f"{source!r} is neither a metrics URL (http://…/metrics) nor a file")
    text = path.read_text(errors="replace")
    return read_requests(text, source) if path.suffix == ".jsonl" else read_scrape(text, source)


# SGLang's per-request counts (sglang 0.5.23: meta_info, or sglext.spec_tokens_details on the OpenAI
# endpoints with "return_spec_tokens_details": true; managers/schedule_batch.py), set when a request finishes.
SGLANG_KEYS = ("spec_verify_ct", "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_correct_drafts_histogram")


def request_details(response: dict) -> dict:
    """The part of one response that carries SGLang's speculative counts (or the response itself)."""
    for part in (response, response.get("meta_info") or {}, (response.get("sglext") or {}).get("spec_tokens_details")
                 or {}):
        if isinstance(part, dict) and "spec_correct_drafts_histogram" in part:
            return part
    return {}


def read_requests(text: str, where: str) -> Counts:
    """A window of finished requests, one response a line: SGLang's exact counts summed (its
    histogram h[j], the verify steps that accepted exactly j drafts, gives every position: the
    rounds that accepted at least i + 1 are Σ_{j > i} h[j])."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise DsparkError(f"{where} line {number} is not JSON") from None
    details = [request_details(r) for r in rows if isinstance(r, dict)]
    if any("timings" in r and "draft_n" in r.get("timings", {}) for r in rows if isinstance(r, dict)) and not any(
            details):
        raise DsparkError(f"{where} holds llama.cpp's per-request timings: they count draft and accepted tokens but "
                          "not rounds or positions; scrape llama-server's /metrics (--metrics) instead")
    details = [d for d in details if d]
    if not details:
        raise DsparkError(f"{where} has no per-request speculative counts (SGLang's {', '.join(SGLANG_KEYS)})")
    width = max(len(d["spec_correct_drafts_histogram"]) for d in details)
    histogram = [sum(d["spec_correct_drafts_histogram"][j] if j < len(d["spec_correct_drafts_histogram"]) else 0
                     for d in details) for j in range(width)]
    return Counts("sglang", int(sum(d.get("spec_verify_ct", 0) for d in details)),
                  int(sum(d.get("spec_num_proposed_drafts", 0) for d in details)),
                  int(sum(d.get("spec_num_correct_drafts", 0) for d in details)),
                  tuple(int(sum(histogram[i + 1:])) for i in range(width - 1)))


def window(sources: list[str], seconds: float | None, wait=time.sleep, say=None) -> tuple[Counts, str]:
    """The counts of a window, and how it was taken: between two scrapes (URLs or files), a URL
    scraped `seconds` apart (None: DEFAULT_WINDOW_S), or one saved scrape (everything since the
    engine started) or .jsonl of responses; `seconds` is refused where it would do nothing."""
    if not 1 <= len(sources) <= 2:
        raise DsparkError(f"give one metrics URL, one saved scrape, or two scrapes (start and end), not {len(sources)}")
    if seconds is not None and (len(sources) != 1 or not is_url(sources[0])):
        raise DsparkError("--window times the wait between two scrapes of one metrics URL; with saved scrapes or "
                          "a .jsonl it does nothing: drop it")
    seconds = DEFAULT_WINDOW_S if seconds is None else seconds
    if len(sources) == 2:
        first = read_source(sources[0])
        return read_source(sources[1]).since(first), f"between {sources[0]} and {sources[1]}"
    (only,) = sources
    if not is_url(only):
        since = "the requests it holds" if only.endswith(".jsonl") else "every count since the engine started"
        return read_source(only), f"{only}: {since}"
    if not seconds > 0:
        raise DsparkError(f"--window must be a number of seconds above 0, not {seconds:g}")
    first = read_source(only)
    if say:
        say(f"scraped {only}; scraping it again in {seconds:g} s")
    wait(seconds)
    return read_source(only).since(first), f"{only} over {seconds:g} s"

"""Context depth: how many tokens a position reads before it, and the buckets results are cut by.

The *depth* of a drafting round is the number of tokens in the context when it starts: the
prompt's tokens plus those generated before the round. Two things move with it (docs/depth.md):
what a pass costs (attention reads a KV cache that long) and how often the draft is right. Every
table that breaks a metric down by depth, the cost surface over depth and the depth-keyed
schedule cut depth at the same edges, declared here once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dspark_bench.errors import DsparkError

# Bucket b holds depths in [DEPTH_EDGES[b], DEPTH_EDGES[b + 1]); the last is open above.
DEPTH_EDGES = (0, 256, 1024, 2048, 4096)


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def depth_labels(edges=DEPTH_EDGES) -> list[str]:
    """The buckets' names, in order: "0-256", "256-1k", "1k-2k", "2k-4k", "4k+"."""
    return [f"{_tokens(a)}-{_tokens(b)}" for a, b in zip(edges[:-1], edges[1:])] + [f"{_tokens(edges[-1])}+"]


DEPTH_LABELS = tuple(depth_labels())


def depth_bucket(depth, edges=DEPTH_EDGES):
    """The bucket index of each depth (a number or an array of them)."""
    return np.searchsorted(np.asarray(edges[1:]), depth, side="right")


def depth_label(depth: int, edges=DEPTH_EDGES) -> str:
    """The bucket name of one depth, e.g. depth_label(1500) == "1k-2k"."""
    return depth_labels(edges)[int(depth_bucket(depth, edges))]


def round_depths(prompt_tokens: int, emitted) -> np.ndarray:
    """Each round's depth, from the prompt's length and the rounds' emitted tokens in order: a round
    starts after the prompt and every token the rounds before it emitted."""
    emitted = np.asarray(emitted, dtype=np.int64)
    return prompt_tokens + np.concatenate([[0], np.cumsum(emitted)[:-1]]) if len(emitted) else emitted


MIN_BUCKET_SHARE = 0.1  # a bucket with fewer of a workload's rounds is too few to choose a policy on

# The depths our cost model is timed at when a workload's rounds reach past the first bucket
# (measure/cost_model.py measure_depths): the bucket edges, where the buckets' rounds are priced between.
PRICED_DEPTHS = (256, 1024, 2048, 4096)


def priced_depths(deepest: int, trained: int | None = None) -> tuple[int, ...]:
    """The PRICED_DEPTHS a workload whose rounds reach `deepest` tokens is timed at: up to the first
    at or past it (a round is priced between two timed depths, not beyond the last), none past the
    model's `trained` context unless the workload itself goes there."""
    reach = next((d for d in PRICED_DEPTHS if d >= deepest), PRICED_DEPTHS[-1])
    limit = max(trained or reach, deepest)
    return tuple(d for d in PRICED_DEPTHS if d <= reach and d <= limit)


def spans_depth(depths, share: float = MIN_BUCKET_SHARE) -> bool:
    """Whether rounds at these depths fill more than one bucket, each of at least `share` of them:
    only then is a per-depth answer worth giving (a short-prompt workload's rounds sit in the first
    bucket, a few of its longest prompts' last rounds in the next)."""
    counts = np.bincount(depth_bucket(np.asarray(depths).ravel()), minlength=len(DEPTH_LABELS))
    return int((counts >= share * max(counts.sum(), 1)).sum()) > 1


# --- the depth schedule's policy: one policy per depth bucket -----------------------------------------

DEPTH_POLICY_EXAMPLE = "0.5/4,0.3/6,0.2/8"
# config.StoppingPolicy.depth_policy's help: what the knob holds, which `depth_policy` reads.
DEPTH_POLICY_HELP = (f"Depth schedule: a policy per context-depth bucket ({', '.join(DEPTH_LABELS)} tokens), "
                     "shallowest first, the last holding deeper: threshold/gamma_max under the policy's metric and "
                     f"min_draft_len (e.g. {DEPTH_POLICY_EXAMPLE}), or any family's, "
                     "metric:schedule:threshold/gamma_max/min_draft_len (e.g. learned:goodput:0/7/0). Its gamma_max "
                     "is the largest.")


@dataclass(frozen=True)
class DepthEntry:
    """One depth bucket's policy: its threshold and γ_max and, where the entry names them (`own`), its
    metric, schedule and min_draft_len; else the depth policy's metric and min_draft_len, and the
    threshold rule (schedules.check_depth_policy says which schedules an entry may name)."""

    threshold: float
    gamma_max: int
    metric: str = ""
    schedule: str = ""
    min_draft_len: int | None = None

    @property
    def own(self) -> bool:
        return bool(self.schedule)

    def text(self) -> str:
        short = f"{self.threshold:g}/{self.gamma_max}"
        return f"{self.metric}:{self.schedule}:{short}/{self.min_draft_len}" if self.own else short

    def knobs(self) -> dict:
        """The knobs of the depth policy's own that this bucket's policy sets (decoding/rules.bucket_policies)."""
        own = dict(metric=self.metric, schedule=self.schedule, min_draft_len=self.min_draft_len) if self.own else {}
        return {"threshold": self.threshold, "gamma_max": self.gamma_max, **own}


def depth_policy(text: str) -> tuple[DepthEntry, ...]:
    """The depth schedule's policy in each depth bucket, in DEPTH_LABELS order, from its knob: entries
    separated by commas, shallowest bucket first (e.g. "0.5/4,0.3/6,0.2/8"; "learned:goodput:0/7/0" names
    a policy of any family); the last entry holds for every deeper bucket. "" is none: (). A
    malformed one is refused in one line."""
    if not text.strip():
        return ()
    entries = [entry.strip() for entry in text.split(",")]
    if len(entries) > len(DEPTH_LABELS):
        raise DsparkError(f"depth_policy {text!r} has {len(entries)} entries; there are {len(DEPTH_LABELS)} depth "
                          f"buckets ({', '.join(DEPTH_LABELS)})")
    buckets = [depth_entry(entry) for entry in entries]
    return tuple(buckets + buckets[-1:] * (len(DEPTH_LABELS) - len(buckets)))


def depth_entry(entry: str) -> DepthEntry:
    """One entry of `depth_policy`: threshold/γ_max, or metric:schedule:threshold/γ_max/min_draft_len."""
    names = entry.split(":")
    numbers = names.pop().split("/")
    if len(names) not in (0, 2) or len(numbers) != (3 if names else 2) or not all(names):
        raise DsparkError(f"depth_policy entry {entry!r} is not threshold/gamma_max nor "
                          f"metric:schedule:threshold/gamma_max/min_draft_len (e.g. {DEPTH_POLICY_EXAMPLE!r})")
    try:
        threshold, gamma, low = float(numbers[0]), int(numbers[1]), int(numbers[2]) if names else None
    except ValueError:
        raise DsparkError(f"depth_policy entry {entry!r}: its threshold must be a number and its gamma_max and "
                          "min_draft_len integers") from None
    if not 0 <= threshold <= 1:  # NaN fails too
        raise DsparkError(f"depth_policy entry {entry!r}: its threshold must be in [0, 1]")
    if gamma < 1:
        raise DsparkError(f"depth_policy entry {entry!r}: its gamma_max must be at least 1")
    if low is not None and not 0 <= low <= gamma:
        raise DsparkError(f"depth_policy entry {entry!r}: its min_draft_len must be in [0, gamma_max]")
    return DepthEntry(threshold, gamma, *names, low) if names else DepthEntry(threshold, gamma)


def depth_entries(text: str) -> list[str]:
    """A depth policy's entries as its label writes them, without the trailing repeats the last
    entry implies."""
    buckets = list(depth_policy(text))
    while len(buckets) > 1 and buckets[-1] == buckets[-2]:
        buckets.pop()
    return [entry.text() for entry in buckets]

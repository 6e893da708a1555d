"""Context depth: how many tokens a position reads before it, and the buckets results are cut by.

The *depth* of a drafting round is the number of tokens in the context when it starts: the
prompt's tokens plus those generated before the round. Two things move with it (docs/depth.md):
what a pass costs (attention reads a KV cache that long) and how often the draft is right. Every
table that breaks a metric down by depth, the cost surface over depth and the depth-keyed
schedule cut depth at the same edges, declared here once.
"""

from __future__ import annotations

import numpy as np

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

"""A run's rounds and prompts cut by context depth, at the buckets of dspark_bench/depth.py.

Two breakdowns, named apart so that nobody reads one for the other:
- `by_depth`: each configuration's metrics over the rounds that started at each depth (the
  prompt's tokens plus those generated before the round). Every sample row carries its round
  totals per bucket (`depth_fields`), so this needs no trace.
- `by_prompt_depth`: all that `summarize` gives, measured speedup with its bootstrap interval
  included, over the prompts of each prompt length bucket. A decode is timed whole, so a measured
  speedup can only be cut by whole prompts, never by rounds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dspark_bench.decoding.types import Round
from dspark_bench.depth import DEPTH_EDGES, DEPTH_LABELS, depth_bucket, depth_label, round_depths
from dspark_bench.metrics import bucket_totals, summarize, summarize_by_depth


def depth_fields(rounds: list[Round], prompt_tokens: int) -> dict[str, list[int]]:
    """A sample row's round totals per depth bucket (metrics.DEPTH_TOTAL_COLUMNS)."""
    drafted, accepted, emitted = (np.array([getattr(r, name) for r in rounds], dtype=np.int64)
                                  for name in ("drafted", "accepted", "emitted"))
    bucket = depth_bucket(round_depths(prompt_tokens, emitted))
    return bucket_totals(bucket, len(DEPTH_LABELS), drafted, accepted, emitted)


def by_prompt_depth(samples: pd.DataFrame) -> pd.DataFrame:
    """summarize per configuration and prompt length bucket (column prompt_depth), buckets in order."""
    if samples.empty or "prompt_tokens" not in samples:
        return pd.DataFrame()
    labelled = samples.assign(prompt_depth=[depth_label(int(n)) for n in samples["prompt_tokens"]])
    table = summarize(labelled, by=["prompt_depth"])
    order = table["prompt_depth"].map(DEPTH_LABELS.index)
    return table.assign(_order=order).sort_values(["config_id", "_order"], kind="stable").drop(columns="_order")


def depth_breakdowns(samples: pd.DataFrame) -> dict:
    """summary.json's depth keys: the bucket edges, by_depth and by_prompt_depth."""
    return {"depth_edges": list(DEPTH_EDGES),
            "by_depth": summarize_by_depth(samples, DEPTH_LABELS).to_dict(orient="records"),
            "by_prompt_depth": by_prompt_depth(samples).to_dict(orient="records")}

"""A real load run: the batched decoder (continuous batching, `--batching refill`) serving requests
that arrive over time, the measurement replay under load (replay/load.py) predicts.

Each policy, and plain decoding, is a server of its own (`decoding.batched.serving` with the
requests' arrivals): it admits a request at a step boundary once it has arrived and has a free row,
and jumps its clock over the time it stands empty. The servers take turns a step each, so they
share the machine's drift at a fine grain, and each counts its own time only (docs/batch-sizes.md#under-load).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.batched import autoregressive_serving, interleave, speculative_serving
from dspark_bench.errors import DsparkError
from dspark_bench.replay.load import PLAIN, Arrivals, serving_metrics


@torch.inference_mode()
def load_run(pair, prompt_ids: list[list[int]], configs: list[DecodeConfig], arrivals: Arrivals, max_batch: int,
             eos_ids: frozenset[int], tpot_limit: float | None = None,
             ttft_limit: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Plain decoding and every policy serving `arrivals` (request i: prompt i mod prompts) at up
    to `max_batch` rows: (one row per server with serving_metrics' columns and `identical`, every
    request's output equal to plain decoding's, where greedy; every request's times)."""
    if not prompt_ids:
        raise DsparkError("a load run needs at least one prompt")
    ids = [prompt_ids[i % len(prompt_ids)] for i in range(arrivals.requests)]
    configs = [c.replace(batch_size=max_batch) for c in configs]
    times = [float(t) for t in arrivals.times]
    plain_config = configs[0] if configs else DecodeConfig().replace(batch_size=max_batch)
    servers = [autoregressive_serving(pair.target, ids, plain_config, max_batch, eos_ids, True, None, times)]
    if any(c.drafting.drafter != "model" for c in configs):
        raise DsparkError("a load run drafts with the draft model (the batched decoder's only drafter)")
    servers += [speculative_serving(pair.target, pair.draft, ids, c, max_batch, eos_ids, True, None, times)
                for c in configs]
    served = interleave(*servers)
    plain = [r.result.tokens for r in served[0]]
    rows, requests = [], []
    for index, (label, finished) in enumerate(zip([PLAIN] + [c.policy_label() for c in configs], served)):
        arrive, first, end = (np.array([getattr(r, name) for r in finished], dtype=np.float64)
                              for name in ("arrival", "first_token", "finished"))
        tokens = np.array([len(r.result.tokens) for r in finished], dtype=np.float64)
        greedy = plain_config.greedy
        rows.append({"config_id": index - 1, "config_label": label, "arrival": arrivals.label,
                     "arrival_rate": arrivals.rate, "requests": arrivals.requests,
                     **serving_metrics(arrive, first, end, tokens, tpot_limit, ttft_limit),
                     "identical": all(r.result.tokens == p for r, p in zip(finished, plain)) if greedy else None})
        requests.append(pd.DataFrame({"config_id": index - 1, "request": np.arange(len(finished)), "arrival_s": arrive,
                                      "admitted_s": [r.admitted for r in finished], "first_token_s": first,
                                      "finished_s": end, "tokens": tokens.astype(int)}))
    return pd.DataFrame(rows), pd.concat(requests, ignore_index=True)

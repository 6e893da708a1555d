"""Prices measured inside running decodes (decoding/pass_clock.py), as a cost model.

`measure_in_decode` runs plain decoding and a few speculative policies on the pair, every pass and
round timed where it runs (CUDA events on a GPU, no sync between them), and returns the cost
model they imply: t_draft and t_verify(k) the median passes of each length, t_round the median
round's time past its passes, t_plain plain decoding's whole step. A pass length no decode fed
(a k no policy verified) keeps the isolated price scaled by how the seen lengths moved.
"""

from __future__ import annotations

import dataclasses
import statistics

import numpy as np
import torch

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding import pass_clock
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.replay.cost import CostModel


def cost_from(spec: pass_clock.Timing, plain: pass_clock.Timing, isolated: CostModel) -> tuple[CostModel, dict]:
    """The in-decode cost model, and per price what it was and how many passes measured it."""
    medians = spec.medians()
    seen = {k: medians[("target", k + 1)] for k in range(len(isolated.t_verify)) if ("target", k + 1) in medians}
    ratios = [seconds / isolated.t_verify[k] for k, (seconds, _) in seen.items() if isolated.t_verify[k] > 0]
    scale = float(np.median(ratios)) if ratios else 1.0
    t_verify = [seen[k][0] if k in seen else isolated.t_verify[k] * scale for k in range(len(isolated.t_verify))]
    t_draft, drafts = medians.get(("draft", 1), (isolated.t_draft, 0))
    plain_steps = [total for total, _ in plain.rounds]
    t_plain = statistics.median(plain_steps) if plain_steps else 0.0
    model = dataclasses.replace(isolated, t_draft=t_draft, t_verify=t_verify, t_round=spec.overhead(),
                                t_plain=t_plain, by_depth={})
    detail = {"draft_passes": drafts, "verify_passes": {k: n for k, (_, n) in seen.items()},
              "verify_scaled_by": scale, "rounds": len(spec.rounds), "plain_steps": len(plain_steps),
              "plain_pass": plain.medians().get(("target", 1), (0.0, 0))[0],
              "catch_up_draft": medians.get(("draft", 2), (None, 0))[0]}
    return model, detail


@torch.inference_mode()
def measure_in_decode(pair, prompt_ids: list[list[int]], configs: list[DecodeConfig], isolated: CostModel,
                      eos_ids: frozenset[int] = frozenset()) -> tuple[CostModel, dict]:
    """Decode every prompt plainly and under every config (untimed once first, so compiled passes
    meet their shapes before the clock runs), then again with every pass timed: the cost model
    of those decodes (`cost_from`)."""
    def plain_all():
        for ids in prompt_ids:
            autoregressive_decode(pair.target, ids, configs[0], eos_ids)

    def spec_all():
        for config in configs:
            for ids in prompt_ids:
                speculative_decode(pair.target, pair.draft, ids, config, eos_ids)

    plain_all()
    spec_all()
    with pass_clock.timing(pair.device) as plain:
        plain_all()
    with pass_clock.timing(pair.device) as spec:
        spec_all()
    return cost_from(spec, plain, isolated)

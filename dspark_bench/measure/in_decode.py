"""Costs measured inside running decodes (measure/pass_clock.py), as a cost model.

`measure_in_decode` runs plain decoding and a few speculative policies on the pair, every pass and
round timed where it runs (CUDA events on a GPU, no sync between them), and returns the cost
model they imply: t_verify(k) the median pass of each length; the rounds' time past their passes
fitted as a part per round (t_round) and a part per draft step (the host's work between draft
passes, added to the median draft pass for t_draft, a pass after another draft pass where both kinds
were seen: what a round's first draft pass costs past it is t_first_draft); t_plain plain
decoding's whole step. A pass length no decode fed
(a k no policy verified) keeps the isolated cost scaled by how the seen lengths moved.
"""

from __future__ import annotations

import dataclasses
import statistics

import numpy as np
import torch

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.measure import pass_clock
from dspark_bench.replay.cost import CostModel

MIN_PASSES = 3  # a pass length fed fewer times is priced from the isolated cost, scaled


def cost_from(spec: pass_clock.Timing, plain: pass_clock.Timing, isolated: CostModel) -> tuple[CostModel, dict]:
    """The in-decode cost model, and per cost what it was and how many passes measured it."""
    every = spec.medians()
    medians = {key: value for key, value in every.items() if value[1] >= MIN_PASSES}
    seen = {k: medians[("target", k + 1)] for k in range(len(isolated.t_verify)) if ("target", k + 1) in medians}
    ratios = [seconds / isolated.t_verify[k] for k, (seconds, _) in seen.items() if isolated.t_verify[k] > 0]
    scale = float(np.median(ratios)) if ratios else 1.0
    t_verify = [seen[k][0] if k in seen else isolated.t_verify[k] * scale for k in range(len(isolated.t_verify))]
    draft_pass, drafts = medians.get(("draft", 1), (isolated.t_draft, 0))
    # Too few draft passes seen: the isolated step and its first's excess (measure_cost's chain_line).
    mixed, opening = draft_pass, (isolated.t_first_draft if drafts == 0 else 0.0)
    if min(len(spec.openers), len(spec.followers)) >= MIN_PASSES and \
            statistics.median(spec.openers) > statistics.median(spec.followers):
        # A round's first draft pass runs right after the target's and, on a CPU, costs more than the
        # ones after it (the draft's weights read back into cache: 1.24 against 0.67 ms on the shipped
        # pair, docs/batch-sizes.md#in-decode-prices): a draft step is priced at the later ones, and
        # the first's excess once a round (t_first_draft: the draft model's rounds only, not the heads'
        # or the lookup's), so a long draft is not priced as so many first steps
        # (where the first is no dearer, as on a GPU may be, every pass's median as before).
        draft_pass = statistics.median(spec.followers)
        opening = max(statistics.median(spec.openers) - draft_pass, 0.0)
    per_round, per_step = spec.overhead_fit()
    plain_steps = [total for total, _, _ in plain.rounds]
    t_plain = statistics.median(plain_steps) if plain_steps else 0.0
    model = dataclasses.replace(isolated, t_draft=draft_pass + per_step, t_verify=t_verify,
                                t_round=per_round, t_first_draft=opening, t_plain=t_plain, by_depth={})
    detail = {"draft_passes": drafts, "verify_passes": {k: n for k, (_, n) in seen.items()},
              "draft_pass": draft_pass, "first_draft_excess": opening, "every_draft_pass": mixed,
              "per_step_overhead": per_step, "median_round_overhead": spec.overhead(),
              "verify_scaled_by": scale, "rounds": len(spec.rounds), "plain_steps": len(plain_steps),
              "plain_pass": plain.medians().get(("target", 1), (0.0, 0))[0],
              "catch_up_draft": every.get(("draft", 2), (None, 0))[0]}
    return model, detail


@torch.inference_mode()
def measure_in_decode(pair, prompt_ids: list[list[int]], configs: list[DecodeConfig], isolated: CostModel,
                      eos_ids: frozenset[int] = frozenset(), repeats: int = 2) -> tuple[CostModel, dict]:
    """Decode every prompt plainly and under every config, untimed (compiled: three times, so that
    every shape's graph is recorded before the clock runs), then `repeats` times with every pass timed, plain and
    speculative interleaved prompt by prompt in a rotating order, so that both share the machine's
    drift (costs from two separate stretches of time disagree by its drift): the cost model of
    those decodes (`cost_from`)."""
    def decode(side, ids, clock=None):
        if side is None:
            return autoregressive_decode(pair.target, ids, configs[0], eos_ids, clock)
        return speculative_decode(pair.target, pair.draft, ids, side, eos_ids, clock)

    sides = [None, *configs]
    warm = 3 if any(c.verification.compiled for c in configs) else 1  # a CUDA graph is recorded at a shape's 3rd call
    for _ in range(warm):
        for ids in prompt_ids:
            for side in sides:
                decode(side, ids)
    plain, spec = pass_clock.Timing(pair.device), pass_clock.Timing(pair.device)
    turn = 0
    for _ in range(repeats):
        for ids in prompt_ids:
            turn += 1
            for side in sides[turn % len(sides):] + sides[: turn % len(sides)]:
                with pass_clock.timing(pair.device) as timed:
                    decode(side, ids, timed)
                (plain if side is None else spec).absorb(timed)
    return cost_from(spec, plain, isolated)

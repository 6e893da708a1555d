"""The cost model: this machine's step costs, measured, and the speedup they predict.

`t_draft` is one draft step and `t_verify(k)` one target pass over k + 1 new positions, each
the median of interleaved timings with the caches at a realistic length (DESIGN.md).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from dspark_bench.engine import Round


@dataclass
class CostModel:
    """Measured seconds: one draft step, and one target pass over k + 1 new positions."""

    t_draft: float
    t_verify: list[float]  # index k = 0 .. gamma: draft length verified
    context_tokens: int  # cache length the timings were taken at

    def to_dict(self) -> dict:
        return {"t_draft": self.t_draft, "t_verify": list(self.t_verify), "context_tokens": self.context_tokens}

    @classmethod
    def from_dict(cls, data: dict) -> "CostModel":
        return cls(float(data["t_draft"]), [float(t) for t in data["t_verify"]], int(data["context_tokens"]))

    def predict(self, rounds: list[Round], tokens: int) -> float:
        """DESIGN.md: N * t_verify(0) / sum over rounds of (s_r * t_draft + t_verify(L_r))."""
        spent = sum(r.draft_forwards * self.t_draft + self.t_verify[r.drafted] for r in rounds)
        return self.speedup(tokens, spent)

    def speedup(self, tokens, predicted_time):
        """The predicted speedup of `tokens` generated in `predicted_time` cost-model seconds
        (numbers or arrays): plain decoding's seconds per token, t_verify(0), over the policy's
        own, predicted_time / tokens; the same per-token ratio as a measured speedup."""
        return tokens * self.t_verify[0] / predicted_time


@torch.inference_mode()
def measure_cost(pair, context: list[int], gamma: int, repeats: int = 15) -> CostModel:
    """Median timings with the caches holding `context`, interleaved across k to share drift."""
    from dspark_bench.cache import CachedLM
    from dspark_bench.runner import synchronize

    target, draft = CachedLM(pair.target), CachedLM(pair.draft)
    target.prefill(context)
    draft.prefill(context)
    samples = {k: [] for k in range(-1, gamma + 1)}  # -1: the draft step
    filler = context[-gamma - 1 :] * (gamma + 1)

    def clock(lm, tokens):
        synchronize(pair.device)
        start = time.perf_counter()
        lm.forward(tokens, keep=len(tokens))  # the engine reads logits of every verified position
        synchronize(pair.device)
        lm.rollback(len(context))
        return time.perf_counter() - start

    for _ in range(repeats + 2):  # the first two passes warm up
        samples[-1].append(clock(draft, filler[:1]))
        for k in range(gamma + 1):
            samples[k].append(clock(target, filler[: k + 1]))
    median = {k: statistics.median(v[2:]) for k, v in samples.items()}
    return CostModel(median[-1], [median[k] for k in range(gamma + 1)], len(context))

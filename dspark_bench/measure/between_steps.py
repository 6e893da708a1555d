"""A cost model over B timed beside running decodes (`CostBetweenSteps`): a pass per turn of the decodes
it takes turns with, so that its costs and their times see the same machine (harness/under_load.py)."""

from __future__ import annotations

import dataclasses
import statistics

import torch

from dspark_bench.config import LEARNED
from dspark_bench.errors import DsparkError
from dspark_bench.measure.cost_model import batch_of, learned_clock, time_pass, time_prefill
from dspark_bench.replay.cost import CostModel, CostSurface, worst_spread


class CostBetweenSteps:
    """A cost model over B timed beside running decodes, one pass per `step()`, so that its timings
    share the machine's drift with the decodes it takes turns with (harness/under_load.py: this
    machine's speed can move 1.5x within minutes, which a cost model timed before a run cannot see).

    t_draft(B) and t_verify(B, k) through the batched decoder's own cache at every B, B = 1 too (a
    batched decoder with one live row runs BatchLM, not the batch-1 decoder's cache); its rows
    `contexts` in turn where given (the run's own requests: `batch_of`), else `context`; and each
    model's batch-1 prefill per prompt token, and what the learned signal adds to a draft step at
    every B (`learned_clock`), the cells in turn."""

    def __init__(self, pair, context: list[int], gamma: int, batch_sizes, contexts: list[list[int]] | None = None):
        self.pair, self.context = pair, context
        self.batches = {b: batch_of(pair, context, b, contexts) for b in sorted(set(batch_sizes) | {1})}
        self.filler = context[-gamma - 1 :] * (gamma + 1)
        self.learned = {b: learned_clock(pair, context, b, lambda lm=draft, rows=lengths: time_pass(
            pair, lm, self.filler[:1], rows)) for b, (_, draft, lengths) in self.batches.items()}
        self.cells = ([(b, k) for b in self.batches for k in (*range(-1, gamma + 1), LEARNED)]
                      + [(0, "target"), (0, "draft")])
        self.samples = {cell: [] for cell in self.cells}
        self.turns = 0

    @torch.inference_mode()
    def step(self) -> None:
        """Time the next cell once."""
        b, what = cell = self.cells[self.turns % len(self.cells)]
        self.turns += 1
        if b == 0:
            self.samples[cell].append(time_prefill(self.pair, getattr(self.pair, what), self.context))
            return
        if what == LEARNED:
            self.samples[cell].append(self.learned[b]())
            return
        target, draft, lengths = self.batches[b]
        lm, tokens = (draft, self.filler[:1]) if what == -1 else (target, self.filler[: what + 1])
        self.samples[cell].append(time_pass(self.pair, lm, tokens, lengths))

    def complete(self) -> None:
        """Time each cell a short run left with fewer than two timings (one is a warm-up)."""
        while any(len(values) < 2 for values in self.samples.values()):
            self.step()

    def surface(self) -> CostSurface:
        """The medians so far (each cell's first timing, a warm-up, left out)."""
        short = [cell for cell, values in self.samples.items() if len(values) < 2]
        if short:
            raise DsparkError(f"the cost surface beside the run has no timing of {short[0]} yet: too short a run")
        median = {cell: statistics.median(values[1:]) for cell, values in self.samples.items()}
        gamma = max(k for b, k in self.cells if b > 0 and k != LEARNED)
        models = {b: CostModel(median[(b, -1)], [median[(b, k)] for k in range(gamma + 1)], max(self.batches[b][2]), b,
                               spread=worst_spread(self.samples[(b, k)][1:] for k in range(-1, gamma + 1)),
                               t_learned=max(median[(b, LEARNED)], 0.0))
                  for b in self.batches}
        models[1] = dataclasses.replace(models[1], t_prefill_target=median[(0, "target")] / len(self.context),
                                        t_prefill_draft=median[(0, "draft")] / len(self.context))
        return CostSurface(models)

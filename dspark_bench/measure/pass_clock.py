"""The pass clock: every pass a running decode makes, timed where it runs (in-decode costs).

Costs timed pass by pass between syncs (measure/cost_model.py) are not what the passes cost inside a
decode: on the H200 the eager round came out 13–57 ms *cheaper* than its passes timed alone, and on
this CPU a live batch's step cost up to 1.26× its isolated cost (docs/gpu.md,
docs/batch-sizes.md). So a batch-1 decode given a clock (`timing(device)` opens one: the
`clock=` argument of speculative_decode and autoregressive_decode, decoding/types.py's
`PassClock`) is timed as it runs: `CachedLM.forward` puts a mark before and after each pass, and
the decoder marks each round's start and its decode's end. On CUDA a mark is a recorded CUDA
event, so nothing waits between marks and the decode runs as it does untimed; the events are
read once, when the block ends. On a CPU, where work runs as it is issued, a mark is the clock.

`Timing.passes` then holds (role, tokens fed, seconds) per pass inside a round, and
`Timing.rounds` each round's seconds and what its passes took: the difference is the round's
overhead (the host's decisions, its reads of the device, the launches between passes), which a
cost from whole decodes less isolated passes could only estimate, below zero at times.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch


@dataclass
class Timing:
    """A decode's clock (decoding/types.py's PassClock): its marks, and once settled its passes and rounds."""

    device: torch.device
    marks: list = field(default_factory=list)  # (kind, detail, mark): "round", "end", "pass"
    passes: list[tuple[str, int, float]] = field(default_factory=list)  # (role, tokens, seconds), rounds only
    # (round seconds, its passes' seconds, its draft passes)
    rounds: list[tuple[float, float, int]] = field(default_factory=list)
    # One-token draft passes that open their round (right after the target's pass) and the ones after
    # another draft pass: on a CPU the first reads the draft's weights back into cache (cost_from).
    openers: list[float] = field(default_factory=list)
    followers: list[float] = field(default_factory=list)

    def round_starts(self) -> None:
        self.marks.append(("round", None, self.mark()))

    def decode_ends(self) -> None:
        self.marks.append(("end", None, self.mark()))

    def before_pass(self):
        """The mark a pass starts at."""
        return self.mark()

    def after_pass(self, start, role: str, tokens: int) -> None:
        self.marks.append(("pass", (role, tokens), (start, self.mark())))

    def mark(self):
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))  # the models' device, not the current one
            return event
        return time.perf_counter()

    def between(self, start, end) -> float:
        if self.device.type == "cuda":
            return start.elapsed_time(end) / 1e3  # milliseconds
        return end - start

    def settle(self) -> None:
        """Read every mark (one wait for the device) into `passes` and `rounds`."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        opened, spent, drafts = None, 0.0, 0  # the open round's start mark, its passes' seconds, its draft passes
        for kind, detail, mark in self.marks:
            if kind == "pass":
                if opened is not None:  # a prefill, before any round, is not a round's pass
                    seconds = self.between(*mark)
                    self.passes.append((*detail, seconds))
                    spent += seconds
                    if detail == ("draft", 1):
                        (self.followers if drafts else self.openers).append(seconds)
                    drafts += detail[0] == "draft"
                continue
            if opened is not None:
                self.rounds.append((self.between(opened, mark), spent, drafts))
            opened, spent, drafts = (mark if kind == "round" else None), 0.0, 0
        self.marks.clear()

    def absorb(self, other: "Timing") -> None:
        """Take `other`'s settled passes and rounds (decodes timed block by block, interleaved)."""
        self.passes += other.passes
        self.rounds += other.rounds
        self.openers += other.openers
        self.followers += other.followers

    def medians(self) -> dict[tuple[str, int], tuple[float, int]]:
        """(role, tokens fed) -> (median seconds, passes)."""
        groups: dict[tuple[str, int], list[float]] = {}
        for role, tokens, seconds in self.passes:
            groups.setdefault((role, tokens), []).append(seconds)
        return {key: (statistics.median(values), len(values)) for key, values in sorted(groups.items())}

    def overhead(self) -> float:
        """The median round's seconds beyond its passes."""
        return statistics.median(total - passes for total, passes, _ in self.rounds) if self.rounds else 0.0

    def overhead_fit(self) -> tuple[float, float]:
        """(per round, per draft step): the rounds' seconds beyond their passes, fitted by least
        squares as a + b × draft passes (an early-stop draft step has host work of its own between
        passes: its confidence, its read, the rule), neither below 0."""
        if not self.rounds:
            return 0.0, 0.0
        extra = np.array([total - passes for total, passes, _ in self.rounds])
        steps = np.array([drafts for _, _, drafts in self.rounds], dtype=float)
        if np.ptp(steps) > 0:
            b, a = np.polyfit(steps, extra, 1)
            if b >= 0 and a >= 0:
                return float(a), float(b)
            if b < 0:  # no per-step work to see: all of it per round
                return max(float(np.mean(extra)), 0.0), 0.0
            return 0.0, max(float(np.sum(extra * steps) / np.sum(steps * steps)), 0.0)  # through the origin
        return max(float(np.mean(extra)), 0.0), 0.0


@contextmanager
def timing(device: torch.device) -> Iterator[Timing]:
    """A clock for the batch-1 decodes run inside the block (pass it as their `clock=`), its marks
    read into passes and rounds when the block ends."""
    clock = Timing(device)
    yield clock
    clock.settle()

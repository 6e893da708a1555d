"""What every decoder shares: a round's record, a decode's result, a draft block on the device,
and the clock a decode may be timed by."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass
class Round:
    drafted: int  # L_r: tokens kept in the draft and sent to the target
    accepted: int  # a_r: how many of them the target accepted
    emitted: int  # tokens this round added to the output (a_r + 1 unless EOS ended it)
    stop_reason: str  # "threshold" | "gamma_max" | "eos" | "budget"
    draft_tokens: list[int]  # the L_r drafted ids (the first a_r were accepted)
    confidences: list[float]  # one per proposal, including a dropped one that stopped the round
    target_token: int  # the target's own token ending the round (-1 if EOS was accepted first)
    draft_forwards: int  # s_r: draft forward passes this round really ran


@dataclass
class DecodeResult:
    """What every decoder returns, speculative or not."""

    tokens: list[int]  # generated ids, prompt excluded
    rounds: list[Round] = field(default_factory=list)
    target_forwards: int = 0  # forward passes after the prefill
    draft_forwards: int = 0
    controller: object = None  # an engine controller's state after the decode (controllers.py), to run on from

    def add_round(self, emitted: list[int], round_: "Round") -> None:
        """A verified round's tokens and record, and its passes: one target forward, its draft's."""
        self.tokens += emitted
        self.rounds.append(round_)
        self.target_forwards += 1
        self.draft_forwards += round_.draft_forwards


@dataclass
class Block:
    """A round's draft as the target verifies it, on the device."""

    tokens: torch.Tensor  # [n] drafted ids sent to the target
    probs: torch.Tensor | None  # [n, vocab] the draft distribution q each was drawn from (sampling)
    scores: torch.Tensor  # [s] the confidence of every proposal, one per draft forward (verify-side; the
    # early-stop ones were read on the host and live in the Proposal)
    kept: torch.Tensor | int  # how many of the n the rule keeps: n (early-stop, an int) or a 0-d
    # tensor the device decided (verify-side)


class PassClock(Protocol):
    """What times a running decode pass by pass (measure/pass_clock.py's `Timing`): a decoder given
    one marks each round's start and its decode's end, and its caches mark each pass; a decoder
    given None (the default) times nothing."""

    def round_starts(self) -> None: ...

    def decode_ends(self) -> None: ...

    def before_pass(self):
        """The mark a pass starts at."""

    def after_pass(self, start, role: str, tokens: int) -> None: ...

"""A round's draft as the host's rule builds it: the schedule applied token by token.

`Proposal` is the single place the stopping rule (rules.py, goodput.py) is applied while
drafting, for one row or each row of a batch; `draft_length` drives it on given confidences.
The budget schedule (budget.py) decides for a whole batch after each draft step (the batched
decoder asks it); a proposal tracks what it decides with, and alone it is goodput's rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.budget import row_rule
from dspark_bench.decoding.rules import discards_below, forced, keeps, keeps_failing


@dataclass
class Proposal:
    tokens: list[int]
    probs: list[torch.Tensor]  # the draft distribution q each token was drawn from
    confidences: list[float]
    stop_reason: str
    forwards: int
    limit: int = 0  # at most this many tokens: min(gamma_max, budget)
    cumulative: float = 1.0  # product of the confidences so far (the "cumulative" schedule)
    done: bool = False
    survival: float = 1.0  # goodput: fitted chance the draft so far is all accepted ...
    expected: float = 1.0  # ... and the round's expected output (goodput.py)
    alpha: float = 1.0  # ... and its last token's fitted acceptance
    batch_decides: bool = False  # the budget schedule in a batch: the batch's rule ends the draft (budget.py)
    last: bool = False  # the rule ended the draft at the token being taken (keeps_failing)
    discard_below: int = 0  # llama.cpp's rule: a shorter draft is thrown away
    config: DecodeConfig | None = None  # the policy it was started under (the depth schedule: its round's, at_depth)

    @classmethod
    def start(cls, config: DecodeConfig, budget: int, batched: bool = False) -> "Proposal":
        limit = min(config.stopping.gamma_max, budget)
        if limit < discards_below(config):
            limit = 0  # llama.cpp does not draft when the budget allows less than --spec-draft-n-min
        reason = "gamma_max" if limit == config.stopping.gamma_max else "budget"
        return cls([], [], [], reason, 0, limit, done=limit <= 0, discard_below=discards_below(config),
                   batch_decides=batched and schedules.of(config).whole_batch, config=config)

    def cap(self, available: int) -> None:
        """The drafter can propose only `available` tokens this round (heads: its k; lookup: as
        far as its match goes): fewer than the limit ends the draft there, "exhausted"."""
        if available < self.limit:
            self.limit = available if available >= self.discard_below else 0
            self.stop_reason = "exhausted"
            self.done = self.done or self.limit <= 0

    def consider(self, config: DecodeConfig, score: float) -> bool:
        """One draft forward proposed a token with confidence `score`: does it stay?

        The single place the schedule is applied while drafting (one row or a batch of rows).
        """
        self.forwards += 1
        self.cumulative *= score
        self.confidences.append(score)
        position = len(self.tokens) + 1
        if schedules.of(config).cost_aware:
            rule = row_rule(config)
            self.alpha = alpha = rule.curve(score)
            self.survival *= alpha
            self.expected += self.survival
            passes = self.batch_decides or bool(rule.continues(position, alpha, self.survival, self.expected))
        else:
            passes = keeps(config, position, score, self.cumulative)
        if passes or position <= forced(config):
            return True
        if keeps_failing(config):
            self.last = True  # it stays, and the draft stops after it (`take`)
            return True
        self.stop_reason = "threshold"  # the unconfident token is dropped
        self.end()
        return False

    def take(self, token: int, probs: torch.Tensor, eos_ids: frozenset[int]) -> None:
        """Keep a drafted token; the draft stops at EOS, at its limit, or where the rule said."""
        self.tokens.append(token)
        self.probs.append(probs)
        if token in eos_ids:
            self.stop_reason = "eos"
        elif len(self.tokens) >= self.limit:
            pass  # the limit's reason, set by `start`, wins over the rule's
        elif self.last:
            self.stop_reason = "threshold"
        else:
            return
        self.end()

    def walk(self, config: DecodeConfig, tokens: list[int], scores: list[float], eos_ids: frozenset[int]) -> None:
        """Apply the rule to a draft already made (its tokens and their confidences), token by token."""
        for token, score in zip(tokens, scores):
            if self.done:
                break
            if self.consider(config, score):
                self.take(token, None, eos_ids)

    def trim(self, admitted: int) -> None:
        """The target verifies only the first `admitted` drafted tokens (a controller's admission:
        controllers.AdaptiveVerification); the rest were drafted, and are dropped as a rule drops them."""
        if admitted < len(self.tokens):
            self.tokens, self.probs, self.stop_reason = self.tokens[:admitted], self.probs[:admitted], "threshold"

    def end(self) -> None:
        self.done = True
        if len(self.tokens) < self.discard_below:  # llama.cpp: the step decodes normally
            self.tokens, self.probs = [], []


def draft_length(config: DecodeConfig, confidences: list[float], budget: int | None = None) -> tuple[int, str]:
    """Drive the schedule with given confidences: (drafted length, stop reason). A helper for
    tests and worked examples (the seed's: 0.9, 0.85, 0.65 at threshold 0.7 drafts 2)."""
    proposal = Proposal.start(config, config.stopping.gamma_max if budget is None else budget)
    proposal.walk(config, [0] * len(confidences), confidences, frozenset())
    return len(proposal.tokens), proposal.stop_reason

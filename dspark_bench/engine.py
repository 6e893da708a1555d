"""The confidence-scheduled speculative decoder.

Invariant between rounds: `seq` holds every committed token (prompt + output); each model's
cache holds a prefix of `seq` and is fed the rest at its next forward. Usually that is only
the last token; after a fully accepted draft that ended at gamma_max, the draft also catches
up on its own last token, in the same forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dspark_bench import confidence, goodput
from dspark_bench.cache import CachedLM
from dspark_bench.config import DecodeConfig
from dspark_bench.sampling import choose, distribution, make_generator, uniform
from dspark_bench.schedule import discards_below, forced, keeps, keeps_failing


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
    last: bool = False  # the rule ended the draft at the token being taken (keeps_failing)
    discard_below: int = 0  # llama.cpp's rule: a shorter draft is thrown away

    @classmethod
    def start(cls, config: DecodeConfig, budget: int) -> "Proposal":
        limit = min(config.gamma_max, budget)
        if limit < discards_below(config):
            limit = 0  # llama.cpp does not draft when the budget allows less than --draft-min
        reason = "gamma_max" if limit == config.gamma_max else "budget"
        return cls([], [], [], reason, 0, limit, done=limit <= 0, discard_below=discards_below(config))

    def consider(self, config: DecodeConfig, score: float) -> bool:
        """One draft forward proposed a token with confidence `score`: does it stay?

        The single place the schedule is applied while drafting (one row or a batch of rows).
        """
        self.forwards += 1
        self.cumulative *= score
        self.confidences.append(score)
        position = len(self.tokens) + 1
        if config.schedule == "goodput":
            rule = goodput.rule_for(config)
            alpha = rule.curve(score)
            self.survival *= alpha
            self.expected += self.survival
            passes = bool(rule.continues(position, alpha, self.survival, self.expected))
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

    def end(self) -> None:
        self.done = True
        if len(self.tokens) < self.discard_below:  # llama.cpp: the step decodes normally
            self.tokens, self.probs = [], []


def draft_length(config: DecodeConfig, confidences: list[float], budget: int | None = None) -> tuple[int, str]:
    """Drive the schedule with given confidences: (drafted length, stop reason). A helper for
    tests and worked examples (the seed's: 0.9, 0.85, 0.65 at threshold 0.7 drafts 2)."""
    proposal = Proposal.start(config, config.gamma_max if budget is None else budget)
    for score in confidences:
        if proposal.done:
            break
        if proposal.consider(config, score):
            proposal.take(0, None, frozenset())
    return len(proposal.tokens), proposal.stop_reason


@torch.inference_mode()
def speculative_decode(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompt_ids: list[int],
    config: DecodeConfig,
    eos_ids: frozenset[int] = frozenset(),
) -> DecodeResult:
    target_lm, draft_lm = CachedLM(target), CachedLM(draft)
    target_lm.prefill(prompt_ids[:-1])
    draft_lm.prefill(prompt_ids[:-1])
    generator = make_generator(config, target_lm.device)
    seq, result = list(prompt_ids), DecodeResult(tokens=[])
    while len(result.tokens) < config.max_new_tokens:
        # Leave room for the target's own token at the end of the round.
        budget = config.max_new_tokens - len(result.tokens) - 1
        proposal = propose(draft_lm, seq, config, budget, generator, eos_ids)
        logits = target_lm.forward(seq[target_lm.length :] + proposal.tokens, keep=len(proposal.tokens) + 1)
        accepted, target_token = verify(logits, proposal, config, generator)
        emitted, round_ = close_round(proposal, accepted, target_token, eos_ids)
        seq += emitted
        result.tokens += emitted
        result.rounds.append(round_)
        result.target_forwards += 1
        result.draft_forwards += proposal.forwards
        # The last emitted token is fed at the next forward of both models.
        target_lm.rollback(len(seq) - 1)
        draft_lm.rollback(len(seq) - 1)
        if emitted[-1] in eos_ids:
            break
    return result


def close_round(proposal: Proposal, accepted: int, target_token: int, eos_ids: frozenset[int]):
    """The verified round's emitted tokens and its Round record (one row or one row of a batch)."""
    emitted = proposal.tokens[:accepted]
    if not (emitted and emitted[-1] in eos_ids):
        emitted.append(target_token)
    else:
        target_token = -1  # the draft's accepted EOS ended the sequence
    return emitted, Round(len(proposal.tokens), accepted, len(emitted), proposal.stop_reason, proposal.tokens,
                          proposal.confidences, target_token, proposal.forwards)


def propose(
    draft_lm: CachedLM, seq: list[int], config: DecodeConfig, budget: int, generator, eos_ids: frozenset[int]
) -> Proposal:
    """Draft up to min(gamma_max, budget) tokens, stopping when the schedule says so."""
    proposal = Proposal.start(config, budget)
    pending = seq[draft_lm.length :]
    while not proposal.done:
        logits = draft_lm.forward(pending)[-1]
        probs = distribution(logits, config)
        if proposal.consider(config, float(confidence.METRICS[config.metric](probs, config.topk))):
            token = choose(logits, probs, config, generator)
            proposal.take(token, probs, eos_ids)
            pending = [token]
    return proposal


def acceptance_probability(p_token: float, q_token: float) -> float:
    """The rejection rule: accept a drafted token x with probability min(1, p(x) / q(x)).

    On rejection the target's token is drawn from norm(max(p - q, 0)); if every drafted token
    is accepted, a bonus token is drawn from p. This makes the output distributed exactly as
    the target's own samples (Leviathan et al. 2023; Chen et al. 2023).
    """
    return 1.0 if p_token >= q_token else p_token / q_token


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where the target's token comes from after a rejection: norm(max(p - q, 0))."""
    residual = (p - q).clamp_min(0.0)
    total = residual.sum()
    return residual / total if total > 0 else p  # p == q up to rounding: nothing to correct


def verify(logits: torch.Tensor, proposal: Proposal, config: DecodeConfig, generator,
           choices: list[int] | None = None) -> tuple[int, int]:
    """Target logits [L+1, vocab] over the draft -> (accepted count, the target's token).

    `choices`: the argmax of `logits` where the caller has it already (a batch takes it once)."""
    if config.greedy:
        # Greedy: accept the longest prefix matching the target's argmax.
        choices = logits.argmax(dim=-1).tolist() if choices is None else choices
        accepted = 0
        while accepted < len(proposal.tokens) and proposal.tokens[accepted] == choices[accepted]:
            accepted += 1
        return accepted, choices[accepted]
    target_probs = distribution(logits, config)
    for i, (token, q) in enumerate(zip(proposal.tokens, proposal.probs)):
        p = target_probs[i]
        if uniform(generator) >= acceptance_probability(float(p[token]), float(q[token])):
            return i, int(torch.multinomial(residual_distribution(p, q), 1, generator=generator))
    bonus = target_probs[len(proposal.tokens)]
    return len(proposal.tokens), int(torch.multinomial(bonus, 1, generator=generator))

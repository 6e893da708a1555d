"""The confidence-scheduled speculative decoder.

Invariant between rounds: `seq` holds every committed token (prompt + output); each model's
cache holds a prefix of `seq` and is fed the rest at its next forward. Usually that is only
the last token; after a fully accepted draft that ended at gamma_max, the draft also catches
up on its own last token, in the same forward.

Decisions stay on the device: drafted tokens are drawn there and fed back as tensors, the
target verifies the block with tensor operations (first mismatch, or the rejection rule with
uniforms and residual draws from the device generator), and the host reads values back only
through host.fetch — once per round for the accepted count and the target's token, plus, in
the "early-stop" draft mode, once per draft step to decide whether to draft on. The
"verify-side" mode removes those: the draft runs to its limit and the rule cuts the block on
the device (`draft_block`), so a round waits for the device exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dspark_bench import confidence, goodput
from dspark_bench.cache import CachedLM
from dspark_bench.config import DecodeConfig
from dspark_bench.errors import DsparkError
from dspark_bench.host import fetch
from dspark_bench.sampling import distribution, draw, make_generator, pick
from dspark_bench.schedule import DeviceRule, discards_below, forced, keeps, keeps_failing


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

    def walk(self, config: DecodeConfig, tokens: list[int], scores: list[float], eos_ids: frozenset[int]) -> None:
        """Apply the rule to a draft already made (its tokens and their confidences), token by token."""
        for token, score in zip(tokens, scores):
            if self.done:
                break
            if self.consider(config, score):
                self.take(token, None, eos_ids)

    def end(self) -> None:
        self.done = True
        if len(self.tokens) < self.discard_below:  # llama.cpp: the step decodes normally
            self.tokens, self.probs = [], []


def draft_length(config: DecodeConfig, confidences: list[float], budget: int | None = None) -> tuple[int, str]:
    """Drive the schedule with given confidences: (drafted length, stop reason). A helper for
    tests and worked examples (the seed's: 0.9, 0.85, 0.65 at threshold 0.7 drafts 2)."""
    proposal = Proposal.start(config, config.gamma_max if budget is None else budget)
    proposal.walk(config, [0] * len(confidences), confidences, frozenset())
    return len(proposal.tokens), proposal.stop_reason


@dataclass
class Block:
    """A round's draft as the target verifies it, on the device."""

    tokens: torch.Tensor  # [n] drafted ids sent to the target
    probs: torch.Tensor | None  # [n, vocab] the draft distribution q each was drawn from (sampling)
    scores: torch.Tensor  # [s] the confidence of every proposal, one per draft forward
    kept: torch.Tensor | int  # how many of the n the rule keeps: n (early-stop, an int) or a 0-d
    # tensor the device decided (verify-side)


@torch.inference_mode()
def speculative_decode(
    target: torch.nn.Module,
    draft,
    prompt_ids: list[int],
    config: DecodeConfig,
    eos_ids: frozenset[int] = frozenset(),
) -> DecodeResult:
    """`draft`: what config.drafter drafts with — the draft model, the target's heads, or
    nothing (lookup); drafters.py."""
    from dspark_bench.drafters import start_drafter  # drafters build on this module's Block and Proposal

    capacity = len(prompt_ids) + config.max_new_tokens + config.gamma_max + 1
    target_lm = CachedLM(target, config.compiled, capacity, hidden=config.drafter == "heads")
    target_lm.prefill(prompt_ids[:-1])
    drafter = start_drafter(draft, target_lm, prompt_ids, config, capacity)
    generator = make_generator(config, target_lm.device)
    # What the device needs from the host is copied once, here: on CUDA a copy from the host
    # waits for the work queued before it, like a read. After this, tokens stay on the device.
    if config.draft_mode == "verify-side" and target_lm.device.type == "mps":
        raise DsparkError("the verify-side draft mode decides in float64, which MPS lacks: use early-stop there")
    rule = DeviceRule(config, target_lm.device) if config.draft_mode == "verify-side" else None
    eos_tensor = torch.tensor(sorted(eos_ids), dtype=torch.long, device=target_lm.device)
    keep_recent = recent_tokens(config)
    recent = torch.tensor(prompt_ids[-keep_recent:], dtype=torch.long, device=target_lm.device)  # seq's tail, on the device
    seq, result = list(prompt_ids), DecodeResult(tokens=[])
    while len(result.tokens) < config.max_new_tokens:
        # Leave room for the target's own token at the end of the round.
        proposal = Proposal.start(config, config.max_new_tokens - len(result.tokens) - 1)
        block = drafter.propose(recent, seq, proposal, generator, eos_ids, rule, eos_tensor)
        logits = target_lm.forward(torch.cat([unseen(recent, seq, target_lm), block.tokens]),
                                   keep=len(block.tokens) + 1)
        accepted_on_device, token_on_device = verify(logits, block, config, generator)
        drafter.observe(target_lm, accepted_on_device)
        accepted, target_token = read_round(proposal, block, accepted_on_device, token_on_device, config, eos_ids)
        if drafter.round_forwards is not None:  # heads: one pass a round; lookup: none
            proposal.forwards = drafter.round_forwards
        emitted, round_ = close_round(proposal, accepted, target_token, eos_ids)
        seq += emitted
        recent = torch.cat([recent, block.tokens[:accepted], token_on_device.view(1)])[-keep_recent:]
        result.tokens += emitted
        result.rounds.append(round_)
        result.target_forwards += 1
        result.draft_forwards += proposal.forwards
        # The last emitted token is fed at the next forward of both models.
        target_lm.rollback(len(seq) - 1)
        drafter.rollback(len(seq) - 1)
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


def recent_tokens(config: DecodeConfig) -> int:
    """How much of the sequence's tail a model may not have seen: its last token; the draft's own
    last token after a draft that ran to its limit, all accepted; and one more per round that
    drafted nothing (the budget's last round; under llama.cpp's rule at most min_draft_len)."""
    return config.gamma_max + 4


def unseen(recent: torch.Tensor, seq: list[int], lm: CachedLM) -> torch.Tensor:
    """The tokens of `seq` past `lm`'s cache, as a view of `recent` (seq's tail on the device)."""
    count = len(seq) - lm.length
    if not 0 < count <= len(recent):
        raise DsparkError(f"the engine lost track of its cache ({count} unseen tokens); please report this")
    return recent[len(recent) - count :]


def draft_block(draft_lm: CachedLM, pending: torch.Tensor, config: DecodeConfig, proposal: Proposal, generator,
                eos_ids: frozenset[int], rule: DeviceRule | None, eos_tensor: torch.Tensor) -> Block:
    """The round's draft under config.draft_mode.

    "early-stop": after each draft forward the host learns the token and its confidence (one
    sync) and applies the rule (`Proposal`) to decide whether to run the next forward.
    "verify-side": the draft runs to the round's limit with no sync at all, and the rule cuts
    the block on the device (`rule`, schedule.DeviceRule); the target verifies the whole block but
    accepts only the kept prefix. Greedy: the same tokens and rounds; more draft and verify work,
    no waits. Sampling: as lossless, but the draft draws past the cut, so other samples.
    `pending`: what the draft has not seen of the sequence (1 or 2 tokens), on the device."""
    tokens, probs, scores = [], [], []
    for _ in range(proposal.limit):
        if config.draft_mode == "early-stop" and proposal.done:
            break
        logits = draft_lm.forward(pending)[-1]
        q = distribution(logits, config)
        scores.append(confidence.METRICS[config.metric](q, config.topk))
        token = pick(logits, q, config, generator)
        pending = token.view(1)
        if config.draft_mode == "early-stop":
            score, token_id = fetch(scores[-1], token)  # the loop must know now whether to go on
            if not proposal.consider(config, score):
                continue
            proposal.take(token_id, q, eos_ids)
        tokens.append(token)
        probs.append(q)
    device = draft_lm.device
    tokens = torch.stack(tokens) if tokens else torch.zeros(0, dtype=torch.long, device=device)
    scores = torch.stack(scores) if scores else torch.zeros(0, device=device)
    probs = torch.stack(probs) if probs and not config.greedy else None
    if config.draft_mode == "verify-side":
        return Block(tokens, probs, scores, rule.kept(scores, tokens, eos_tensor))
    kept = len(proposal.tokens)  # llama.cpp's discard may have emptied the draft
    return Block(tokens[:kept], probs[:kept] if probs is not None else None, scores, kept)


def read_round(proposal: Proposal, block: Block, accepted: torch.Tensor, target_token: torch.Tensor,
               config: DecodeConfig, eos_ids: frozenset[int]) -> tuple[int, int]:
    """The round's one host sync: the accepted count and the target's token; in verify-side mode
    the draft too, which the host's own rule (`Proposal`) then walks for the round's record."""
    if config.draft_mode == "early-stop":
        return tuple(fetch(accepted, target_token))
    accepted, target_token, kept, tokens, scores = fetch(accepted, target_token, block.kept, block.tokens,
                                                         block.scores)
    proposal.walk(config, tokens, scores, eos_ids)
    if len(proposal.tokens) != kept:
        raise DsparkError(f"the device kept {kept} drafted tokens where the rule keeps {len(proposal.tokens)} "
                          f"({config.label()}); please report this")
    proposal.confidences, proposal.forwards = scores, len(scores)  # every draft step ran
    return accepted, target_token


def acceptance_probability(p_token: torch.Tensor, q_token: torch.Tensor) -> torch.Tensor:
    """The rejection rule: accept a drafted token x with probability min(1, p(x) / q(x)).

    On rejection the target's token is drawn from norm(max(p - q, 0)); if every drafted token
    is accepted, a bonus token is drawn from p. This makes the output distributed exactly as
    the target's own samples (Leviathan et al. 2023; Chen et al. 2023).
    """
    return torch.where(p_token >= q_token, 1.0, p_token / q_token)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where the target's token comes from after a rejection: norm(max(p - q, 0))."""
    residual = (p - q).clamp_min(0.0)
    total = residual.sum()
    return torch.where(total > 0, residual / total, p)  # p == q up to rounding: nothing to correct


def verify(logits: torch.Tensor, block: Block, config: DecodeConfig, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Target logits [n+1, vocab] over a drafted block -> (accepted count, the target's token),
    both 0-d tensors left on the device. Only the block's first `kept` tokens can be accepted."""
    n = len(block.tokens)
    within = torch.arange(n, device=logits.device) < block.kept
    if config.greedy:  # the longest kept prefix matching the target's argmax
        choices = logits.argmax(dim=-1)
        accepted = ((block.tokens == choices[:n]) & within).long().cumprod(dim=0).sum()
        return accepted, choices.gather(0, accepted.view(1))[0]
    p_all = distribution(logits, config)  # [n+1, vocab]
    q_all = torch.cat([block.probs if n else p_all[:0], torch.zeros_like(p_all[:1])])  # no q after the block
    rows = torch.arange(n, device=logits.device)
    wide = torch.float32 if logits.device.type == "mps" else torch.float64  # MPS has no float64
    p_x, q_x = p_all[rows, block.tokens].to(wide), q_all[rows, block.tokens].to(wide)
    draws = torch.rand(n, generator=generator, device=logits.device)
    accepted = ((draws < acceptance_probability(p_x, q_x)) & within).long().cumprod(dim=0).sum()
    p, q = p_all.index_select(0, accepted.view(1))[0], q_all.index_select(0, accepted.view(1))[0]
    # A rejection inside the kept prefix draws from the residual; past it, p's own bonus token.
    return accepted, draw(torch.where(accepted < block.kept, residual_distribution(p, q), p), generator)

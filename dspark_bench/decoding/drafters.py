"""Drafters: what proposes a round's tokens (DecodeConfig.drafter).

The contract, which the decoder's loop (speculative.speculative_decode) is written against:
  propose(recent, seq, proposal, ...) -> Block   up to proposal.limit tokens from the current
      sequence, each with the distribution it was drawn from (the rejection rule needs it)
      and a confidence; the scheduler's rule (`Proposal`, under the round's policy,
      proposal.config) decides how many stay;
  observe(target_lm, accepted)                    what the target's verify pass tells it;
  rollback(length)                                forget everything past `length` tokens;
  round_forwards                                  drafting work a round costs, if not one
                                                  forward per proposed token (None).

  "model"   a second causal LM with its own KV cache, stepped one token at a time
            (drafters.draft_block: early-stop or verify-side);
  "heads"   k heads on the target's last hidden state (heads.py), which the verify pass
            already computed: one pass proposes a segment of up to k tokens at once, and the
            rule cuts it — on the host after one read (early-stop) or on the device (verify-side);
  "lookup"  prompt lookup on the host (lookup.py); no model at all.
Replay records any of them the same way (record.py), so sweeps, reports and calibration work
on every drafter.
"""

from __future__ import annotations

import torch

from dspark_bench.config import LEARNED, DecodeConfig
from dspark_bench.decoding import confidence, lookup
from dspark_bench.decoding.cached_lm import CachedLM, unseen
from dspark_bench.decoding.heads import Heads
from dspark_bench.decoding.host import fetch
from dspark_bench.decoding.proposal import Proposal
from dspark_bench.decoding.rules import DeviceRule
from dspark_bench.decoding.sampling import distribution, pick
from dspark_bench.decoding.types import Block, PassClock
from dspark_bench.errors import DsparkError


class ModelDrafter:
    round_forwards = None  # one per draft step, counted by the proposal

    def __init__(self, model: torch.nn.Module, prompt_ids: list[int], config: DecodeConfig, capacity: int,
                 clock: PassClock | None = None):
        self.lm = CachedLM(model, config.verification.compiled, capacity, role="draft", clock=clock)
        self.lm.prefill(prompt_ids[:-1])

    def propose(self, recent, seq, proposal: Proposal, generator, eos_ids, rule, eos_tensor) -> Block:
        return draft_block(self.lm, unseen(recent, seq, self.lm), proposal.config, proposal, generator, eos_ids, rule,
                           eos_tensor, seq)

    def observe(self, target_lm: CachedLM, accepted: torch.Tensor) -> None:
        pass

    def rollback(self, length: int) -> None:
        self.lm.rollback(length)


class HeadsDrafter:
    round_forwards = 1  # the heads' one pass over a hidden state the target computed anyway (0: none this round)

    def __init__(self, heads: Heads, target_lm: CachedLM):
        self.heads = heads
        self.hidden = target_lm.hidden[-1] if target_lm.hidden is not None else None  # the prefill's last

    def propose(self, recent, seq, proposal: Proposal, generator, eos_ids, rule, eos_tensor) -> Block:
        config, device = proposal.config, recent.device
        proposal.cap(self.heads.count if self.hidden is not None else 0)  # a one-token prompt has no hidden state yet
        n = proposal.limit
        self.round_forwards = int(n > 0)  # no pass in a round that may draft nothing
        if n <= 0:
            block = empty_block(device)
            if config.verification.draft_mode == "verify-side":  # the round's read expects the device's cut
                block.kept = rule.kept(block.scores, block.tokens, eos_tensor)
            return block
        logits = self.heads(self.hidden, n)  # [n, vocab]
        q = distribution(logits, config)
        scores = confidence.score(config, q)
        tokens = pick(logits, q, config, generator)  # head i's token is drawn from head i's q alone
        probs = None if config.greedy else q
        if config.verification.draft_mode == "verify-side":
            return Block(tokens, probs, scores, rule.kept(scores, tokens, eos_tensor))
        host_tokens, host_scores = fetch(tokens, scores)  # the segment's one read; the rule cuts it here
        proposal.walk(config, host_tokens, host_scores, eos_ids)
        kept = len(proposal.tokens)
        return Block(tokens[:kept], probs[:kept] if probs is not None else None, scores, kept)

    def observe(self, target_lm: CachedLM, accepted: torch.Tensor) -> None:
        # The round's last token came from the hidden state at the accepted position: the next
        # round's heads read it (no read to the host: `accepted` indexes on the device).
        self.hidden = target_lm.hidden.index_select(0, accepted.view(1))[0]

    def rollback(self, length: int) -> None:
        pass  # no cache of its own


class LookupDrafter:
    round_forwards = 0  # a search on the host, no forward

    def __init__(self, vocab: int):
        self.vocab = vocab

    def propose(self, recent, seq, proposal: Proposal, generator, eos_ids, rule, eos_tensor) -> Block:
        config, device = proposal.config, recent.device
        tokens, votes = lookup.continuation(seq, config.drafting.ngram_min, config.drafting.ngram_max, proposal.limit)
        proposal.cap(len(tokens))
        scores = lookup.scores(votes, self.vocab, config.stopping.topk)[confidence.signal_of(config)]
        proposal.walk(config, tokens, scores.tolist(), eos_ids)
        kept = proposal.tokens
        block_tokens = torch.tensor(kept, dtype=torch.long, device=device)
        probs = None
        if not config.greedy:  # the drafter's token is certain: q is a point mass (lookup.py)
            probs = torch.nn.functional.one_hot(block_tokens, self.vocab).float()
        return Block(block_tokens, probs, scores.to(device), len(kept))

    def observe(self, target_lm: CachedLM, accepted: torch.Tensor) -> None:
        pass

    def rollback(self, length: int) -> None:
        pass  # it reads the sequence afresh every round


def empty_block(device: torch.device) -> Block:
    return Block(torch.zeros(0, dtype=torch.long, device=device), None, torch.zeros(0, device=device), 0)


def start_drafter(draft, target_lm: CachedLM, prompt_ids: list[int], config: DecodeConfig, capacity: int):
    """The drafter config.drafting.drafter names, ready to propose after the prompt (`draft`: the draft
    model, or the target's Heads; unused by lookup)."""
    if config.drafting.drafter == "model":
        if not isinstance(draft, torch.nn.Module) or isinstance(draft, Heads):
            raise DsparkError("the model drafter needs a draft model")
        return ModelDrafter(draft, prompt_ids, config, capacity, target_lm.clock)  # timed by the target's clock
    if config.drafting.drafter == "heads":
        if not isinstance(draft, Heads):
            raise DsparkError("the heads drafter needs the target's heads (dspark_bench.decoding.heads.load)")
        return HeadsDrafter(draft, target_lm)
    return LookupDrafter(target_lm.model.get_output_embeddings().weight.shape[0])


def draft_block(draft_lm: CachedLM, pending: torch.Tensor, config: DecodeConfig, proposal: Proposal, generator,
                eos_ids: frozenset[int], rule: DeviceRule | None, eos_tensor: torch.Tensor, seq: list[int]) -> Block:
    """The round's draft under config.verification.draft_mode.

    "early-stop": after each draft forward the host learns the token and its confidence (one
    sync) and applies the rule (`Proposal`) to decide whether to run the next forward.
    "verify-side": the draft runs to the round's limit with no sync at all, and the rule cuts
    the block on the device (`rule`, rules.DeviceRule); the target verifies the whole block but
    accepts only the kept prefix. Greedy: the same tokens and rounds; more draft and verify work,
    no waits. Sampling: as lossless, but the draft draws past the cut, so other samples. The
    learned signal reads the drafted tokens on the host, so there it costs one read per round.
    `pending`: what the draft has not seen of the sequence (1 or 2 tokens), on the device;
    `seq`: the sequence so far, on the host (the learned signal's context)."""
    tokens, probs, signals, scores = [], [], [], []
    for _ in range(proposal.limit):
        if config.verification.draft_mode == "early-stop" and proposal.done:
            break
        logits = draft_lm.forward(pending)[-1]
        q = distribution(logits, config)
        signals.append(confidence.draft_signals(config, q))
        token = pick(logits, q, config, generator)
        pending = token.view(1)
        if config.verification.draft_mode == "early-stop":
            read, token_id = fetch(signals[-1], token)  # the loop must know now whether to go on
            context = [seq + proposal.tokens] if config.stopping.metric == LEARNED else None
            score, = confidence.host_scores(config, [read], context, [token_id], [len(scores)])
            scores.append(score)
            if not proposal.consider(config, score):
                continue
            proposal.take(token_id, q, eos_ids)
        tokens.append(token)
        probs.append(q)
    device = draft_lm.device
    tokens = torch.stack(tokens) if tokens else torch.zeros(0, dtype=torch.long, device=device)
    probs = torch.stack(probs) if probs and not config.greedy else None
    if config.verification.draft_mode == "verify-side":
        scores = device_scores(config, signals, tokens, seq, device)
        return Block(tokens, probs, scores, rule.kept(scores, tokens, eos_tensor))
    kept = len(proposal.tokens)  # llama.cpp's discard may have emptied the draft
    # Early-stop's scores were read on the host, where the proposal keeps them (no copy back).
    return Block(tokens[:kept], probs[:kept] if probs is not None else None, torch.zeros(0, device=device), kept)


def device_scores(config: DecodeConfig, signals: list[torch.Tensor], tokens: torch.Tensor, seq: list[int],
                  device: torch.device) -> torch.Tensor:
    """A verify-side block's scores, on the device: read there, except the learned signal's,
    computed on the host from the block's tokens (one read) and copied back."""
    if not signals:
        return torch.zeros(0, device=device)
    if config.stopping.metric != LEARNED:
        return torch.stack(signals)[:, 0]
    read, drafted = fetch(torch.stack(signals), tokens)
    scores = confidence.host_scores(config, read, [seq + drafted[:k] for k in range(len(drafted))], drafted,
                                    list(range(len(drafted))))
    return torch.tensor(scores, dtype=torch.float64, device=device)

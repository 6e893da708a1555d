"""Batched decoding: B requests at once, speculative and autoregressive, with continuous batching.

Each row drafts under the policy on its own confidences and is verified on its own, through the
same `Proposal`, `verify` and `close_round` as the batch-1 decoder (speculative.py); only the forwards
are shared. So under greedy verification a row's rounds are exactly its rounds at batch 1, and
replay predicts them. A round's draft loop runs until the last row has stopped drafting, and
its verify pass is padded to the longest row's draft (the padded layout, batch_lm.py). The
batch-level rules, `batch_quorum` (every row's draft ends once too few rows are still drafting)
and the budget schedule (budget.py: after each draft step the rows that draft on are chosen for
the whole batch), make rounds depend on the batch, and the batched replay (replay/batched.py)
walks them.

Requests join the batch as rows leave it (`refill`, what serving engines measure) or wait for
the whole batch to drain. Every step's wall time is shared evenly among the rows that took
part, and each request's prefill is its own: a request's `time_s` is its share of the run, so
the shares add up to the run's wall time and the per-prompt bootstrap of speedup still works.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch

from dspark_bench import schedules
from dspark_bench.config import LEARNED, DecodeConfig
from dspark_bench.decoding import budget, confidence, controllers
from dspark_bench.decoding.batch_lm import BatchLM
from dspark_bench.decoding.host import fetch, synchronize
from dspark_bench.decoding.proposal import Proposal
from dspark_bench.decoding.rules import forced, round_start
from dspark_bench.decoding.sampling import distribution, draw, make_generator, pick
from dspark_bench.decoding.speculative import close_round, verify
from dspark_bench.decoding.static_batch_lm import StaticBatchLM, batch_lm
from dspark_bench.decoding.types import Block, DecodeResult


@dataclass
class Request:
    prompt: list[int]
    generator: torch.Generator | None
    index: int = 0  # its prompt's place in the run (the budget schedule breaks ties by it)
    seq: list[int] = field(default_factory=list)
    result: DecodeResult = field(default_factory=lambda: DecodeResult(tokens=[]))
    time_s: float = 0.0  # this request's share of the run's wall time
    arrival: float = 0.0  # clock when it arrived (all 0 when every prompt waits at the start) ...
    admitted: float = 0.0  # ... when it joined the batch ...
    first_token: float = 0.0  # ... when its first step (its first tokens) ended ...
    finished: float = 0.0  # ... and when it left

    def done(self, config: DecodeConfig, eos_ids: frozenset[int]) -> bool:
        tokens = self.result.tokens
        return len(tokens) >= config.verification.max_new_tokens or bool(tokens and tokens[-1] in eos_ids)

    @property
    def latency_per_token(self) -> float:
        """Time per output token of this request as its user saw it: residence / tokens."""
        return (self.finished - self.admitted) / max(len(self.result.tokens), 1)


def _clock(device: torch.device) -> float:
    synchronize(device)  # what the device still runs belongs to the step before the clock read
    return time.perf_counter()


def serving(prompts: list[list[int]], config: DecodeConfig, batch_size: int, lms: list[BatchLM],
            step: Callable[[list[Request]], None], eos_ids: frozenset[int], refill: bool = True,
            seeds: list[int] | None = None, arrivals: list[float] | None = None,
            trace: list | None = None) -> Iterator[None]:
    """Decode every prompt, at most `batch_size` at once; `step` advances every active row.

    A generator: it pauses after each step and each admission, so two of them (baseline and
    speculative) can take turns step by step (`interleave`) and share a noisy machine's drift at a
    fine grain. Its return value (StopIteration's) is the requests. Clocks count this decoder's own time only:
    each request's `time_s` is its share of the steps it was in plus its prefill, and its
    `admitted` / `finished` marks are read on that own-time clock.

    Each request samples from its own generator, seeded as a batch-1 decode of its prompt is
    (the config's seed) unless `seeds` gives one per prompt.

    `arrivals` (seconds on that clock, non-decreasing, one per prompt; None: all waiting at 0) makes
    it a server under load: a request joins at a step boundary once it has arrived, and an empty
    server jumps its clock to the next arrival (it does nothing meanwhile, so nothing is slept:
    baseline and speculative can still take turns). replay/under_load.py replays the same server.

    `trace` receives what each admission and step cost on that clock, as replay prices them:
    ("join", rows in the batch, the prompt's tokens but its last, the widest row's context depth,
    seconds) and ("step", rows, the
    most draft forwards of a row, the longest draft, the widest row's context depth as the step
    began, seconds); plain decoding's steps draft none."""
    device = lms[0].device
    arrive = list(arrivals) if arrivals is not None else [0.0] * len(prompts)
    seeds = seeds if seeds is not None else [config.verification.seed] * len(prompts)
    requests = [Request(list(p), make_generator(config, device, seed), index, seq=list(p), arrival=at)
                for index, (p, seed, at) in enumerate(zip(prompts, seeds, arrive))]
    server = Server(requests, deque(range(len(prompts))), lms, device, trace)
    while server.waiting or server.active:
        if not server.active and arrive[server.waiting[0]] > server.own:
            server.own = arrive[server.waiting[0]]  # idle until the next request arrives
        if server.waiting and len(server.active) < batch_size and (refill or not server.active):
            yield from server.admit(batch_size)
        server.step(step, config, eos_ids)
        yield
    return requests


@dataclass
class Server:
    """A serving decode between its steps: the requests, those waiting (in arrival order) and those
    in the batch (`active`: request index of each batch row, in row order), and the decoder's
    own-time clock (`own`: seconds it has run so far, idle jumps included)."""

    requests: list[Request]
    waiting: deque
    lms: list
    device: torch.device
    trace: list | None
    active: list[int] = field(default_factory=list)
    own: float = 0.0

    def admit(self, batch_size: int) -> Iterator[None]:
        """Prefill every arrived request the batch has room for, each on its own clock, pausing after
        each: a side by side decoder's own join of the same prompt comes next, so a prefill shares the
        machine's drift with its pair's (a long prompt's is as long as many steps: on long-code at
        B = 8 half a run's time, which a batch's joins in one stretch left to drift apart)."""
        while self.waiting and len(self.active) < batch_size and self.requests[self.waiting[0]].arrival <= self.own:
            request = self.requests[self.waiting.popleft()]
            request.admitted = self.own
            widest = self.widest()  # the columns it is spliced into
            start = _clock(self.device)
            for lm in self.lms:
                lm.add(request.prompt[:-1])
            elapsed = _clock(self.device) - start
            request.time_s += elapsed
            self.own += elapsed
            if self.trace is not None:
                self.trace.append(("join", len(self.active), len(request.prompt) - 1, widest, elapsed))
            self.active.append(request.index)
            yield

    def widest(self) -> int:
        """The widest context among the batch's rows (0: none): the cache's columns, give or take holes."""
        return max((len(self.requests[i].seq) for i in self.active), default=0)

    def step(self, step: Callable[[list[Request]], None], config: DecodeConfig, eos_ids: frozenset[int]) -> None:
        """One step of every row, the finished rows removed, and its time shared by the rows."""
        requests, start = self.requests, _clock(self.device)
        stepped = list(self.active)
        starting = [i for i in stepped if not requests[i].result.tokens]
        widest = self.widest()  # the depth replay prices the step at
        step([requests[i] for i in stepped])
        done = {i for i in stepped if requests[i].done(config, eos_ids)}
        for row in reversed(range(len(self.active))):
            if self.active[row] in done:
                for lm in self.lms:
                    lm.remove(row)
                del self.active[row]
        for lm in self.lms:  # what the rows that left (and rolled-back drafts) no longer need
            lm.tidy()
        elapsed = _clock(self.device) - start  # the step with its cache upkeep, shared by its rows
        self.own += elapsed
        if self.trace is not None:
            rounds = [requests[i].result.rounds[-1] for i in stepped if requests[i].result.rounds]
            self.trace.append(("step", len(stepped), max((r.draft_forwards for r in rounds), default=0),
                               max((r.drafted for r in rounds), default=0), widest, elapsed))
        for i in starting:
            requests[i].first_token = self.own
        for i in stepped:
            requests[i].time_s += elapsed / len(stepped)
            if i in done:
                requests[i].finished = self.own


def serve(*args, **kwargs) -> list[Request]:
    """`serving` run to the end on its own: the requests."""
    return interleave(serving(*args, **kwargs))[0]


def interleave(*decoders: Iterator[None], beside: Callable[[], None] | None = None) -> list[list[Request]]:
    """Run decoders (`serving` generators) a step each in turn until all are done; each one's requests.
    `beside`: called once per turn of them all (work timed beside theirs, sharing their drift)."""
    results: list = [None] * len(decoders)
    running = list(range(len(decoders)))
    while running:
        if beside is not None:
            beside()
        for index in list(running):
            try:
                next(decoders[index])
            except StopIteration as done:
                results[index] = done.value
                running.remove(index)
    return results


class SpeculativeStep:
    """One speculative round for every row of the batch."""

    def __init__(self, target: BatchLM | StaticBatchLM, draft: BatchLM | StaticBatchLM, config: DecodeConfig,
                 eos_ids: frozenset[int]):
        self.target, self.draft, self.config, self.eos_ids = target, draft, config, eos_ids
        self.budget = budget.rule_for(config) if schedules.of(config).whole_batch else None
        self.controller = controllers.start(config)  # an engine's controller: one for the server's whole run

    def __call__(self, requests: list[Request]) -> None:
        config = self.config
        # Each row's round runs the policy of its own depth (the depth schedule: its bucket's), or the
        # length an engine's controller picks for the whole step (round_start).
        proposals = [Proposal.start(*round_start(config, len(r.seq), self.controller, config.verification.max_new_tokens
                                                 - len(r.result.tokens) - 1, len(requests)), batched=True)
                     for r in requests]
        self.draft_loop(requests, proposals)
        if self.controller is not None:  # vLLM's adaptive verification may verify fewer than were drafted
            admitted = self.controller.admit([r.index for r in requests], [p.confidences[: len(p.tokens)]
                                                                            for p in proposals])
            for proposal, n in zip(proposals, admitted):
                proposal.trim(n)
        feeds = [r.seq[self.target.lengths[i] :] + p.tokens for i, (r, p) in enumerate(zip(requests, proposals))]
        # Each row's block, copied from the host before the target pass is queued (on CUDA a copy
        # waits for the work queued before it).
        blocks = [Block(torch.tensor(p.tokens, dtype=torch.long, device=self.target.device),
                        torch.stack(p.probs) if p.probs and not config.greedy else None,
                        torch.zeros(0, device=self.target.device), len(p.tokens)) for p in proposals]
        logits = self.target.forward(feeds)
        verdicts = []
        for i, (request, block, feed) in enumerate(zip(requests, blocks, feeds)):
            first = len(feed) - len(block.tokens) - 1
            verdicts.append(verify(logits[i, first : len(feed)], block, config, request.generator))
        accepted, target_tokens = fetch(*(torch.stack(column) for column in zip(*verdicts)))  # one read per round
        if self.controller is not None:
            self.controller.observe(list(accepted), [len(p.tokens) for p in proposals])
        for request, proposal, a, token in zip(requests, proposals, accepted, target_tokens):
            emitted, round_ = close_round(proposal, a, token, self.eos_ids)
            request.seq += emitted
            request.result.add_round(emitted, round_)
        # As in the batch-1 decoder: the last emitted token is fed at each model's next forward.
        committed = [len(r.seq) - 1 for r in requests]
        for lm in (self.target, self.draft):
            lm.rollback(committed)  # `serving` tidies the caches after every step

    def draft_loop(self, requests: list[Request], proposals: list[Proposal]) -> None:
        """Draft forwards for the whole batch until every row has stopped: one read per step."""
        config = self.config
        feeds = [[] if p.done else r.seq[self.draft.lengths[i] :] for i, (r, p) in enumerate(zip(requests, proposals))]
        steps = 0
        steps_with = np.zeros(len(requests) + 1, dtype=np.int64)  # the budget schedule's: draft steps by rows drafting
        while any(not p.done for p in proposals):
            steps += 1
            steps_with[sum(not p.done for p in proposals)] += 1
            ends = torch.tensor([max(len(f) - 1, 0) for f in feeds], device=self.draft.device)  # before the pass
            logits = self.draft.forward(feeds)
            last = logits[torch.arange(len(feeds), device=logits.device), ends]
            probs = distribution(last, config)
            drafting = {i for i, p in enumerate(proposals) if not p.done}
            # A token for every row still drafting, as the batch-1 decoder draws one per step.
            tokens = pick(last, probs, config, None) if config.greedy else torch.stack(
                [draw(probs[i], requests[i].generator) if i in drafting else last.new_zeros((), dtype=torch.long)
                 for i in range(len(requests))])
            read, tokens = fetch(confidence.draft_signals(config, probs), tokens)
            # Each row's step in its own draft: every token a drafting row considered, it took.
            contexts = ([r.seq + p.tokens for r, p in zip(requests, proposals)]
                        if config.stopping.metric == LEARNED else None)
            scores = confidence.host_scores(config, read, contexts, tokens, [len(p.tokens) for p in proposals])
            for i in range(len(requests)):
                feeds[i] = []
                if i not in drafting or not proposals[i].consider(proposals[i].config, scores[i]):
                    continue
                proposals[i].take(tokens[i], probs[i], self.eos_ids)
                if not proposals[i].done:  # a finished draft's last token is fed next round
                    feeds[i] = [tokens[i]]
            self.apply_quorum(proposals, feeds, steps)
            self.apply_budget(requests, proposals, feeds, steps_with, steps)

    def apply_budget(self, requests, proposals: list[Proposal], feeds: list[list[int]], steps_with, steps: int) -> None:
        """The budget schedule: after each draft step, the rows the batch's rule lets draft on (budget.py)."""
        if self.budget is None:
            return
        candidate = [not p.done for p in proposals]
        go = self.budget.decide(proposals, [r.index for r in requests], candidate, steps_with, steps)
        for i, proposal in enumerate(proposals):
            if candidate[i] and not go[i]:
                proposal.stop_reason = "threshold"  # the rule ended it, as goodput's does
                proposal.end()
                feeds[i] = []  # its last token is fed next round

    def apply_quorum(self, proposals: list[Proposal], feeds: list[list[int]], steps: int) -> None:
        """config.stopping.batch_quorum: stop every row once too few are still drafting (replay/batched.py
        replays the same rule)."""
        drafting = [i for i, p in enumerate(proposals) if not p.done]
        quorum = self.config.stopping.batch_quorum * len(proposals)
        if drafting and steps >= forced(self.config) and len(drafting) < quorum:
            for i in drafting:
                proposals[i].stop_reason = "quorum"
                proposals[i].end()
                feeds[i] = []  # its last token is fed next round, as after gamma_max


class AutoregressiveStep:
    """One plain decoding step for every row: the batched baseline."""

    def __init__(self, target: BatchLM | StaticBatchLM, config: DecodeConfig, eos_ids: frozenset[int]):
        self.target, self.config, self.eos_ids = target, config, eos_ids

    def __call__(self, requests: list[Request]) -> None:
        logits = self.target.forward([r.seq[self.target.lengths[i] :] for i, r in enumerate(requests)])[:, -1]
        if self.config.greedy:  # `choose`, for the whole batch at once
            tokens = fetch(logits.argmax(dim=-1))
        else:
            probs = distribution(logits, self.config)
            tokens = fetch(torch.stack([draw(probs[i], r.generator) for i, r in enumerate(requests)]))
        for request, token in zip(requests, tokens):
            request.seq.append(token)
            request.result.tokens.append(token)
            request.result.target_forwards += 1


def speculative_serving(target, draft, prompts: list[list[int]], config: DecodeConfig, batch_size: int,
                        eos_ids: frozenset[int] = frozenset(), refill: bool = True,
                        seeds: list[int] | None = None, arrivals: list[float] | None = None,
                        trace: list | None = None) -> Iterator[None]:
    target_lm = batch_lm(target, config, prompts, batch_size)
    draft_lm = batch_lm(draft, config, prompts, batch_size, role="draft")
    return serving(prompts, config, batch_size, [target_lm, draft_lm],
                   SpeculativeStep(target_lm, draft_lm, config, eos_ids), eos_ids, refill, seeds, arrivals, trace)


def autoregressive_serving(target, prompts: list[list[int]], config: DecodeConfig, batch_size: int,
                           eos_ids: frozenset[int] = frozenset(), refill: bool = True,
                           seeds: list[int] | None = None, arrivals: list[float] | None = None,
                           trace: list | None = None) -> Iterator[None]:
    target_lm = batch_lm(target, config, prompts, batch_size)
    return serving(prompts, config, batch_size, [target_lm], AutoregressiveStep(target_lm, config, eos_ids), eos_ids,
                   refill, seeds, arrivals, trace)


@torch.inference_mode()
def batched_speculative(*args, **kwargs) -> list[Request]:
    """Every prompt decoded speculatively, `batch_size` at a time (see `speculative_serving`)."""
    return interleave(speculative_serving(*args, **kwargs))[0]


@torch.inference_mode()
def batched_autoregressive(*args, **kwargs) -> list[Request]:
    """Every prompt decoded by the target alone, `batch_size` at a time: the batched baseline."""
    return interleave(autoregressive_serving(*args, **kwargs))[0]

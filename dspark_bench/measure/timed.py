"""Timed replay: the rounds replay says a policy makes, run for real, so that their measured time
checks the cost model alone (issue 53; vLLM's `synthetic_acceptance_length` and SGLang's
`SIMULATE_ACC_LEN` force acceptance for the same purpose).

Each round's draft forwards, kept draft length and accepted count come from the record
(`simulate`); every draft step and the verify pass really run on the models given, fed as the
batch-1 decoder feeds them (speculative.py: the draft catches up on what it has not seen, then
one token a step; the target verifies what it has not seen plus the kept draft), and the round
commits the record's own tokens. On the pair that made the record, each round's tokens and
acceptance as the passes compute them equal the forced ones (tests/test_timed_replay.py); on
any other pair of the same vocabulary (a GPU-sized random pair, say) the rounds run with the
record's acceptance, and only their time is read. It checks the cost model, the passes replay charges
for: tokens go to the device from host lists and no confidence is computed, so it is not the
decoder's own wall time (that is `run`'s).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dspark_bench import schedules
from dspark_bench.config import LEARNED, DecodeConfig
from dspark_bench.decoding.cached_lm import CachedLM
from dspark_bench.decoding.host import synchronize
from dspark_bench.errors import DsparkError
from dspark_bench.replay.record import Record
from dspark_bench.replay.simulate import simulate


@dataclass
class TimedPrompt:
    """One prompt's forced rounds: what ran and what the passes themselves said."""

    seconds: float  # the rounds' wall time (prefill excluded)
    tokens: list[int]  # what the rounds committed: the record's own continuation
    drafted: list[list[int]]  # each round's kept draft, as the draft model drew it
    accepted: list[int]  # each round's accepted count, as the verify pass computed it (greedy)
    forced: list[int]  # ... and as the record forced it


@torch.inference_mode()
def timed_replay(pair, rec: Record, prompt_ids: list[list[int]], config: DecodeConfig) -> list[TimedPrompt]:
    """Every prompt's rounds under `config` as replay makes them, run on `pair` (target and draft
    models): one TimedPrompt per prompt."""
    rounds = forced_rounds(rec, prompt_ids, config)
    return [run_prompt(pair, ids, rec.continuation[p, : int(rec.lengths[p])].tolist(), rounds[p], config)
            for p, ids in enumerate(prompt_ids)]


def forced_rounds(rec: Record, prompt_ids: list[list[int]], config: DecodeConfig) -> list:
    """Each prompt's rounds under `config` as replay makes them (`simulate`), for `run_prompt` to run:
    refused where timed replay would time what it does not run."""
    if not config.greedy or config.drafting.drafter != "model":
        raise DsparkError("timed replay forces a greedy record's rounds onto the draft model's passes")
    # What it does not run, it must not time as if it did: verify-side drafting (a draft to the
    # limit), the learned signal's host work, a batch. Compiled passes (captured on CUDA) run as the
    # decoder runs them; the caller runs each config once untimed first, so each shape is met.
    unlike = [what for what, differs in (
        ("the verify-side draft mode", config.verification.draft_mode == "verify-side"),
        ("the learned signal", LEARNED in schedules.round_metrics(config)),
        ("a batch size above 1", config.batching.batch_size > 1)) if differs]
    if unlike:
        raise DsparkError(f"timed replay runs the batch-1 early-stop decoder's passes, not {unlike[0]}")
    if len(prompt_ids) != len(rec.lengths):
        raise DsparkError(f"timed replay needs the record's {len(rec.lengths)} prompts (got {len(prompt_ids)})")
    return simulate(rec, config)


@torch.inference_mode()  # called alone too (a check interleaving prompts): autograd's bookkeeping slowed it 15 %
def run_prompt(pair, ids: list[int], continuation: list[int], rounds, config: DecodeConfig) -> TimedPrompt:
    capacity = len(ids) + config.verification.max_new_tokens + config.stopping.gamma_max + 2
    target = CachedLM(pair.target, config.verification.compiled, capacity)
    draft = CachedLM(pair.draft, config.verification.compiled, capacity, role="draft")
    target.prefill(ids[:-1])
    draft.prefill(ids[:-1])
    seq, out = list(ids), TimedPrompt(0.0, [], [], [], [])
    synchronize(target.device)
    start = time.perf_counter()
    for round_ in rounds:
        feed, proposed = seq[draft.length :], []
        for _ in range(round_.draft_forwards):  # the draft's steps, each on its own last token
            token = int(draft.forward(feed)[-1].argmax())
            proposed.append(token)
            feed = [token]
        kept = proposed[: round_.drafted]
        logits = target.forward(seq[target.length :] + kept, keep=len(kept) + 1)
        choices = logits.argmax(dim=-1).tolist()
        agreed = next((i for i, (d, t) in enumerate(zip(kept, choices)) if d != t), len(kept))
        emitted = continuation[len(seq) - len(ids) :][: round_.emitted]  # the record's tokens, as forced
        seq += emitted
        out.tokens += emitted
        out.drafted.append(kept)
        out.accepted.append(agreed)
        out.forced.append(round_.accepted)
        target.rollback(len(seq) - 1)  # the last emitted token is fed at each model's next forward
        draft.rollback(len(seq) - 1)
    synchronize(target.device)
    out.seconds = time.perf_counter() - start
    return out


@torch.inference_mode()
def timed_plain(pair, rec: Record, prompt_ids: list[list[int]], compiled: bool = False) -> list[tuple[float, bool]]:
    """Plain decoding of the record's own tokens, one target pass a token as the autoregressive
    baseline runs them, what a timed replay is held against: per prompt (seconds, prefill excluded;
    whether every pass chose the record's token, as it does on the pair that made the record).
    `compiled`: the baseline's compiled passes (what it runs on CUDA by default)."""
    return [plain_prompt(pair, ids, rec.continuation[p, : int(rec.lengths[p])].tolist(), compiled)
            for p, ids in enumerate(prompt_ids)]


@torch.inference_mode()
def plain_prompt(pair, ids: list[int], tokens: list[int], compiled: bool = False) -> tuple[float, bool]:
    """One prompt of `timed_plain`: (seconds, whether every pass chose `tokens`)."""
    target = CachedLM(pair.target, compiled, capacity=len(ids) + len(tokens) + 1)
    target.prefill(ids[:-1])
    seq, chosen = list(ids), []
    synchronize(target.device)
    start = time.perf_counter()
    for token in tokens:
        chosen.append(int(target.forward(seq[target.length :])[-1].argmax()))  # the baseline reads its token
        seq.append(token)
    synchronize(target.device)
    return time.perf_counter() - start, chosen == tokens

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

import torch

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.decoding import controllers
from dspark_bench.decoding.cached_lm import CachedLM, unseen
from dspark_bench.decoding.drafters import start_drafter
from dspark_bench.decoding.host import fetch
from dspark_bench.decoding.proposal import Proposal
from dspark_bench.decoding.rules import DeviceRule, round_policies, round_start
from dspark_bench.decoding.sampling import distribution, draw, make_generator
from dspark_bench.decoding.types import Block, DecodeResult, PassClock, Round
from dspark_bench.errors import DsparkError


@torch.inference_mode()
def speculative_decode(
    target: torch.nn.Module,
    draft,
    prompt_ids: list[int],
    config: DecodeConfig,
    eos_ids: frozenset[int] = frozenset(),
    clock: PassClock | None = None,
    controller=None,
) -> DecodeResult:
    """`draft`: what config.drafting.drafter drafts with — the draft model, the target's heads, or
    nothing (lookup); drafters.py. `clock`: times every pass and round (in-decode costs:
    measure/pass_clock.py), None for none. `controller`: an engine controller's state to run on from
    (controllers.py; a run hands each decode the one its last decode left), else a fresh one."""
    capacity = len(prompt_ids) + config.verification.max_new_tokens + config.stopping.gamma_max + 1
    target_lm = CachedLM(target, config.verification.compiled, capacity, hidden=config.drafting.drafter == "heads",
                         clock=clock)
    target_lm.prefill(prompt_ids[:-1])
    drafter = start_drafter(draft, target_lm, prompt_ids, config, capacity)
    generator = make_generator(config, target_lm.device)
    # What the device needs from the host is copied once, here: on CUDA a copy from the host
    # waits for the work queued before it, like a read. After this, tokens stay on the device.
    rules = device_rules(config, target_lm.device)
    eos_tensor = torch.tensor(sorted(eos_ids), dtype=torch.long, device=target_lm.device)
    keep_recent = recent_tokens(config)
    recent = torch.tensor(prompt_ids[-keep_recent:], dtype=torch.long, device=target_lm.device)  # seq's tail
    controller = controllers.start(config) if controller is None else controller
    seq, result = list(prompt_ids), DecodeResult(tokens=[], controller=controller)  # it leaves the state here
    request = object()  # this decode, as a controller tells requests apart
    while len(result.tokens) < config.verification.max_new_tokens:
        if clock is not None:
            clock.round_starts()
        # The round's policy: its depth bucket's under the depth schedule, a controller's length under one.
        # Leave room for the target's own token at the end of the round.
        policy, budget = round_start(config, len(seq), controller,
                                     config.verification.max_new_tokens - len(result.tokens) - 1)
        proposal = Proposal.start(policy, budget)
        block = drafter.propose(recent, seq, proposal, generator, eos_ids, rules.get(policy), eos_tensor)
        if controller is not None:  # vLLM's adaptive verification may verify fewer than were drafted
            block = trimmed(block, proposal, controller, request)
        logits = target_lm.forward(torch.cat([unseen(recent, seq, target_lm), block.tokens]),
                                   keep=len(block.tokens) + 1)
        accepted_on_device, token_on_device = verify(logits, block, config, generator)
        drafter.observe(target_lm, accepted_on_device)
        accepted, target_token = read_round(proposal, block, accepted_on_device, token_on_device, policy, eos_ids)
        if controller is not None:
            controller.observe([accepted], [len(proposal.tokens)])
        if drafter.round_forwards is not None:  # heads: one pass a round; lookup: none
            proposal.forwards = drafter.round_forwards
        emitted, round_ = close_round(proposal, accepted, target_token, eos_ids)
        seq += emitted
        recent = torch.cat([recent, block.tokens[:accepted], token_on_device.view(1)])[-keep_recent:]
        result.add_round(emitted, round_)
        # The last emitted token is fed at the next forward of both models.
        target_lm.rollback(len(seq) - 1)
        drafter.rollback(len(seq) - 1)
        if emitted[-1] in eos_ids:
            break
    if clock is not None:
        clock.decode_ends()
    return result


def device_rules(config: DecodeConfig, device: torch.device) -> dict:
    """In verify-side mode the device's rule for each policy a round may run (rules.DeviceRule); else none."""
    if config.verification.draft_mode != "verify-side":
        return {}
    if device.type == "mps":
        raise DsparkError("the verify-side draft mode decides in float64, which MPS lacks: use early-stop there")
    return {policy: DeviceRule(policy, device) for policy in round_policies(config)}


def trimmed(block: Block, proposal: Proposal, controller, request) -> Block:
    """The round's block cut to the tokens `controller` admits of `request`'s draft (early-stop: the
    host holds every confidence)."""
    admitted = controller.admit([request], [proposal.confidences[: len(proposal.tokens)]])[0]
    if admitted >= len(proposal.tokens):
        return block
    proposal.trim(admitted)
    return Block(block.tokens[:admitted], None if block.probs is None else block.probs[:admitted], block.scores,
                 admitted)


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
    drafted nothing (the budget's last round; under llama.cpp's rule at most min_draft_len; under a
    controller that may pick 0, any number of rounds: the whole answer)."""
    controlled = schedules.of(config).controlled
    return config.stopping.gamma_max + 4 + (config.verification.max_new_tokens if controlled else 0)


def read_round(proposal: Proposal, block: Block, accepted: torch.Tensor, target_token: torch.Tensor,
               config: DecodeConfig, eos_ids: frozenset[int]) -> tuple[int, int]:
    """The round's one host sync: the accepted count and the target's token; in verify-side mode
    the draft too, which the host's own rule (`Proposal`) then walks for the round's record."""
    if config.verification.draft_mode == "early-stop":
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

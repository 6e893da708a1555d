"""What fixes a replayed round at each position of a record, for one policy: how far the rollout
matches (`match_lengths`), where it proposes EOS (`eos_positions`), the signal the schedule
compares and its thresholds (`policy_signal`, `position_thresholds`), where it stops
(`first_failures`) and so each round's length, draft forwards and stop reason (`round_plan`; under an
engine's controller, one plan per length it may pick: `round_plans`);
and the checks that a record can replay a policy at all (`check_replayable`, `check_sampling`).
replay/simulate.py walks rounds from these, one policy at a time or a whole grid at once.
"""

from __future__ import annotations

import numpy as np

from dspark_bench import schedules
from dspark_bench.config import LEARNED, DecodeConfig
from dspark_bench.decoding import controllers
from dspark_bench.decoding.budget import row_rule
from dspark_bench.decoding.confidence import signal_of
from dspark_bench.decoding.controllers import round_policy
from dspark_bench.decoding.goodput import decisions
from dspark_bench.decoding.rules import (
    bucket_policies,
    discards_below,
    forced,
    keeps_failing,
    round_policies,
    threshold_at,
)
from dspark_bench.depth import depth_bucket
from dspark_bench.errors import DsparkError
from dspark_bench.metrics import STOP_REASONS
from dspark_bench.replay.record import Record
from dspark_bench.replay.tables import record_depths

NEVER = 1 << 14  # "no such position" in int arrays (beyond any gamma)


def match_lengths(rec: Record) -> np.ndarray:
    """M[p, j]: how many rollout tokens from j agree with the continuation, consecutively (a
    sampled replicate's: how many its coins accept)."""
    if rec.matches is not None:
        return rec.matches
    P, N, G = rec.rollout.shape
    ahead = np.full((P, N, G), -2, dtype=np.int64)
    for k in range(G):  # rollout step k from j proposes the continuation's token j + k
        ahead[:, : max(N - k, 0), k] = rec.continuation[:, k:]
    agree = rec.rollout == ahead
    return np.where(agree.all(axis=2), G, np.argmin(agree, axis=2))


def eos_positions(rec: Record) -> np.ndarray:
    """E[p, j]: the 1-based rollout step that proposes EOS, NEVER if none."""
    is_eos = np.isin(rec.rollout, rec.eos_ids) if rec.eos_ids else np.zeros(rec.rollout.shape, bool)
    return np.where(is_eos.any(axis=2), np.argmax(is_eos, axis=2) + 1, NEVER)


def check_replayable(rec: Record, config: DecodeConfig) -> None:
    drafter = rec.drafter
    if config.drafting.drafter != drafter["drafter"]:
        raise DsparkError(f"the record holds the {drafter['drafter']} drafter's proposals, not the "
                          f"{config.drafting.drafter} drafter's; record it")
    if config.drafting.drafter == "lookup" and ((config.drafting.ngram_min, config.drafting.ngram_max)
                                                != (drafter["ngram_min"], drafter["ngram_max"])):
        raise DsparkError(f"the record's lookup matched n-grams of {drafter['ngram_min']}-{drafter['ngram_max']} "
                          f"tokens, not {config.drafting.ngram_min}-{config.drafting.ngram_max}; record it")
    check_sampling(rec.info.get("sampling"), config)
    if config.verification.max_new_tokens != rec.max_new_tokens:
        raise DsparkError(f"max_new_tokens {config.verification.max_new_tokens} differs from the record's "
                          f"{rec.max_new_tokens}")
    if config.stopping.gamma_max > rec.gamma_record:
        raise DsparkError(f"gamma_max {config.stopping.gamma_max} exceeds the record's {rec.gamma_record}; "
                          "record deeper")
    if config.stopping.metric == LEARNED and LEARNED not in rec.confidences:
        raise DsparkError("the record holds no learned signal: replay.learned.with_learned adds the fitted one "
                          "(a replay sweep does)")
    if signal_of(config) not in rec.confidences:
        raise DsparkError(f"the record predates {signal_of(config)} (llama.cpp's own top1, which its rule reads): "
                          "run the sweep again, which records it")
    if config.stopping.metric == "topk_mass" and config.stopping.topk != rec.info["topk"]:
        raise DsparkError(f"the record has topk_mass for k={rec.info['topk']}, not k={config.stopping.topk}")
    for policy in dict.fromkeys(bucket_policies(config)) if schedules.of(config).by_depth else ():
        check_replayable(rec, policy)  # a depth policy's entries read what their own families read


def check_sampling(sampling: dict | None, config: DecodeConfig) -> None:
    """A greedy record replays greedy policies; a sampled one (replay/sampled.py) those at its own
    temperature and top-p."""
    if sampling is None and not config.greedy:
        raise DsparkError(f"a greedy record cannot replay temperature {config.verification.temperature:g}: record at "
                          "that temperature (a sweep at --temperature T records sampled paths)")
    if sampling is None:
        return
    asked = (config.verification.temperature, config.verification.top_p)
    if (sampling["temperature"], sampling["top_p"]) != asked:
        raise DsparkError(f"the record was sampled at temperature {sampling['temperature']:g}, top-p "
                          f"{sampling['top_p']:g}, not {asked[0]:g}, {asked[1]:g}: record again at those")
    if config.stopping.metric == LEARNED:
        raise DsparkError("the learned signal reads the drafted token, which sampled replay does not hold: replay it "
                          "greedy, or time it (--evaluation real)")


def policy_signal(rec: Record, config: DecodeConfig) -> np.ndarray:
    """[P, N, G] float64: what the schedule compares with `position_thresholds` at every rollout step.
    float64: the decoder multiplies Python floats of the float32 values the record stores."""
    if schedules.of(config).cost_aware:  # 1 where the draft goes on after step k (goodput.py; budget alone)
        return decisions(rec.confidences[signal_of(config)], row_rule(config))
    values = rec.confidences[signal_of(config)].astype(np.float64)
    return np.cumprod(values, axis=2) if schedules.of(config).cumulative else values


def position_thresholds(config: DecodeConfig, G: int) -> list[float]:
    # goodput's signal is its decision (0 or 1): 0.5 separates them.
    return [0.5 if schedules.of(config).cost_aware else threshold_at(config, k) for k in range(1, G + 1)]


def first_failures(rec: Record, config: DecodeConfig) -> np.ndarray:
    """T[p, j]: the 1-based step the schedule stops at (its token dropped, or kept under
    keeps_failing), NEVER if none."""
    kept = policy_signal(rec, config) >= np.array(position_thresholds(config, rec.gamma_record))
    kept[:, :, : forced(config)] = True
    return np.where(kept.all(axis=2), NEVER, np.argmin(kept, axis=2) + 1)


def round_plan(rec: Record, config: DecodeConfig):
    """Per (p, j): drafted L, proposals the rule considered s (the draft model's forwards) and
    stop reason code, vectorised over positions (proposal.Proposal's rule: dropped or kept failing
    token, EOS, limit, what the drafter had (`Proposal.cap`), llama.cpp's discard). A depth
    policy's round at (p, j) is its depth bucket's policy's round there (at_depth: the
    depth is the prompt's tokens + j)."""
    if schedules.of(config).by_depth:
        if "prompt_tokens" not in rec.info:
            raise DsparkError("the record predates its prompts' lengths, which a depth policy reads: record it again")
        plans = {policy: round_plan(rec, policy) for policy in round_policies(config)}
        chosen = [plans[policy] for policy in bucket_policies(config)]  # one per depth bucket
        bucket = depth_bucket(record_depths(rec))
        return tuple(np.choose(bucket, [plan[part] for plan in chosen]) for part in range(4))
    P, N, _ = rec.rollout.shape
    budget = config.verification.max_new_tokens - np.arange(N) - 1
    limit = np.minimum(config.stopping.gamma_max, budget)
    limit = np.where(limit < discards_below(config), 0, limit)[None, :].repeat(P, axis=0)
    exhausted = rec.available < limit
    limit = np.where(exhausted, np.where(rec.available >= discards_below(config), rec.available, 0), limit)
    fail, eos = first_failures(rec, config), eos_positions(rec)
    if keeps_failing(config):  # the failing token stays; the limit or EOS at that step wins
        by_threshold = (fail < limit) & (fail < eos)
        by_eos = ~by_threshold & (eos <= limit)
        drafted = np.where(by_threshold, fail, np.where(by_eos, eos, limit))
        forwards = drafted
    else:
        by_threshold = fail <= np.minimum(eos, limit)
        by_eos = ~by_threshold & (eos <= limit)
        drafted = np.where(by_threshold, fail - 1, np.where(by_eos, eos, limit))
        forwards = np.where(by_threshold, fail, drafted)
    reason = np.where(by_threshold, 0, np.where(by_eos, 2, np.where(
        exhausted, 5, np.where(limit == config.stopping.gamma_max, 1, 3))))
    drafted = np.where(drafted < discards_below(config), 0, drafted)
    return drafted, forwards, reason, limit


def round_plans(rec: Record, config: DecodeConfig, made: dict | None = None) -> dict:
    """`round_plan` of every round the policy may run: {None: its plan}; under an engine's controller
    {steps: the plan of a fixed draft of that many steps} for each of its candidates (0: nothing
    drafted, as the decoder's round with no room: reason "budget"). `made`: plans already made on
    `rec`, by round policy (many controllers share their lengths' plans), kept up to date."""
    if not schedules.of(config).controlled:
        return {None: round_plan(rec, config)}
    made = {} if made is None else made
    plans = {}
    for steps in controllers.lengths(config):
        policy = round_policy(config, steps) if steps else None
        if policy not in made:
            nothing = np.zeros(rec.rollout.shape[:2], dtype=np.int64)
            made[policy] = (round_plan(rec, policy) if steps else
                            (nothing, nothing, np.full_like(nothing, STOP_REASONS.index("budget")), nothing))
        plans[steps] = made[policy]
    return plans


def round_forwards(config: DecodeConfig) -> int:
    """Draft forwards a round that may draft costs when not one per considered proposal (-1):
    the heads' one pass, or none for lookup (drafters.py)."""
    return {"model": -1, "heads": 1, "lookup": 0}[config.drafting.drafter]

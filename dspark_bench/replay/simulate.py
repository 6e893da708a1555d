"""Replay: the outcome of every greedy policy from one recorded decoding pass.

Under greedy verification the output is the target's greedy continuation whatever the policy,
and a round starting after j generated tokens drafts the draft's own greedy rollout from that
point. So one record — the continuation, and at every position j the draft's rollout of
`gamma_record` tokens with every confidence metric — fixes every policy's rounds:

    a round at j drafts L(j) tokens (the schedule applied to the recorded confidences),
    the target accepts a(j) = min(L(j), M(j)) where M(j) is how far the rollout matches the
    continuation, and the next round starts at j + a(j) + 1.

`simulate` walks that round by round and yields the decoder's own per-round rows;
`simulate_grid` does the same walk for thousands of policies at once: array operations find
each policy's first stopping position, and a loop compiled by numba walks only round starts.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import pandas as pd

from dspark_bench import schedules
from dspark_bench.config import LEARNED, METRICS, SEMANTICS, DecodeConfig
from dspark_bench.decoding import controllers
from dspark_bench.decoding.confidence import signal_of
from dspark_bench.decoding.rules import bucket_policies, discards_below, forced, keeps_failing
from dspark_bench.decoding.types import Round
from dspark_bench.depth import DEPTH_LABELS, depth_bucket
from dspark_bench.errors import DsparkError
from dspark_bench.metrics import STOP_REASONS

# The cost model and the record live in their own modules; replay's users find them here too.
from dspark_bench.replay.cost import CostModel  # noqa: F401
from dspark_bench.replay.record import Record  # noqa: F401
from dspark_bench.replay.rounds import (
    check_replayable,
    eos_positions,
    match_lengths,
    policy_signal,
    position_thresholds,
    round_forwards,
    round_plans,
)
from dspark_bench.replay.tables import record_depths, tables  # noqa: F401 (record_depths: the depth's users)

# One policy's walk (`simulate`) and the compiled walk of a whole grid are the same rule in two
# forms, tested equal; kept side by side so a change to one is read beside the other. What fixes a
# round at each position, which both read, is replay/rounds.py's.


# --- simulation, one policy at a time ---------------------------------------------------------


def simulate(rec: Record, config: DecodeConfig, made: dict | None = None) -> list[list[Round]]:
    """The decoder's rounds for every prompt, from the record alone (greedy only). `made`: an engine
    controller's round plans already made on `rec` (rounds.round_plans)."""
    check_replayable(rec, config)
    if schedules.of(config).whole_batch and config.batching.batch_size > 1:
        raise DsparkError("the budget schedule's rounds depend on the whole batch: "
                          "replay.joint_walks.walk_budget walks them")
    plans = round_plans(rec, config, made)
    # An engine's controller picks each round's plan; one runs on across the prompts, as in a server.
    controller = controllers.start(config)
    per_round = round_forwards(config)
    matches = match_lengths(rec)
    eos = set(rec.eos_ids)
    result = []
    for p in range(len(rec.lengths)):
        rounds, j, n = [], 0, int(rec.lengths[p])
        while j < n:
            drafted, forwards, reason, limit = plans[None if controller is None else controller.steps()]
            L, s, stop = int(drafted[p, j]), int(forwards[p, j]), STOP_REASONS[reason[p, j]]
            conf = rec.confidences[signal_of(config)][p, j, :s].astype(np.float64).tolist()
            if controller is not None:  # vLLM's adaptive verification may verify fewer than were drafted
                admitted = controller.admit([p], [conf[:L]])[0]
                L, stop = (admitted, "threshold") if admitted < L else (L, stop)
            a = min(L, int(matches[p, j]))
            proposal = rec.rollout[p, j, :L].tolist()
            ended_in_draft = a > 0 and proposal[a - 1] in eos
            target_token = -1 if ended_in_draft else int(rec.continuation[p, j + a])
            rounds.append(Round(L, a, a if ended_in_draft else a + 1, stop, proposal, conf,
                                target_token, s if per_round < 0 else per_round * int(limit[p, j] > 0)))
            if controller is not None:
                controller.observe([a], [L])
            j += a if ended_in_draft else a + 1
        result.append(rounds)
    return result


def spanning_policies(gamma: int, max_new_tokens: int, goodput_model: str = "") -> list[DecodeConfig]:
    """Every metric × schedule with thresholds, gamma_max and min_draft_len at their edges, each
    engine's rule variant in turn, plus "always draft" and "never draft past min_draft_len": the
    policies replay is checked on against the real decoder (tests and
    benchmarks/measurements/replay_reference.py). Goodput and budget policies only with a goodput model to decide with;
    no depth policy (each round one of these threshold policies, which a grid cannot walk: tests/test_replay.py
    checks it alone)."""
    out = []
    rules = [s.name for s in schedules.SCHEDULES.values()
             if not s.whole_batch and not s.by_depth and not s.controlled and (not s.cost_aware or goodput_model)]
    for i, (metric, schedule) in enumerate(itertools.product(METRICS, rules)):
        gamma_max = (1, min(4, gamma), gamma)[i % 3]
        min_draft_len = (0, 1, gamma_max)[(i // 3) % 3]
        threshold = (0.1, 0.3, 0.6, 0.9)[i % 4]
        out.append(DecodeConfig.of(metric=metric, schedule=schedule, threshold=threshold, threshold_start=threshold / 3,
                                threshold_end=threshold, gamma_max=gamma_max, min_draft_len=min_draft_len,
                                max_new_tokens=max_new_tokens, semantics=SEMANTICS[(i // 2) % len(SEMANTICS)],
                                goodput_model=goodput_model if schedules.named(schedule).cost_aware else ""))
    if goodput_model:  # the budget schedule, alone goodput's rule; it has no engine rule variant
        budget = next(s.name for s in schedules.SCHEDULES.values() if s.whole_batch)
        out += [DecodeConfig.of(metric=metric, schedule=budget, gamma_max=(gamma, min(4, gamma))[i % 2],
                                min_draft_len=i % 2, max_new_tokens=max_new_tokens, goodput_model=goodput_model)
                for i, metric in enumerate(METRICS)]
    return out + [DecodeConfig.of(threshold=0.0, gamma_max=gamma, max_new_tokens=max_new_tokens),
                  DecodeConfig.of(threshold=1.0, gamma_max=min(5, gamma), max_new_tokens=max_new_tokens)]


# --- simulation of a whole grid at once -------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def failure_codes(signal, thresholds, min_draft_len, keep, eos_step, out):  # pragma: no cover (compiled)
    """out[p, j]: 2 × where the draft stops for one (signal, thresholds, forced positions), + 1
    when the schedule dropped that step (its forward counts but its token is not drafted).

    The stop is one past the last drafted step: the first failing step if it is dropped, the
    step after it if it is kept (`keep`: rules.keeps_failing), or one past the rollout's first
    EOS, if earlier. Folding EOS in lets the walk take a round's length as one min with
    gamma_max and the budget."""
    P, N, G = signal.shape
    for p in range(P):
        for j in range(N):
            fail = G + 1
            for k in range(min_draft_len, G):
                if not signal[p, j, k] >= thresholds[k]:  # NaN fails, as in the decoder
                    fail = k + 1
                    break
            if keep:
                out[p, j] = 2 * (fail + 1) if fail < eos_step[p, j] else 2 * (eos_step[p, j] + 1)
            else:
                out[p, j] = 2 * fail + (fail <= G) if fail <= eos_step[p, j] else 2 * (eos_step[p, j] + 1)


@numba.njit(cache=True, nogil=True)
def round_length(fail, cap, discard_below):  # pragma: no cover (compiled)
    """(drafted, draft forwards) of a round from its `failure_codes` code and its cap
    (min(gamma_max, budget)): a dropped step's forward counts too; llama.cpp's rule drafts
    nothing when the cap is below its minimum and throws a shorter draft away."""
    stop, dropped = fail >> 1, fail & 1
    length = min(stop - 1, cap)  # a stop beyond the cap: drafted up to the cap
    forwards = length + (dropped & (stop <= cap))
    if cap < discard_below:
        return 0, 0
    return (0 if length < discard_below else length), forwards


@numba.njit(cache=True, nogil=True)
def _walk(fail, gamma_max, discard_below, matches, available, per_round, lengths, max_new_tokens, verify_cost,
          draft_cost, unused_first, bucket, counts, by_depth):  # pragma: no cover
    """The walk of `simulate` for one policy, keeping only totals: rounds, drafted, accepted,
    full blocks, draft forwards and Σ verify_cost[p, j, L] (a round's cost at its own depth; less
    `unused_first`, the draft model's first-step excess, where a round ran no draft step).
    `by_depth[b]` keeps the rounds starting in depth bucket `bucket[p, j]`: the same five counts,
    emitted tokens, verify seconds and draft seconds (forwards × draft_cost[p, j]). Only round
    starts are visited, without a data-dependent branch in a round (random accept/reject defeats
    branch prediction)."""
    rounds = drafted = accepted = full = forwards = 0
    spent = 0.0
    for p in range(len(lengths)):
        j = 0
        while j < lengths[p]:
            cap = min(gamma_max, max_new_tokens - j - 1, available[p, j])
            length, spent_forwards = round_length(fail[p, j], cap, discard_below)
            if per_round >= 0:  # heads: one pass a round that may draft; lookup: none
                spent_forwards = per_round if cap > 0 and cap >= discard_below else 0
            a = min(length, matches[p, j])
            rounds += 1
            drafted += length
            accepted += a
            full += a == length
            forwards += spent_forwards
            paid = verify_cost[p, j, length] - unused_first * (spent_forwards == 0)
            spent += paid
            row = by_depth[bucket[p, j]]
            row[0] += 1
            row[1] += length
            row[2] += a
            row[3] += a == length
            row[4] += spent_forwards
            row[5] += min(a + 1, lengths[p] - j)
            row[6] += paid
            row[7] += spent_forwards * draft_cost[p, j]
            # An accepted EOS is the continuation's last token (`record` stops at EOS): the walk
            # ends there either way, with or without the target's extra token.
            j += a + 1
    counts[0], counts[1], counts[2], counts[3], counts[4] = rounds, drafted, accepted, full, forwards
    return spent


@numba.njit(cache=True, nogil=True)
def _walk_grid(signals, signal_of, thresholds, forced, keep, discard_below, gamma_max, groups, matches, eos_step,
               available, per_round, lengths, max_new_tokens, verify_cost, draft_cost, unused_first, bucket, counts,
               verify, by_depth):  # pragma: no cover
    """Every policy's totals. Policies are ordered so that those sharing signal, thresholds,
    forced positions and what happens to a failing token (differing in gamma_max or llama.cpp's
    minimum only) are consecutive: `groups` marks where each run starts, and one table of
    failure positions serves the whole run."""
    fail = np.empty(matches.shape, dtype=np.int64)
    for g in range(len(groups) - 1):
        first = groups[g]
        failure_codes(signals[signal_of[first]], thresholds[first], forced[first], keep[first], eos_step, fail)
        for c in range(first, groups[g + 1]):
            verify[c] = _walk(fail, gamma_max[c], discard_below[c], matches, available, per_round, lengths,
                              max_new_tokens, verify_cost, draft_cost, unused_first, bucket, counts[c], by_depth[c])


def signal_kind(config: DecodeConfig) -> tuple:
    """Policies of one kind compare the same signal: the metric's, its running product
    ("cumulative"), or goodput's decisions (which depend on its model and batch size too)."""
    if schedules.of(config).cost_aware:
        return signal_of(config), config.stopping.schedule, config.stopping.goodput_model, config.batching.batch_size
    return signal_of(config), schedules.of(config).cumulative


def grid_signals(rec: Record, configs: list[DecodeConfig]) -> tuple[np.ndarray, np.ndarray]:
    """The compared signal per kind [S, P, N, G] (`policy_signal`) and each policy's index into it."""
    kinds = [signal_kind(c) for c in configs]
    first = dict(zip(kinds, configs))  # a representative policy of each kind, in order of appearance
    order = {kind: i for i, kind in enumerate(first)}
    signals = np.stack([policy_signal(rec, config) for config in first.values()])
    return signals, np.array([order[kind] for kind in kinds], dtype=np.int64)


def grid_thresholds(configs: list[DecodeConfig], G: int) -> np.ndarray:
    """[C, G]: the threshold of every draft position, by the schedule's own `threshold_at`; -1 for a
    depth policy, whose rounds are its buckets' policies' (rounds.round_plan) and read none of these."""
    rows: dict = {}
    out = np.empty((len(configs), G))
    for c, config in enumerate(configs):
        p = config.stopping
        if schedules.of(config).by_depth:
            out[c] = -1.0
            continue
        key = (p.schedule, p.threshold, p.threshold_start, p.threshold_end, p.gamma_max)
        if key not in rows:
            rows[key] = position_thresholds(config, G)
        out[c] = rows[key]
    return out


def rule_arrays(configs: list[DecodeConfig]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per policy: positions always kept, whether a failing token stays, llama.cpp's minimum."""
    return (np.array([forced(c) for c in configs], dtype=np.int64),
            np.array([keeps_failing(c) for c in configs], dtype=np.bool_),
            np.array([discards_below(c) for c in configs], dtype=np.int64))


def simulate_grid(rec: Record, configs: list[DecodeConfig], cost: "CostModel | None" = None) -> pd.DataFrame:
    """Totals, metrics and (with a cost model) predicted speedup for every policy, one row each."""
    return simulate_grid_by_depth(rec, configs, cost)[0]


def simulate_grid_by_depth(rec: Record, configs: list[DecodeConfig],
                           cost: "CostModel | None" = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`simulate_grid`'s table, and the same policies' totals and metrics per depth bucket of the
    rounds' starts (depth.DEPTH_LABELS; one row per policy and bucket with rounds). A cost model
    with a depth axis (CostModel.by_depth) prices every round, and plain decoding's every token,
    at its own depth: the table then holds predicted_baseline_time, and predicted_speedup is
    baseline over predicted time. Depth policies (their threshold and γ_max change with the
    round's depth) are walked one at a time (`simulate_priced`) and take their places in order."""
    if not configs:
        raise DsparkError("no policies to simulate")
    walked = [i for i, c in enumerate(configs) if schedules.of(c).by_depth or schedules.of(c).controlled]
    if walked:
        return _with_walked(rec, configs, walked, cost)
    for config in configs:
        check_replayable(rec, config)
    G = rec.gamma_record
    deepest = max(c.stopping.gamma_max for c in configs)
    if cost is not None and any(c.verification.draft_mode != "early-stop" for c in configs):
        # Its rounds are early-stop's (test_replay), but each costs gamma_max draft steps and a
        # full-length verify, which this walk does not price.
        raise DsparkError("replay prices the early-stop draft mode only; run verify-side policies to time them")
    if cost is not None and len(cost.t_verify) <= deepest:
        raise DsparkError(f"the cost model times drafts of up to {len(cost.t_verify) - 1} tokens, "
                          f"not gamma_max {deepest}; measure it again")
    signals, signal_of = grid_signals(rec, configs)
    thresholds = grid_thresholds(configs, G)
    forced_steps, keep, discard_below = rule_arrays(configs)
    # Policies that stop at the same draft steps walk one after another (see _walk_grid).
    keys = np.column_stack([signal_of, forced_steps, keep, thresholds])
    _, group_of = np.unique(keys, axis=0, return_inverse=True)
    order = np.argsort(group_of.ravel(), kind="stable")
    groups = np.flatnonzero(np.diff(group_of.ravel()[order], prepend=-1, append=-2))
    gamma_max = np.array([c.stopping.gamma_max for c in configs], dtype=np.int64)
    depths, bucket, draft_cost, verify_cost = position_costs(rec, cost, configs[0].drafting.drafter)
    counts, verify = np.zeros((len(configs), 5), dtype=np.int64), np.zeros(len(configs))
    by_depth = np.zeros((len(configs), len(DEPTH_LABELS), 8))
    arrays = (signals, signal_of[order], thresholds[order], forced_steps[order], keep[order], discard_below[order],
              gamma_max[order])
    record_arrays = (match_lengths(rec).astype(np.int64), eos_positions(rec).astype(np.int64),
                     rec.available.astype(np.int64), round_forwards(configs[0]), rec.lengths.astype(np.int64),
                     rec.max_new_tokens, verify_cost, draft_cost, unused_first(cost, configs[0].drafting.drafter),
                     bucket)

    def walk(bounds: np.ndarray) -> None:  # compiled without the GIL: threads run it in parallel
        _walk_grid(*arrays, bounds, *record_arrays, counts, verify, by_depth)

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    # Consecutive runs of groups per task (a group's bounds are shared with the next task's).
    cuts = np.unique(np.linspace(0, len(groups) - 1, 4 * cores + 1).astype(int))
    with ThreadPoolExecutor(cores) as pool:
        list(pool.map(walk, [groups[a : b + 1] for a, b in zip(cuts[:-1], cuts[1:])]))
    # back to the caller's order
    counts[order], verify[order], by_depth[order] = counts.copy(), verify.copy(), by_depth.copy()
    return tables(rec, configs, cost, counts, verify, by_depth, depths, bucket)


def unused_first(cost, drafter: str) -> float:
    """What a round that runs no draft step (a prompt's last token, a draft under llama.cpp's minimum,
    a controller's length 0) does not pay of its round cost: the draft model's first-step excess."""
    return float(cost.t_first_draft) if cost is not None and drafter == "model" else 0.0


def position_costs(rec: Record, cost, drafter: str):
    """Per position (p, j) of the record: its depth, its depth bucket, one draft forward's cost and
    a round's cost by draft length [P, N, G + 1] (zeros without a cost model; the draft model's first
    step's excess only where it drafts): the one record, one drafter (check_replayable) — the heads'
    pass and the lookup's search have no depth axis."""
    depths = record_depths(rec)
    G = rec.gamma_record
    draft_cost, verify_cost = (cost.at_depths(depths, drafter) if cost else
                               (np.zeros(depths.shape), np.broadcast_to(np.zeros(G + 1), (*depths.shape, G + 1))))
    if cost is not None and drafter != "model":
        draft_cost = np.full(depths.shape, cost.draft_step(drafter))
    return depths, depth_bucket(depths).astype(np.int64), draft_cost, verify_cost


def _with_walked(rec: Record, configs: list[DecodeConfig], walked: list[int],
                 cost) -> tuple[pd.DataFrame, pd.DataFrame]:
    """simulate_grid_by_depth's tables with the policies at `walked` walked by `simulate_priced`."""
    rest = [i for i in range(len(configs)) if i not in set(walked)]
    parts = [simulate_grid_by_depth(rec, [configs[i] for i in rest], cost)] if rest else []
    ids, made = ([rest] if rest else []), {}
    for i in walked:
        parts.append(simulate_priced(rec, configs[i], cost, made))
        ids.append([i])
    tables, by_depth = [], []
    for (table, depth_rows), order in zip(parts, ids):
        order = np.asarray(order)
        tables.append(table.assign(config_id=order[table["config_id"].to_numpy()]))
        by_depth.append(depth_rows.assign(config_id=order[depth_rows["config_id"].to_numpy()]))
    table = pd.concat(tables, ignore_index=True).sort_values("config_id", ignore_index=True)
    return table, pd.concat(by_depth, ignore_index=True).sort_values(["config_id"], kind="stable", ignore_index=True)


def simulate_priced(rec: Record, config: DecodeConfig, cost: "CostModel | None" = None,
                    made: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`simulate_grid_by_depth`'s two tables for one policy walked round by round by `simulate`:
    what prices a policy the grid's walk cannot take, a depth schedule's (its threshold and γ_max
    change with the round's depth)."""
    depths, bucket, draft_cost, verify_cost = position_costs(rec, cost, config.drafting.drafter)
    unused = unused_first(cost, config.drafting.drafter)
    # A depth policy's learned buckets pay the learned signal's host work on their own draft steps
    # (tables.learned_everywhere charges the other policies' by their metric).
    learned = [cost is not None and p.stopping.metric == LEARNED for p in bucket_policies(config)] \
        if schedules.of(config).by_depth else [False] * len(DEPTH_LABELS)
    counts, verify = np.zeros((1, 5), dtype=np.int64), np.zeros(1)
    by_depth = np.zeros((1, len(DEPTH_LABELS), 8))
    for p, rounds in enumerate(simulate(rec, config, made)):
        j = 0
        for r in rounds:
            spent = float(verify_cost[p, j, r.drafted]) - (unused if r.draft_forwards == 0 else 0.0)
            spent += r.draft_forwards * cost.t_learned if learned[bucket[p, j]] else 0.0
            counts[0] += (1, r.drafted, r.accepted, r.accepted == r.drafted, r.draft_forwards)
            verify[0] += spent
            by_depth[0, bucket[p, j]] += (1, r.drafted, r.accepted, r.accepted == r.drafted, r.draft_forwards,
                                          min(r.accepted + 1, int(rec.lengths[p]) - j), spent,
                                          r.draft_forwards * draft_cost[p, j])
            j += r.accepted + 1
    return tables(rec, [config], cost, counts, verify, by_depth, depths, bucket)


__all__ = ["CostModel", "Record", "simulate", "simulate_grid"]

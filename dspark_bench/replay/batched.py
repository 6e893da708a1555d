"""Replay at any batch size: one batch-1 record and a cost model over B predict every policy at B.

Under greedy verification a row's rounds do not depend on the other rows (tests/test_batched.py
checks it against the batched decoder), so the record fixes every row's rounds; only what a step
costs depends on the batch. The walk below replays the batched decoder's schedule exactly —
prompts join in order as rows finish (or after the batch drains), a round drafts until its
last row stops, and its one verify pass covers every row — and charges each round from the
cost model over B at the number of rows it really had, and each request its own prefill when it
joins (target, plus draft on the speculative side; as the batched decoder runs it) with the copy of
the batch's caches it is spliced into (replay/slots.py):

    padded:  max_i s_i · t_draft(b) + t_verify(b, max_i L_i)
    packed:  Σ_j t_draft(rows still drafting at step j) + t_verify(b, Σ_i (L_i + 1) / b − 1)

and the batched baseline one t_verify(b, 0) per step. Speedup = baseline time / policy time
(greedy: both sides make the same tokens). At B = 1 both layouts give replay's own prediction.
Where the surface was timed at depths at every B, each step is priced at its rows' depths (padded:
the widest row's, packed: their mean; step_prices.py), and a depth policy's rows each run their
own bucket's policy, as the batched decoder runs them. The walks whose rows decide together (the
budget's, an engine controller's) are joint_walks.py's.
"""

from __future__ import annotations

import numba
import numpy as np
import pandas as pd

from dspark_bench import schedules
from dspark_bench.config import LEARNED, DecodeConfig
from dspark_bench.decoding.budget import packed_verify
from dspark_bench.errors import DsparkError
from dspark_bench.metrics import rates
from dspark_bench.replay.cost import CostModel, CostSurface
from dspark_bench.replay.joint_walks import TOTALS, depths_for, walk_budget, walk_controlled
from dspark_bench.replay.record import Record
from dspark_bench.replay.rounds import eos_positions, match_lengths, round_plan
from dspark_bench.replay.simulate import (
    failure_codes,
    grid_signals,
    grid_thresholds,
    round_length,
    rule_arrays,
    simulate_grid,
)
from dspark_bench.replay.slots import admit, stamp
from dspark_bench.replay.step_prices import admissions, draft_row, step_depths, step_prices, verify_row


@numba.njit(cache=True, nogil=True)
def _quorum_cut(drafting, quorum, active, min_draft_len, G):  # pragma: no cover (compiled)
    """The quorum rule: every row stops after the first step too few rows outlast (G + 1: none;
    `drafting[j]`: rows whose draft ran at least j forwards)."""
    if quorum > 0:
        for step in range(max(min_draft_len, 1), G + 1):
            if 0 < drafting[step + 1] < quorum * active:
                return step
    return G + 1


@numba.njit(cache=True, nogil=True)
def _walk_batched(fail, plan, gamma_max, min_draft_len, discard_below, quorum, matches, lengths, max_new_tokens,
                  batch_size, refill, at, t_draft, t_verify, depth_of, joins, arrive, first,
                  end):  # pragma: no cover (compiled)
    """Predicted seconds of one policy at `batch_size`: (padded, packed), each step priced at its
    rows' depths (step_prices.py). A round is fail[p, j]'s (`round_length`), or, where `plan` [2, P, N]
    holds rows, what its plan drafted and its forwards (a depth policy's: rounds.round_plan). The padded
    layout's clock (the layout the batched decoder runs) admits arrivals and stamps each request's
    first and last token into `first` / `end`."""
    P, G, planned = len(lengths), t_verify.shape[2] - 1, plan.shape[1] > 0
    slot_p, slot_j = np.full(batch_size, -1), np.zeros(batch_size, np.int64)
    length, forwards = np.zeros(batch_size, np.int64), np.zeros(batch_size, np.int64)
    drafting = np.zeros(G + 2, np.int64)  # rows whose draft ran at least j forwards
    rows, starts = np.empty(batch_size, np.int64), np.empty(batch_size, np.int64)  # a step's rows, as it began
    next_p, active, padded, packed = 0, 0, 0.0, 0.0
    while True:
        next_p, active, clock, spent = admit(slot_p, slot_j, next_p, P, active, refill, joins, padded, arrive)
        padded, packed = clock + spent, packed + (clock - padded) + spent
        if active == 0:
            return padded, packed
        rows[:], starts[:] = slot_p, slot_j
        drafting[:] = 0
        for s in range(batch_size):  # each row's own draft: its length and its draft forwards
            p = slot_p[s]
            if p >= 0:
                j = slot_j[s]
                if planned:
                    length[s], forwards[s] = plan[0, p, j], plan[1, p, j]
                else:
                    length[s], forwards[s] = round_length(fail[p, j], min(gamma_max, max_new_tokens - j - 1),
                                                          discard_below)
                drafting[1 : forwards[s] + 1] += 1
        cut = _quorum_cut(drafting, quorum, active, min_draft_len, G)
        longest, most, tokens, leaving = 0, 0, 0, 0
        widest, mean = step_depths(depth_of, rows, starts)
        drafting[:] = 0
        for s in range(batch_size):
            p = slot_p[s]
            if p < 0:
                continue
            j = slot_j[s]
            length[s], forwards[s] = min(length[s], cut), min(forwards[s], cut)
            if length[s] < discard_below:  # a draft the quorum cut short is thrown away too
                length[s] = 0
            longest, most, tokens = max(longest, length[s]), max(most, forwards[s]), tokens + length[s] + 1
            drafting[1 : forwards[s] + 1] += 1
            slot_j[s] = j + min(length[s], matches[p, j]) + 1
            if slot_j[s] >= lengths[p]:
                slot_p[s] = -1
                leaving += 1
        padded += most * draft_row(at, t_draft, widest)[active] + verify_row(at, t_verify, widest, active)[longest]
        stamp(rows, starts, padded, first, end)
        draft_mean = draft_row(at, t_draft, mean)
        for step in range(1, most + 1):
            packed += draft_mean[drafting[step]]
        packed += packed_verify(verify_row(at, t_verify, mean, active), tokens, active)
        active -= leaving


@numba.njit(cache=True, nogil=True)
def _walk_baseline(lengths, batch_size, refill, at, t_verify, depth_of, joins, arrive, first,
                   end):  # pragma: no cover (compiled)
    """Predicted seconds of batched autoregressive decoding: one t_verify(b, 0) per step, at its
    widest row's depth (arrivals and first / last tokens as `_walk_batched`'s)."""
    P = len(lengths)
    slot_p, slot_j = np.full(batch_size, -1), np.zeros(batch_size, np.int64)
    next_p, active, spent = 0, 0, 0.0
    while True:
        next_p, active, clock, admitted = admit(slot_p, slot_j, next_p, P, active, refill, joins, spent, arrive)
        spent = clock + admitted
        if active == 0:
            return spent
        spent += verify_row(at, t_verify, step_depths(depth_of, slot_p, slot_j)[0], active)[0]
        stamp(slot_p, slot_j, spent, first, end)
        for s in range(batch_size):
            if slot_p[s] >= 0:
                slot_j[s] += 1
                if slot_j[s] >= lengths[slot_p[s]]:
                    slot_p[s] = -1
                    active -= 1


def predict_batched(rec: Record, configs: list[DecodeConfig], surface: CostSurface,
                    refill: bool = True) -> pd.DataFrame:
    """Per policy, at its own batch_size: predicted seconds and speedup, padded and packed, and
    the batched baseline's predicted seconds (every prompt waiting at the start)."""
    table = pd.DataFrame(list(walks(rec, configs, surface, refill)))
    table = table.sort_values("config_id").reset_index(drop=True)
    table["predicted_speedup"] = table["predicted_baseline_time"] / table["predicted_time"]
    table["predicted_speedup_packed"] = table["predicted_baseline_time"] / table["predicted_time_packed"]
    return table


def walks(rec: Record, configs: list[DecodeConfig], surface: CostSurface, refill: bool = True,
          arrive: np.ndarray | None = None, per_request=None):
    """Each policy's walk at its own batch_size, one row (a dict) each, in no set order, every step
    priced at its rows' depths where the surface has a depth axis at every B (step_prices.py).
    `arrive`: each record row's arrival (seconds; None: all at 0), in the order they arrive; where
    given, `per_request(first, end)` (each row's first and last token, on the padded clock) adds its
    columns to the row, and the plain decoding of each batch size is a row of its own (config_id -1)."""
    deepest = max(c.stopping.gamma_max for c in configs)
    if min(len(m.t_verify) for m in surface.models.values()) <= deepest:
        raise DsparkError(f"the cost surface times drafts shorter than gamma_max {deepest}; measure it again")
    if any(schedules.any_family(c) for c in configs):  # its rows would read one metric and one rule's minimum
        raise DsparkError("a depth policy whose entries name their own family replays at batch size 1 (simulate)")
    matches, eos = match_lengths(rec).astype(np.int64), eos_positions(rec).astype(np.int64)
    lengths = rec.lengths.astype(np.int64)
    arrive = np.zeros(len(lengths)) if arrive is None else np.asarray(arrive, dtype=np.float64)
    first, end = np.zeros(len(lengths)), np.zeros(len(lengths))
    signals, signal_of = grid_signals(rec, configs)
    thresholds = grid_thresholds(configs, rec.gamma_record)
    # A learned policy's draft steps cost what its signal adds too (CostModel.t_learned).
    prices = {(b, learned): step_prices(surface, b, learned)
              for b, learned in {(c.batching.batch_size, c.stopping.metric == LEARNED) for c in configs}}
    depth_of = depths_for(rec, next(iter(prices.values())))
    # Each request's admission: its prefill (its prompt but the last token), as the batched decoder runs
    # it, and the copy of the batch's caches it is spliced into.
    joins_base, joins_spec = admissions(surface, rec.info.get("prompt_tokens", [1] * len(lengths)))
    baseline = {}
    for b in sorted({b for b, _ in prices}):  # plain decoding's steps at its own terms (CostSurface.tables' `plain`)
        plain = step_prices(surface, b, plain=True)
        baseline[b] = _walk_baseline(lengths, b, refill, plain.at, plain.verify, depth_of, joins_base, arrive,
                                     first, end)
        if per_request is not None:
            yield {"config_id": -1, "batch_size": b, "predicted_time": baseline[b], **per_request(first, end)}
    fail, no_plan = np.empty(matches.shape, dtype=np.int64), np.zeros((2, 0, 0), dtype=np.int64)
    last_key, made = None, {}  # made: the controllers' round plans, shared
    forced_steps, keep, discard_below = rule_arrays(configs)
    order = sorted(range(len(configs)), key=lambda c: (signal_of[c], forced_steps[c], keep[c], tuple(thresholds[c])))
    for c in order:
        config, kind = configs[c], schedules.of(configs[c])
        priced = prices[(config.batching.batch_size, config.stopping.metric == LEARNED)]
        if kind.whole_batch:  # its rows decide together: a walk of its own
            row = walk_budget(rec, config, priced, joins_spec, refill, matches, eos, arrive, first, end)[0]
        elif kind.controlled:  # one controller sets every row's length: so does its walk
            row = walk_controlled(rec, config, priced, joins_spec, refill, matches, arrive, first, end, made=made)
        else:
            key = (signal_of[c], forced_steps[c], keep[c], tuple(thresholds[c]))
            if key != last_key and not kind.by_depth:  # policies stopping at the same steps share one failure table
                failure_codes(signals[signal_of[c]], thresholds[c], forced_steps[c], keep[c], eos, fail)
                last_key = key
            # A depth policy's round at (p, j) is its depth bucket's policy's there: its plan holds them.
            plan = np.stack(round_plan(rec, config)[:2]).astype(np.int64) if kind.by_depth else no_plan
            padded, packed = _walk_batched(fail, plan, config.stopping.gamma_max, forced_steps[c], discard_below[c],
                                           config.stopping.batch_quorum, matches, lengths, rec.max_new_tokens,
                                           config.batching.batch_size, refill, priced.at, priced.draft, priced.verify,
                                           depth_of, joins_spec, arrive, first, end)
            row = {"predicted_time": padded, "predicted_time_packed": packed}
        row = {"config_id": c, **row, "predicted_baseline_time": baseline[config.batching.batch_size]}
        yield row if per_request is None else {**row, **per_request(first, end)}


def simulate_with_surface(rec: Record, configs: list[DecodeConfig], surface: CostSurface,
                          refill: bool = True, batch_one: CostModel | None = None) -> pd.DataFrame:
    """`simulate_grid`'s table, its predictions made at each policy's own batch size: padded in
    predicted_time / predicted_speedup, packed in the *_packed columns, and the batched baseline's
    predicted_baseline_time (at B = 1 and without prefill costs: the numbers simulate_grid
    gives; the walk adds each request's prefill, which simulate_grid leaves out). `batch_one`: the
    batch-1 decoder's own prices (timed inside its decodes), which a batch-1 policy is then priced
    on as a batch-1 sweep prices it (`batch_one_priced`), not as a one-row live batch."""

    grid = simulate_grid(rec, configs, surface.at(1))
    predicted = predict_batched(rec, configs, surface, refill)
    joint = predicted.dropna(subset=["rounds"]) if "rounds" in predicted else predicted.iloc[:0]
    if len(joint):  # the budget's and a controller's rounds are the batch's, not each row's alone: the walk's
        grid = grid.set_index("config_id")
        ids = joint["config_id"].to_numpy()
        for column in TOTALS:
            grid.loc[ids, column] = joint[column].to_numpy()
        for column, values in rates(grid.loc[ids]).items():
            grid.loc[ids, column] = values
        grid.loc[ids, "draft_forwards_per_token"] = grid.loc[ids, "draft_forwards"] / grid.loc[ids, "new_tokens"]
        grid = grid.reset_index()
    predicted = predicted.drop(columns=[c for c in TOTALS if c in predicted])
    # The walk's times (a depth-priced grid's baseline too: the walk's is the batch's).
    table = grid.drop(columns=["predicted_time", "predicted_speedup", "predicted_baseline_time"], errors="ignore")
    table = table.merge(predicted, on="config_id")
    return table if batch_one is None else batch_one_priced(rec, configs, table, batch_one)


def batch_one_priced(rec: Record, configs: list[DecodeConfig], table: pd.DataFrame, cost: CostModel) -> pd.DataFrame:
    """`table` with its batch-1 policies' predictions simulate_grid's on `cost`: the batch-1 decoder
    runs them, whose rounds pay its own host work (t_round, t_plain), not a live batch's step terms
    at one row (a sweep over B priced inside decodes read them at half their measured speedup)."""
    alone = [i for i, c in enumerate(configs) if c.batching.batch_size == 1]
    if not alone:
        return table
    grid = simulate_grid(rec, [configs[i] for i in alone], cost)
    where = table.set_index("config_id").index.get_indexer(np.asarray(alone)[grid["config_id"].to_numpy()])
    speedup, seconds = grid["predicted_speedup"].to_numpy(), grid["predicted_time"].to_numpy()
    table = table.copy()
    for column, values in (("predicted_time", seconds), ("predicted_time_packed", seconds),
                           ("predicted_speedup", speedup), ("predicted_speedup_packed", speedup),
                           ("predicted_baseline_time", seconds * speedup)):
        table.loc[table.index[where], column] = values
    return table

"""Replay at any batch size: one batch-1 record and a cost model over B predict every policy at B.

Under greedy verification a row's rounds do not depend on the other rows (tests/test_batched.py
checks it against the batched decoder), so the record fixes every row's rounds; only what a step
costs depends on the batch. The walk below replays the batched decoder's schedule exactly —
prompts join in order as rows finish (or after the batch drains), a round drafts until its
last row stops, and its one verify pass covers every row — and charges each round from the
cost model over B at the number of rows it really had, and each request its own prefill when it
joins (target, plus draft on the speculative side; as the batched decoder runs it):

    padded:  max_i s_i · t_draft(b) + t_verify(b, max_i L_i)
    packed:  Σ_j t_draft(rows still drafting at step j) + t_verify(b, Σ_i (L_i + 1) / b − 1)

and the batched baseline one t_verify(b, 0) per step. Speedup = baseline time / policy time
(greedy: both sides make the same tokens). At B = 1 both layouts give replay's own prediction.
"""

from __future__ import annotations

import numba
import numpy as np
import pandas as pd

from dspark_bench import schedules
from dspark_bench.config import LEARNED, DecodeConfig
from dspark_bench.decoding import budget, controllers
from dspark_bench.decoding.budget import decide, draft_seconds, packed_verify
from dspark_bench.decoding.confidence import signal_of
from dspark_bench.errors import DsparkError
from dspark_bench.metrics import rates
from dspark_bench.replay.cost import CostModel, CostSurface
from dspark_bench.replay.record import Record
from dspark_bench.replay.rounds import eos_positions, match_lengths, round_plans
from dspark_bench.replay.simulate import (
    failure_codes,
    grid_signals,
    grid_thresholds,
    round_length,
    rule_arrays,
    simulate_grid,
)

TOTALS = ("rounds", "drafted_total", "accepted_total", "full_blocks", "draft_forwards")  # what the budget walk counts


@numba.njit(cache=True, nogil=True)
def _admit(slot_p, slot_j, next_p, P, active, refill, prefill, clock, arrive):  # pragma: no cover (compiled)
    """Fill free slots, in order, from the requests that have arrived by the clock (`arrive`: each
    request's arrival, all 0 when every prompt waits at the start), each paying its own prefill
    one after another, as the batched decoder admits them (one arriving meanwhile joins too). An
    empty server first waits for the next arrival. Returns (next request, active rows, the clock
    once done waiting, the prefills' seconds): with no wait the clock is `clock` itself, so a
    walk without arrivals adds what it always added."""
    if active == 0 and next_p < P and arrive[next_p] > clock:
        clock = arrive[next_p]  # idle until the next request arrives
    spent = 0.0
    if refill or active == 0:
        for s in range(len(slot_p)):
            if slot_p[s] < 0 and next_p < P and arrive[next_p] <= clock + spent:
                slot_p[s], slot_j[s] = next_p, 0
                spent += prefill[next_p]
                next_p += 1
                active += 1
    return next_p, active, clock, spent


@numba.njit(cache=True, nogil=True)
def _stamp(rows, starts, clock, first, end):  # pragma: no cover (compiled)
    """After a step ends at `clock`: the first token of each row that started there (`starts` 0),
    and the latest token of every row (its last step's is its end)."""
    for r in range(len(rows)):
        if rows[r] >= 0:
            if starts[r] == 0:
                first[rows[r]] = clock
            end[rows[r]] = clock


@numba.njit(cache=True, nogil=True)
def _walk_batched(fail, gamma_max, min_draft_len, discard_below, quorum, matches, lengths, max_new_tokens, batch_size,
                  refill, t_draft, t_verify, prefill, arrive, first, end):  # pragma: no cover (compiled)
    """Predicted seconds of one policy at `batch_size`: (padded, packed). The padded layout's
    clock (the layout the batched decoder runs) admits arrivals and stamps each request's first and last
    token into `first` / `end`."""
    P, G = len(lengths), t_verify.shape[1] - 1
    slot_p, slot_j = np.full(batch_size, -1), np.zeros(batch_size, np.int64)
    length, forwards = np.zeros(batch_size, np.int64), np.zeros(batch_size, np.int64)
    drafting = np.zeros(G + 2, np.int64)  # rows whose draft ran at least j forwards
    rows, starts = np.empty(batch_size, np.int64), np.empty(batch_size, np.int64)  # a step's rows, as it began
    next_p, active, padded, packed = 0, 0, 0.0, 0.0
    while True:
        next_p, active, clock, spent = _admit(slot_p, slot_j, next_p, P, active, refill, prefill, padded, arrive)
        padded, packed = clock + spent, packed + (clock - padded) + spent
        if active == 0:
            return padded, packed
        rows[:], starts[:] = slot_p, slot_j
        drafting[:] = 0
        for s in range(batch_size):  # each row's own draft: its length and its draft forwards
            p = slot_p[s]
            if p >= 0:
                j = slot_j[s]
                cap = min(gamma_max, max_new_tokens - j - 1)
                length[s], forwards[s] = round_length(fail[p, j], cap, discard_below)
                drafting[1 : forwards[s] + 1] += 1
        cut = G + 1  # the quorum rule: every row stops after the first step too few rows outlast
        if quorum > 0:
            for step in range(max(min_draft_len, 1), G + 1):
                if 0 < drafting[step + 1] < quorum * active:
                    cut = step
                    break
        longest, most, tokens, leaving = 0, 0, 0, 0
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
        padded += most * t_draft[active] + t_verify[active, longest]
        _stamp(rows, starts, padded, first, end)
        for step in range(1, most + 1):
            packed += t_draft[drafting[step]]
        packed += packed_verify(t_verify[active], tokens, active)
        active -= leaving


@numba.njit(cache=True, nogil=True)
def _walk_budget(alpha, eos_step, matches, lengths, max_new_tokens, gamma_max, min_draft_len, batch_size, refill,
                 packed_rule, rule_draft, rule_verify, t_draft, t_verify, prefill, drafted_at,
                 counts, arrive, first, end):  # pragma: no cover (compiled)
    """The budget schedule's walk (decoding/budget.py): its rows' drafts are decided together, by
    `decide` after every draft step on the batch's fitted acceptances `alpha` [P, N, G], as the
    batched decoder decides them. Predicted seconds (padded, packed); drafted_at[p, j]: what the
    round at j drafted (left alone where no round starts); counts: rounds, drafted, accepted,
    full blocks, draft forwards; arrivals and first / last tokens as `_walk_batched`'s."""
    P = len(lengths)
    slot_p, slot_j = np.full(batch_size, -1), np.zeros(batch_size, np.int64)
    go = np.zeros(batch_size, dtype=np.bool_)  # decide's answer, row by row
    next_p, active, padded, packed = 0, 0, 0.0, 0.0
    while True:
        next_p, active, clock, spent = _admit(slot_p, slot_j, next_p, P, active, refill, prefill, padded, arrive)
        padded, packed = clock + spent, packed + (clock - padded) + spent
        if active == 0:
            return padded, packed
        live = np.flatnonzero(slot_p >= 0)  # the batch's rows (their order changes no decision)
        n = len(live)
        keys, starts = slot_p[live], slot_j[live]
        expected, survival, gain = np.ones(n), np.ones(n), np.zeros(n)
        length, cap = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for r in range(n):
            cap[r] = min(gamma_max, max_new_tokens - starts[r] - 1)
        drafting = cap > 0
        steps_with, steps = np.zeros(n + 1, np.int64), 0
        while drafting.any():
            steps += 1
            steps_with[drafting.sum()] += 1
            for r in np.flatnonzero(drafting):  # each drafting row's next token, as Proposal takes it
                fitted = alpha[keys[r], starts[r], steps - 1]
                survival[r] *= fitted
                expected[r] += survival[r]
                gain[r] = survival[r] * fitted
                length[r] = steps
                if steps >= cap[r] or eos_step[keys[r], starts[r]] == steps:
                    drafting[r] = False
            decide(expected, gain, keys, drafting.copy(), length <= min_draft_len, length, steps_with, steps,
                   packed_rule, rule_draft, rule_verify, go[:n])
            drafting &= go[:n]
        tokens, leaving = 0, 0
        for r in range(n):
            p, j, L = keys[r], starts[r], length[r]
            accepted = min(L, matches[p, j])
            drafted_at[p, j] = L
            counts[0] += 1
            counts[1] += L
            counts[2] += accepted
            counts[3] += accepted == L
            counts[4] += L  # one draft forward per drafted token: the budget drops none
            tokens += L + 1
            slot_j[live[r]] = j + accepted + 1
            if slot_j[live[r]] >= lengths[p]:
                slot_p[live[r]] = -1
                leaving += 1
        padded += steps * t_draft[n] + t_verify[n, length.max()]
        _stamp(keys, starts, padded, first, end)
        packed += draft_seconds(steps_with, t_draft, 0) + packed_verify(t_verify[n], tokens, n)
        active -= leaving


@numba.njit(cache=True, nogil=True)
def _walk_baseline(lengths, batch_size, refill, t_verify, prefill, arrive, first,
                   end):  # pragma: no cover (compiled)
    """Predicted seconds of batched autoregressive decoding: one t_verify(b, 0) per step (arrivals
    and first / last tokens as `_walk_batched`'s)."""
    P = len(lengths)
    slot_p, slot_j = np.full(batch_size, -1), np.zeros(batch_size, np.int64)
    next_p, active, spent = 0, 0, 0.0
    while True:
        next_p, active, clock, admitted = _admit(slot_p, slot_j, next_p, P, active, refill, prefill, spent, arrive)
        spent = clock + admitted
        if active == 0:
            return spent
        spent += t_verify[active, 0]
        _stamp(slot_p, slot_j, spent, first, end)
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
    """Each policy's walk at its own batch_size, one row (a dict) each, in no set order. `arrive`:
    each record row's arrival (seconds; None: all at 0), in the order they arrive; where given,
    `per_request(first, end)` (each row's first and last token, on the padded clock) adds its
    columns to the row, and the plain decoding of each batch size is a row of its own
    (config_id -1)."""
    deepest = max(c.stopping.gamma_max for c in configs)
    if min(len(m.t_verify) for m in surface.models.values()) <= deepest:
        raise DsparkError(f"the cost surface times drafts shorter than gamma_max {deepest}; measure it again")
    matches, eos = match_lengths(rec).astype(np.int64), eos_positions(rec).astype(np.int64)
    lengths = rec.lengths.astype(np.int64)
    arrive = np.zeros(len(lengths)) if arrive is None else np.asarray(arrive, dtype=np.float64)
    first, end = np.zeros(len(lengths)), np.zeros(len(lengths))
    signals, signal_of = grid_signals(rec, configs)
    thresholds = grid_thresholds(configs, rec.gamma_record)
    # A learned policy's draft steps cost what its signal adds too (CostModel.t_learned).
    tables = {(b, learned): surface.tables(b, learned)
              for b, learned in {(c.batching.batch_size, c.stopping.metric == LEARNED) for c in configs}}
    # Each request's prefill (its prompt but the last token), batch 1, as the batched decoder does,
    # and what joining a live batch adds past it (CostSurface.join: 0 on isolated prices).
    alone = surface.at(min(surface.models))
    prompt = np.maximum(np.asarray(rec.info.get("prompt_tokens", [1] * len(lengths)), dtype=np.float64) - 1, 0)
    prefill_base = np.maximum(prompt * alone.t_prefill_target + surface.join(), 0.0)
    prefill_spec = np.maximum(prompt * (alone.t_prefill_target + alone.t_prefill_draft) + surface.join(), 0.0)
    baseline = {}
    for b, _ in tables:
        if b not in baseline:  # plain decoding's steps at its own terms (CostSurface.tables' `plain`)
            baseline[b] = _walk_baseline(lengths, b, refill, surface.tables(b, plain=True)[1], prefill_base, arrive,
                                         first, end)
            if per_request is not None:
                yield {"config_id": -1, "batch_size": b, "predicted_time": baseline[b], **per_request(first, end)}
    fail = np.empty(matches.shape, dtype=np.int64)
    last_key, made = None, {}  # made: the controllers' round plans, shared
    forced_steps, keep, discard_below = rule_arrays(configs)
    order = sorted(range(len(configs)), key=lambda c: (signal_of[c], forced_steps[c], keep[c], tuple(thresholds[c])))
    for c in order:
        config = configs[c]
        draft, verify = tables[(config.batching.batch_size, config.stopping.metric == LEARNED)]
        if schedules.of(config).whole_batch:  # its rows decide together: a walk of its own
            row = walk_budget(rec, config, draft, verify, prefill_spec, refill, matches, eos, arrive, first, end)[0]
        elif schedules.of(config).controlled:  # one controller sets every row's length: so does its walk
            row = walk_controlled(rec, config, draft, verify, prefill_spec, refill, matches, arrive, first, end,
                                  made=made)
        else:
            key = (signal_of[c], forced_steps[c], keep[c], tuple(thresholds[c]))
            if key != last_key:  # policies that stop at the same draft steps share one failure table
                failure_codes(signals[signal_of[c]], thresholds[c], forced_steps[c], keep[c], eos, fail)
                last_key = key
            padded, packed = _walk_batched(fail, config.stopping.gamma_max, forced_steps[c], discard_below[c],
                                           config.stopping.batch_quorum, matches, lengths, rec.max_new_tokens,
                                           config.batching.batch_size, refill, draft, verify, prefill_spec,
                                           arrive, first, end)
            row = {"predicted_time": padded, "predicted_time_packed": packed}
        row = {"config_id": c, **row, "predicted_baseline_time": baseline[config.batching.batch_size]}
        yield row if per_request is None else {**row, **per_request(first, end)}


def walk_budget(rec: Record, config: DecodeConfig, draft: np.ndarray, verify: np.ndarray, prefill: np.ndarray,
                refill: bool = True, matches: np.ndarray | None = None, eos: np.ndarray | None = None,
                arrive: np.ndarray | None = None, first: np.ndarray | None = None,
                end: np.ndarray | None = None) -> tuple[dict, np.ndarray]:
    """One budget policy at its batch size: (its predicted times and totals, drafted_at [P, N]:
    what the round at each position drafted, -1 where no round starts), priced by `draft` /
    `verify` (the cost model's tables at its B) and deciding with its own goodput model's; arrivals
    and first / last tokens as `walks`'."""
    rule = budget.rule_for(config)
    alpha = rule.curve(rec.confidences[signal_of(config)].astype(np.float64))  # as Proposal fits each score
    matches = match_lengths(rec).astype(np.int64) if matches is None else matches
    eos = eos_positions(rec).astype(np.int64) if eos is None else eos
    drafted_at, counts = np.full(matches.shape, -1, dtype=np.int64), np.zeros(5, dtype=np.int64)
    P = len(rec.lengths)
    arrive = np.zeros(P) if arrive is None else arrive
    first, end = (np.zeros(P) if first is None else first), (np.zeros(P) if end is None else end)
    padded, packed = _walk_budget(alpha, eos, matches, rec.lengths.astype(np.int64), rec.max_new_tokens,
                                  config.stopping.gamma_max, config.stopping.min_draft_len, config.batching.batch_size,
                                  refill, rule.packed, rule.t_draft, rule.t_verify, draft, verify,
                                  prefill, drafted_at, counts, arrive, first, end)
    totals = dict(zip(TOTALS, counts.tolist()))
    return {"predicted_time": padded, "predicted_time_packed": packed, **totals}, drafted_at


def walk_controlled(rec: Record, config: DecodeConfig, draft: np.ndarray, verify: np.ndarray, prefill: np.ndarray,
                    refill: bool, matches: np.ndarray, arrive: np.ndarray, first: np.ndarray,
                    end: np.ndarray, chosen: list | None = None, made: dict | None = None) -> dict:
    """One engine controller's policy at its batch size, as the batched decoder serves it: before
    each step the controller picks one length for every row (each row's round the fixed draft of
    that length there, `round_plans`), after it is fed every row's accepted count; priced as
    `_walk_batched` prices a step (padded and packed). Its predicted times and totals (TOTALS);
    `chosen` receives each step's (rows, length picked, mean accepted); `made`: round_plans' shared plans."""
    plans, controller = round_plans(rec, config, made), controllers.start(config)
    signal, trims = rec.confidences[signal_of(config)], schedules.of(config).priced
    B, P = config.batching.batch_size, len(rec.lengths)
    slot_p, slot_j = np.full(B, -1), np.zeros(B, np.int64)
    counts = np.zeros(len(TOTALS), dtype=np.int64)
    next_p, active, padded, packed = 0, 0, 0.0, 0.0
    while True:
        next_p, active, clock, spent = _admit(slot_p, slot_j, next_p, P, active, refill, prefill, padded, arrive)
        padded, packed = clock + spent, packed + (clock - padded) + spent
        if active == 0:
            return {"predicted_time": padded, "predicted_time_packed": packed, **dict(zip(TOTALS, counts.tolist()))}
        picked = controller.steps(active)
        drafted, forwards = plans[picked][:2]
        rows, starts = slot_p.copy(), slot_j.copy()
        stepped = [(s, slot_p[s], slot_j[s]) for s in range(B) if slot_p[s] >= 0]
        lengths = np.array([drafted[p, j] for _, p, j in stepped])
        if trims:  # vLLM's adaptive verification may verify fewer than were drafted (controllers.Controller.admit)
            lengths = np.array(controller.admit([p for _, p, _ in stepped], [
                signal[p, j, : drafted[p, j]].astype(np.float64).tolist() for _, p, j in stepped]), dtype=np.int64)
        spent_forwards = np.array([forwards[p, j] for _, p, j in stepped])
        accepted = np.minimum(lengths, [matches[p, j] for _, p, j in stepped])
        counts += (len(stepped), lengths.sum(), accepted.sum(), (accepted == lengths).sum(), spent_forwards.sum())
        padded += spent_forwards.max() * draft[active] + verify[active, lengths.max()]
        _stamp(rows, starts, padded, first, end)
        packed += sum(draft[(spent_forwards >= step).sum()] for step in range(1, spent_forwards.max() + 1))
        packed += packed_verify(verify[active], int((lengths + 1).sum()), active)
        controller.observe(accepted.tolist(), lengths.tolist())
        if chosen is not None:
            chosen.append((active, float(lengths.mean()) if trims else picked,
                           float(accepted.mean())))  # vLLM's: the mean length it verified of the K drafted
        for (s, p, j), a in zip(stepped, accepted):
            slot_j[s] = j + a + 1
            if slot_j[s] >= rec.lengths[p]:
                slot_p[s], active = -1, active - 1


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
    table = grid.drop(columns=["predicted_time", "predicted_speedup"]).merge(predicted, on="config_id")
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

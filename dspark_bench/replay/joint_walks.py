"""The batched walks whose rows decide together: the budget schedule's (decoding/budget.py: its
rows' drafts decided after every draft step on the batch's fitted acceptances) and an engine
controller's (decoding/controllers.py: one length for every row, fed back the rows' acceptances).
Each step priced as replay/batched.py prices one — padded and packed, at its rows' depths where
the prices have a depth axis (replay/step_prices.py) — and clocked on the server's slots
(replay/slots.py).
"""

from __future__ import annotations

import numba
import numpy as np

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.decoding import budget, controllers
from dspark_bench.decoding.budget import decide, draft_seconds, packed_verify
from dspark_bench.decoding.confidence import signal_of
from dspark_bench.replay.record import Record
from dspark_bench.replay.rounds import eos_positions, match_lengths, round_plans
from dspark_bench.replay.slots import admit, stamp
from dspark_bench.replay.step_prices import StepPrices, draft_row, step_depths, verify_row
from dspark_bench.replay.tables import record_depths

TOTALS = ("rounds", "drafted_total", "accepted_total", "full_blocks", "draft_forwards")  # what the walks count


def depths_for(rec: Record, prices: StepPrices) -> np.ndarray:
    """[P, N] each round's context depth where `prices` has a depth axis (zeros otherwise: one depth)."""
    return record_depths(rec).astype(np.float64) if prices.deep else np.zeros(rec.rollout.shape[:2])


@numba.njit(cache=True, nogil=True)
def _settle(keys, starts, length, live, matches, lengths, slot_p, slot_j, drafted_at,
            counts):  # pragma: no cover (compiled)
    """A budget step's rows after their verify pass: each row's accepted tokens moved on, its round
    counted (TOTALS) and noted in drafted_at, finished rows' slots freed. (tokens verified, rows leaving)."""
    tokens, leaving = 0, 0
    for r in range(len(keys)):
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
    return tokens, leaving


@numba.njit(cache=True, nogil=True)
def _walk_budget(alpha, eos_step, matches, lengths, max_new_tokens, gamma_max, min_draft_len, batch_size, refill,
                 packed_rule, rule_draft, rule_verify, at, t_draft, t_verify, depth_of, joins, drafted_at,
                 counts, arrive, first, end):  # pragma: no cover (compiled)
    """The budget schedule's walk: its rows' drafts are decided together, by `decide` after every
    draft step on the batch's fitted acceptances `alpha` [P, N, G], as the batched decoder decides
    them (with its own goodput model's tables, rule_*). Predicted seconds (padded, packed);
    drafted_at[p, j]: what the round at j drafted (left alone where no round starts); counts:
    TOTALS; arrivals and first / last tokens as batched._walk_batched's."""
    P = len(lengths)
    slot_p, slot_j = np.full(batch_size, -1), np.zeros(batch_size, np.int64)
    go = np.zeros(batch_size, dtype=np.bool_)  # decide's answer, row by row
    next_p, active, padded, packed = 0, 0, 0.0, 0.0
    while True:
        next_p, active, clock, spent = admit(slot_p, slot_j, next_p, P, active, refill, joins, padded, arrive)
        padded, packed = clock + spent, packed + (clock - padded) + spent
        if active == 0:
            return padded, packed
        live = np.flatnonzero(slot_p >= 0)  # the batch's rows (their order changes no decision)
        n = len(live)
        keys, starts = slot_p[live], slot_j[live]
        widest, mean = step_depths(depth_of, keys, starts)
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
        tokens, leaving = _settle(keys, starts, length, live, matches, lengths, slot_p, slot_j, drafted_at, counts)
        padded += steps * draft_row(at, t_draft, widest)[n] + verify_row(at, t_verify, widest, n)[length.max()]
        stamp(keys, starts, padded, first, end)
        packed += (draft_seconds(steps_with, draft_row(at, t_draft, mean), 0)
                   + packed_verify(verify_row(at, t_verify, mean, n), tokens, n))
        active -= leaving


def walk_budget(rec: Record, config: DecodeConfig, prices: StepPrices, joins: tuple,
                refill: bool = True, matches: np.ndarray | None = None, eos: np.ndarray | None = None,
                arrive: np.ndarray | None = None, first: np.ndarray | None = None,
                end: np.ndarray | None = None) -> tuple[dict, np.ndarray]:
    """One budget policy at its batch size: (its predicted times and totals, drafted_at [P, N]:
    what the round at each position drafted, -1 where no round starts), priced by `prices` (the
    cost model's tables at its B: step_prices.step_prices) and deciding with its own goodput
    model's; each request's admission as `joins` prices it (slots.admit: step_prices.admissions,
    or slots.unpriced); arrivals and first / last tokens as batched.walks'."""
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
                                  refill, rule.packed, rule.t_draft, rule.t_verify, prices.at, prices.draft,
                                  prices.verify, depths_for(rec, prices), joins, drafted_at, counts, arrive, first,
                                  end)
    totals = dict(zip(TOTALS, counts.tolist()))
    return {"predicted_time": padded, "predicted_time_packed": packed, **totals}, drafted_at


def walk_controlled(rec: Record, config: DecodeConfig, prices: StepPrices, joins: tuple,
                    refill: bool, matches: np.ndarray, arrive: np.ndarray, first: np.ndarray,
                    end: np.ndarray, chosen: list | None = None, made: dict | None = None) -> dict:
    """One engine controller's policy at its batch size, as the batched decoder serves it: before
    each step the controller picks one length for every row (each row's round the fixed draft of
    that length there, `round_plans`), after it is fed every row's accepted count; priced as
    batched._walk_batched prices a step (padded and packed), each admission as `joins` (slots.admit).
    Its predicted times and totals (TOTALS);
    `chosen` receives each step's (rows, length picked, mean accepted); `made`: round_plans' shared plans."""
    plans, controller = round_plans(rec, config, made), controllers.start(config)
    signal, trims = rec.confidences[signal_of(config)], schedules.of(config).priced
    B, P, depth_of = config.batching.batch_size, len(rec.lengths), depths_for(rec, prices)
    slot_p, slot_j = np.full(B, -1), np.zeros(B, np.int64)
    counts = np.zeros(len(TOTALS), dtype=np.int64)
    next_p, active, padded, packed = 0, 0, 0.0, 0.0
    while True:
        next_p, active, clock, spent = admit(slot_p, slot_j, next_p, P, active, refill, joins, padded, arrive)
        padded, packed = clock + spent, packed + (clock - padded) + spent
        if active == 0:
            return {"predicted_time": padded, "predicted_time_packed": packed, **dict(zip(TOTALS, counts.tolist()))}
        picked = controller.steps(active)
        drafted, forwards = plans[picked][:2]
        rows, starts = slot_p.copy(), slot_j.copy()
        widest, mean = step_depths(depth_of, rows, starts)
        stepped = [(s, slot_p[s], slot_j[s]) for s in range(B) if slot_p[s] >= 0]
        lengths = np.array([drafted[p, j] for _, p, j in stepped])
        if trims:  # vLLM's adaptive verification may verify fewer than were drafted (controllers.Controller.admit)
            lengths = np.array(controller.admit([p for _, p, _ in stepped], [
                signal[p, j, : drafted[p, j]].astype(np.float64).tolist() for _, p, j in stepped]), dtype=np.int64)
        spent_forwards = np.array([forwards[p, j] for _, p, j in stepped])
        accepted = np.minimum(lengths, [matches[p, j] for _, p, j in stepped])
        counts += (len(stepped), lengths.sum(), accepted.sum(), (accepted == lengths).sum(), spent_forwards.sum())
        draft_wide, draft_mean = draft_row(prices.at, prices.draft, widest), draft_row(prices.at, prices.draft, mean)
        padded += spent_forwards.max() * draft_wide[active] + verify_row(prices.at, prices.verify, widest,
                                                                        active)[lengths.max()]
        stamp(rows, starts, padded, first, end)
        packed += sum(draft_mean[(spent_forwards >= step).sum()] for step in range(1, spent_forwards.max() + 1))
        packed += packed_verify(verify_row(prices.at, prices.verify, mean, active), int((lengths + 1).sum()), active)
        controller.observe(accepted.tolist(), lengths.tolist())
        if chosen is not None:
            chosen.append((active, float(lengths.mean()) if trims else picked,
                           float(accepted.mean())))  # vLLM's: the mean length it verified of the K drafted
        for (s, p, j), a in zip(stepped, accepted):
            slot_j[s] = j + a + 1
            if slot_j[s] >= rec.lengths[p]:
                slot_p[s], active = -1, active - 1

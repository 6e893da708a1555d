"""The load-aware verify budget ("budget"): a batch schedule deciding for all rows at once.

The goodput schedule (goodput.py) asks, row by row, whether one more draft token raises that
row's tokens per second. In a batch the rows share each draft step and each verify pass, so what
a row's next token costs depends on the others: in the padded layout (the batched decoder here) a
pass costs what its longest row costs, so once any row drafts on the others' next tokens are
free; in the packed layout (vLLM, SGLang, TensorRT-LLM) a pass costs what its total token count
costs, so every token is paid for. After every draft step of a round the budget schedule takes
the whole batch's expected output and cost, each row i with E_i = 1 + P_i1 + … (goodput's
calibrated survival products, from the acceptance fit or the learned signal) and the gain of its
next token g_i = P_i · α_i (goodput's guess that the next token is accepted as often as this
one), and picks the rows that draft on to maximise

    Σ E_i (+ the chosen rows' g_i)  /  the round's cost (+ one more draft step and their tokens)

under the cost surface at the batch's row count (the monotone tables of cost.py):

    padded: every drafting row goes on, or none (the extra tokens of the others cost nothing)
            — on if  (E + Σ g) / ((s + 1) t_draft(b) + t_verify(b, s + 1))  >  E / (s t_draft(b) + t_verify(b, s));
    packed: the drafting rows ranked by g (ties: the earlier prompt first), the prefix of the
            ranking (possibly none) that gives the highest rate, the draft step costing
            t_draft(rows drafting) and the verify t_verify(b, tokens / b − 1), interpolated.

Rows with at most min_draft_len tokens always go on, as under goodput. At one row both rules are
goodput's, term for term (a test holds them to it). One function (`decide`, compiled by numba)
makes the decision in the batched decoder (decoding/batched.py) and in replay's walk of its own
(replay/batched.py), over the same float64 values in the same order — sums over rows are taken
over sorted values, so a batch's row order cannot change a decision — and so replay predicts the
decoder's rounds exactly.
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from dspark_bench import schedules
from dspark_bench.decoding import goodput
from dspark_bench.errors import DsparkError


def cost_tables(costs: dict[int, tuple[float, tuple[float, ...]]], batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(t_draft[b], t_verify[b, k]) for b = 0 .. batch_size rows (a draining batch has fewer) from
    step costs timed at some batch sizes (B -> (t_draft, t_verify)): linear in b between them,
    non-decreasing in b and k; row 0 is unused. A pass over more tokens or rows never costs less;
    a measured median that says so is noise, and would let a rule prefer a length for it."""
    measured = sorted(costs)
    if batch_size > measured[-1]:
        raise DsparkError(f"the cost surface was timed up to batch size {measured[-1]}, not {batch_size}; "
                          "measure it again")
    rows = np.arange(batch_size + 1)
    draft = np.interp(rows, measured, [costs[b][0] for b in measured])
    depth = min(len(costs[b][1]) for b in measured)
    verify = np.stack([np.interp(rows, measured, [costs[b][1][k] for b in measured]) for k in range(depth)], axis=1)
    return np.maximum.accumulate(draft), np.maximum.accumulate(np.maximum.accumulate(verify, axis=1), axis=0)


@numba.njit(cache=True, nogil=True)
def sorted_sum(values):  # pragma: no cover (compiled)
    """Σ values, over the values sorted: the same float whatever order the rows are in."""
    total = 0.0
    for value in np.sort(values):
        total += value
    return total


@numba.njit(cache=True, nogil=True)
def packed_verify(t_verify_b, tokens, rows):  # pragma: no cover (compiled)
    """A packed pass over `tokens` tokens of `rows` rows: the padded pass holding them evenly."""
    G = len(t_verify_b) - 1
    k = min(tokens / rows - 1.0, G)
    low = int(k)
    high = min(low + 1, G)
    return t_verify_b[low] + (k - low) * (t_verify_b[high] - t_verify_b[low])


@numba.njit(cache=True, nogil=True)
def draft_seconds(steps_with, t_draft, extra):  # pragma: no cover (compiled)
    """Σ_m (draft steps that ran m rows) · t_draft(m), with one more step of `extra` rows (0: none):
    a count times a cost, so that one row's k steps cost k · t_draft, as goodput prices them."""
    spent = 0.0
    for m in range(1, len(steps_with)):
        count = steps_with[m] + (m == extra)
        if count > 0:
            spent += count * t_draft[m]
    return spent


@numba.njit(cache=True, nogil=True)
def decide(expected, gain, key, candidate, forced, length, steps_with, steps, packed, t_draft, t_verify,
           go):  # pragma: no cover
    """After draft step `steps` of a round: which of the batch's rows draft another token, written
    into `go` (bool[n]). An out-argument, not a returned array: numba's conversion of a returned
    array back to Python failed once in a long sweep ("NRT_adapt_ndarray_to_python: descr is NULL").

    Per row: expected output E_i, gain of its next token g_i, a tie-break key (its prompt's
    index), whether it can draft on (`candidate`: it drafted this step, short of its limit and of
    EOS), whether it must (`forced`), and its length so far; `steps_with[m]`: the round's draft
    steps so far that ran m rows. t_draft / t_verify: the cost tables (`cost_tables`)."""
    n = len(expected)
    go[:] = False
    if not candidate.any():
        return
    forced = forced & candidate
    b = n  # the rows this round's passes hold
    total = sorted_sum(expected)
    if not packed:
        longest = length.max()
        now = total / (steps * t_draft[b] + t_verify[b, longest])
        then = (total + sorted_sum(gain[candidate])) / ((steps + 1) * t_draft[b] + t_verify[b, steps + 1])
        if forced.any() or then > now:
            go[:] = candidate
        return
    tokens = 0
    for i in range(n):
        tokens += length[i] + 1
    must = np.flatnonzero(forced)
    free = np.flatnonzero(candidate & ~forced)
    # The free rows by gain, highest first; equal gains: the earlier prompt first.
    free = free[np.argsort(key[free], kind="mergesort")]
    free = free[np.argsort(-gain[free], kind="mergesort")]  # stable: equal gains keep the prompts' order
    value = total + sorted_sum(gain[must])
    best, chosen = -1.0, -1
    if len(must) == 0:  # stopping every row is an option
        best = total / (draft_seconds(steps_with, t_draft, 0) + packed_verify(t_verify[b], tokens, b))
    for m in range(len(free) + 1):
        if m > 0:
            value += gain[free[m - 1]]
        rows = len(must) + m
        if rows == 0:
            continue
        cost = draft_seconds(steps_with, t_draft, rows) + packed_verify(t_verify[b], tokens + rows, b)
        if value / cost > best:
            best, chosen = value / cost, m
    go[must] = True
    if chosen > 0:
        go[free[:chosen]] = True


class BudgetRule:
    """A budget policy's curve and cost tables at its batch size: one decision per draft step over
    the batch's proposals (proposal.Proposal tracks survival and expected output as under goodput,
    and the alpha of its last token)."""

    def __init__(self, model: goodput.GoodputModel, metric: str, batch_size: int, layout: str, min_draft_len: int):
        self.curve = model.rule(metric, 1).curve
        self.t_draft, self.t_verify = cost_tables(model.costs, batch_size)
        self.packed = layout == "packed"
        self.min_draft_len = min_draft_len

    def decide(self, proposals, keys, candidate, steps_with: np.ndarray, steps: int) -> np.ndarray:
        """Which rows draft on; `candidate`: the rows that could (bool per proposal), `keys` their prompts' indexes."""
        expected = np.array([p.expected for p in proposals], dtype=np.float64)
        gain = np.array([p.survival * p.alpha for p in proposals], dtype=np.float64)
        length = np.array([len(p.tokens) for p in proposals], dtype=np.int64)
        go = np.zeros(len(proposals), dtype=np.bool_)
        decide(expected, gain, np.asarray(keys, dtype=np.int64), np.asarray(candidate, dtype=np.bool_),
               length <= self.min_draft_len, length, steps_with, steps, self.packed, self.t_draft, self.t_verify, go)
        return go


def rule_for(config) -> BudgetRule:
    """The rule a budget policy decides with at its batch size (cached)."""
    p = config.stopping
    return _rule(p.goodput_model, p.metric, config.batching.batch_size, p.budget_layout, p.min_draft_len)


@functools.lru_cache(maxsize=64)
def _rule(path: str, metric: str, batch_size: int, layout: str, min_draft_len: int) -> BudgetRule:
    return BudgetRule(goodput.load(path), metric, batch_size, layout, min_draft_len)


def alone(config) -> goodput.GoodputRule:
    """What the budget schedule is with one row: goodput's rule on the cost tables at b = 1 (the
    batch-1 decoder and batch-1 replay decide with it). The tables are the timings' monotone
    envelope, so where a measured t_verify(k) dips this decides otherwise than goodput itself."""
    return _alone(config.stopping.goodput_model, config.stopping.metric)


@functools.lru_cache(maxsize=64)
def _alone(path: str, metric: str) -> goodput.GoodputRule:
    model = goodput.load(path)
    t_draft, t_verify = cost_tables(model.costs, 1)
    return goodput.GoodputRule(model.rule(metric, 1).curve, float(t_draft[1]), tuple(map(float, t_verify[1])))


def row_rule(config) -> goodput.GoodputRule:
    """The per-row rule of a goodput or budget policy: what decides a row drafting alone."""
    return alone(config) if schedules.of(config).whole_batch else goodput.rule_for(config)

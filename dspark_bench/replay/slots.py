"""A batched server's slots, as every batched walk fills and clocks them (replay/batched.py,
replay/joint_walks.py): requests admitted into free slots in order as they arrive, each paying its
own prefill and the copy of the batch's caches it is spliced into, and each request's first and
latest token stamped on the walk's clock.
"""

from __future__ import annotations

import numba
import numpy as np


def unpriced(requests: int) -> tuple:
    """`admit`'s `joins` for a walk that prices its steps only: no prefill, no splice."""
    zeros = np.zeros(requests)
    return zeros, zeros, 0.0


@numba.njit(cache=True, nogil=True)
def spliced(rows, widest, tokens):  # pragma: no cover (compiled)
    """Positions of the batch's caches a joining row's cache is spliced into (decoding/batch_lm.add
    copies every layer's keys and values of the `rows` already there, each as wide as the widest
    row's context or the new row's `tokens`, whichever is more): what StepTerms.join_slots prices."""
    return rows * max(widest, tokens)


@numba.njit(cache=True, nogil=True)
def admit(slot_p, slot_j, next_p, P, active, refill, joins, clock, arrive):  # pragma: no cover (compiled)
    """Fill free slots, in order, from the requests that have arrived by the clock (`arrive`: each
    request's arrival, all 0 when every prompt waits at the start), each paying its own admission
    one after another, as the batched decoder admits them (one arriving meanwhile joins too): `joins`
    is (each request's prefill seconds, its prompt's tokens, seconds per `spliced` position), so
    a request joining a wide batch of long rows pays for copying their caches. An empty server
    first waits for the next arrival. Returns (next request, active rows, the clock once done
    waiting, the admissions' seconds): with no wait the clock is `clock` itself, so a walk without
    arrivals adds what it always added."""
    prefill, prompt, per_slot = joins
    if active == 0 and next_p < P and arrive[next_p] > clock:
        clock = arrive[next_p]  # idle until the next request arrives
    spent = 0.0
    if refill or active == 0:
        for s in range(len(slot_p)):
            if slot_p[s] < 0 and next_p < P and arrive[next_p] <= clock + spent:
                cost = prefill[next_p]
                if per_slot != 0.0:
                    widest = 0.0  # a row's context: its prompt and what it has made so far
                    for r in range(len(slot_p)):
                        if slot_p[r] >= 0:
                            widest = max(widest, prompt[slot_p[r]] + slot_j[r])
                    cost += per_slot * spliced(active, widest, prompt[next_p] - 1)
                slot_p[s], slot_j[s] = next_p, 0
                spent += cost
                next_p += 1
                active += 1
    return next_p, active, clock, spent


@numba.njit(cache=True, nogil=True)
def stamp(rows, starts, clock, first, end):  # pragma: no cover (compiled)
    """After a step ends at `clock`: the first token of each row that started there (`starts` 0),
    and the latest token of every row (its last step's is its end)."""
    for r in range(len(rows)):
        if rows[r] >= 0:
            if starts[r] == 0:
                first[rows[r]] = clock
            end[rows[r]] = clock

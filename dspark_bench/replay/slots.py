"""A batched server's slots, as every batched walk fills and clocks them (replay/batched.py,
replay/joint_walks.py): requests admitted into free slots in order as they arrive, each paying its
own prefill, and each request's first and latest token stamped on the walk's clock.
"""

from __future__ import annotations

import numba


@numba.njit(cache=True, nogil=True)
def admit(slot_p, slot_j, next_p, P, active, refill, prefill, clock, arrive):  # pragma: no cover (compiled)
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
def stamp(rows, starts, clock, first, end):  # pragma: no cover (compiled)
    """After a step ends at `clock`: the first token of each row that started there (`starts` 0),
    and the latest token of every row (its last step's is its end)."""
    for r in range(len(rows)):
        if rows[r] >= 0:
            if starts[r] == 0:
                first[rows[r]] = clock
            end[rows[r]] = clock

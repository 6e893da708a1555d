"""Replay: every greedy policy's outcome from one recorded decoding pass, and what it costs.

The record (`record`: the target's greedy continuation and the drafter's rollout at every
position), the simulation of policies over it at batch size 1 (`simulate`) and at any batch
size in either layout (`batched`), this machine's cost model and cost surface (`cost`), the
acceptance fit the goodput schedule decides with (`acceptance`), and the learned acceptance
signal's fit (`learned`). Studies of a finished record (the headroom, better signals, held-out
signal quality) are the `analysis` layer's, above this one.

May import: `decoding` and the core modules. Nothing here times whole runs, sweeps or reports.
"""

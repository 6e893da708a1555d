"""Replay: every greedy policy's outcome from one recorded decoding pass, and what it costs.

The record (`record`: the target's greedy continuation and the drafter's rollout at every
position), the simulation of policies over it at batch size 1 (`simulate`) and at any batch
size in either layout (`batched`), this machine's cost model and cost surface (`cost`), the
acceptance fit the goodput schedule decides with (`acceptance`), the headroom no stopping
rule can beat (`oracle`) and what better signals would take of it (`signal_headroom`), and
the learned acceptance signal's fit with every signal's held-out quality (`learned`).

May import: `decoding` and the core modules. Nothing here times whole runs, sweeps or reports.
"""

"""Replay: every policy's outcome from recorded decoding, greedy or sampled, and what it costs.

The greedy record (`record`: the target's greedy continuation and the drafter's rollout at every
position), made from the target decoded here or from an engine's continuations file
(`continuations`), a prompt at a time, resumably and in shards (`record_parts`); the sampled record
and replay under sampling (`sampled`: K sampled paths per prompt, replicates on shared coins,
expectations with intervals); the simulation of policies at batch size 1 (`simulate`) and at any
batch size in either layout (`batched`), and the tables their totals become, per policy and per
depth bucket (`tables`); the cost model and cost surface (`cost`, and timed beside running decodes
in `beside`, or inside them in `in_decode`),
replay under load (`load`: requests arriving at a rate or by a trace, `arrivals`,
served by continuous batching) and the cost-model file that carries anyone's costs with their
provenance (`cost_file`); the acceptance fit the goodput schedule decides with (`acceptance`); the
learned acceptance signal's fit (`learned`); and timed replay (`timed`), a policy's replayed rounds
run on real passes, so that their time checks the prices alone. Studies of a finished record (the
headroom, better signals, held-out signal quality) are the `analysis` layer's, above this one.

May import: `decoding` and the core modules. Nothing here times whole runs, sweeps or reports.
"""

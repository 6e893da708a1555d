"""Replay: every policy's outcome computed from records and cost models, greedy or sampled.

The greedy record (`record`: the target's greedy continuation and the drafter's rollout at every
position, saved and read back; the target's half may come from an engine's continuations file,
`continuations`); the sampled record and replay under sampling (`sampled`: K sampled paths per
prompt, replicates on shared coins, expectations with intervals); what fixes a round at each
position for a policy (`rounds`), the simulation of policies at batch size 1 (`simulate`) and at
any batch size in either layout (`batched`; the walks whose rows decide together, the budget's and
an engine controller's, `joint_walks`; the server's slots every batched walk fills, `slots`; each
step's prices at its rows' depths, `step_prices`), and the tables their totals become, per policy and
per depth bucket (`tables`); the cost model and the cost model over B (`cost`), replay under load
(`under_load`: requests arriving at a rate or by a trace, `arrivals`, served by continuous batching) and
the cost-model file that carries anyone's costs with their provenance (`cost_file`); the
acceptance fit the goodput schedule decides with (`acceptance`); the learned acceptance signal's
fit (`learned`). Making records and measuring cost models run the models, and are the `measure`
layer's, above this one; studies of a finished record (the headroom, better signals, held-out
signal quality) are the `analysis` layer's.

May import: `decoding` and the core modules. Nothing here imports torch, runs a model or reads a
clock (tests/test_layers.py holds it).
"""

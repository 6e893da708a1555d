"""Measure: what runs and times models, for replay to compute from.

Measuring a cost model (`cost_model`: t_draft and t_verify(k) timed between syncs at batch 1,
at every batch size B — a cost model over B — and at several context depths, each model's
prefill, the learned signal's host work); the same timed beside running decodes, a pass per turn
(`between_steps`), or inside them (`in_decode`, from the decoders' own passes timed by `pass_clock`, the
explicit clock a decode is handed); timed replay (`timed`: a policy's replayed rounds run on
real passes, so that their time checks the cost model alone); and the recording halves of
replay's records: the greedy record made from the target decoded here or an engine's
continuations and the drafter's proposals at every position (`recording`), a prompt at a time,
resumably and in shards (`record_parts`), and the sampled record's paths (`sampled_recording`).

May import: `replay`, `decoding` and the core modules. Never `tasks` or `reference`; nothing
here runs whole runs, sweeps or reports (the `harness` and `tuning` layers above do).
"""

"""Tuning: searching a policy's knobs. It only searches; engines' formats live in `engines`.

Sweep specifications (`spec`), the Optuna study behind real sweeps (`study`), what every sweep
works on (`preparation`), sweeps by grid, Optuna or replay (`sweep`; the replay side in
`replay_sweep`, its records in `records`, the policies it adds in `added_policies`, the timed
confirmation in `confirm`, the depth-keyed policy it composes in `depth_choice`, its load stage in
`under_load`), and per-domain calibration (`calibrate`, choosing with `domain_choice`).

May import: `engines`, `harness`, `analysis`, `replay`, `decoding`, `tasks`, `reference` and the
core modules; never `reporting` (a figure is drawn by the caller: calibrate's `draw`) or `cli`.
"""

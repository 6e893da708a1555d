"""Tuning: searching a policy's knobs. It only searches; engines' formats live in `engines`.

Sweep specifications (`spec`; which one a command means: `spec_files`), the Optuna study behind
real sweeps (`study`), what every sweep works on (`preparation`), sweeps by grid, Optuna or replay
(`sweep`; the replay side in `replay_sweep`, its plan and estimate in `sweep_plan`, its summary.json in
`replay_summary`, its records in
`records`, the policies it adds in `added_policies`, the timed confirmation in `confirm`), and
per-domain calibration
(`calibrate`, choosing with `domain_choice`). A sweep's optional results (the depth-keyed policy,
its load stage, sampling precision, the engine's verdict, the analyses) are `sections`, which the
replay sweep composes through their registration list.

May import: `sections`, `engines`, `harness`, `analysis`, `replay`, `decoding`, `tasks`, `reference`
and the core modules; never `reporting` (a figure is drawn by the caller: calibrate's `draw`) or `cli`.
"""

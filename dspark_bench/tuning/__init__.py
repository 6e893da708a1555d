"""Tuning: searching a policy's knobs and turning the winner into something to deploy.

Sweep specifications (`spec`), the Optuna study behind real sweeps (`study`), what every sweep
works on (`preparation`), sweeps by grid, Optuna or replay (`sweep`; the replay side in
`replay_sweep`, the policies it adds in `added_policies`), per-domain calibration
(`calibrate`, choosing with `domain_choice`), and export into a serving engine's own vocabulary
(`export`).

May import: `reporting` (a sweep draws its figures), `harness`, `analysis`, `replay`, `decoding`, `tasks`,
`reference` and the core modules; never `cli`.
"""

"""The scripts behind what docs/measurements.md states, run from the repository root as
`python -m benchmarks.<folder>.<name>` (or `bash benchmarks/<folder>/<name>.sh`); none is a test.

- `checks/`: replay and its prices held against real runs: sampled replay against real sampled runs
  (`sampled_replay`, `sampled_tiny`, `sampled_bias`), a sweep before and after a change
  (`replay_equality`, with `replay_equality.sh`), timed replay (`timed_replay`), prices inside
  running decodes (`in_decode`) and replay under load against real runs under load (`load`).
- `measurements/`: the scripts behind the measured tables of docs/ (each page cites its script).
- `gpu/`: the GPU run, one program (`python -m benchmarks.gpu`, or `bash benchmarks/gpu/gpu.sh`).
- `common`: the one argument convention every script's parser follows.

docs/measurements.md lists every check and measurement with what it shows and its command
(tests/test_links.py holds that every script here is cited from a docs page).
"""

"""Replay and its prices held against real runs (docs/measurements.md#checks-against-real-runs).

`sampled_replay` (sampled replay against our decoder's real sampled runs, shipped pair),
`sampled_tiny` (the same on the tests' tiny pair, and against exact sums), `sampled_bias` (its bias
by temperature, and what K paths buy), `replay_equality` with `replay_equality.sh` (a sweep at a
commit and in the working tree replay alike), `timed_replay` (a record's rounds forced through real
models against replay's prediction), `in_decode` (prices timed alone and inside running decodes,
each against our decoder) and `load` (replay under load against real runs under load).
"""

"""Harness: loading models, timing decoders over prompts, and running a whole run.

Model pairs (`models`), the timing runner (`runner`: warm-up, interleaved baseline and
speculative decodes, one row per sample), plans and estimates said before a job starts (`plan`),
a run's configuration and its execution into a run folder (`run`), the calibration file a run
decodes with (`calibration_file`), and training multi-token heads on a target (`train_heads`).

May import: `replay`, `decoding`, `tasks`, `reference` and the core modules; never `tuning`,
`reporting` or `cli`.
"""

"""Harness: loading models, timing decoders over prompts, and running a whole run.

Model pairs (`models`), the timing runner (`runner`: warm-up, interleaved baseline and
speculative decodes), a run's rows, one per sample (`samples`), plans and estimates said before a
job starts (`plan`), the workload a run and a sweep share (`workload`), a run's configuration and
its execution into a run folder (`run`), the timing-health checks every run and sweep makes of its
own timings (`health`), paired verdicts against the best fixed γ and the precision loop
(`verdicts`), `run --decoder hf` priced on HF's own costs (`hf_cost_model`), the calibration file a
run decodes with (`calibration_file`), training multi-token heads on a target (`train_heads`), a
pair as GGUF files for llama.cpp (`gguf`), GGUF model files opened as cached HF folders
(`gguf_read`), a run's rounds and prompts cut by context depth (`depth_breakdown`), a real run
under load, the batched decoder serving requests as they arrive (`under_load`), `run --arrival-rate`
serving a load beside replay's prediction into a run folder (`served_run`), and the prices timed
inside running decodes that replay charges by default (`in_decode`), and the process's allocator
set before any model loads (`allocator`: freed memory kept mapped).

May import: `measure`, `analysis`, `replay`, `decoding`, `tasks`, `reference` and the core modules; never `tuning`,
`reporting`, `engines` or `cli`.
"""

"""The GPU run (issue 47): `python -m benchmarks.gpu` (`__main__`: its arguments, plan and stage loop),
or `bash benchmarks/gpu/gpu.sh` from anywhere. docs/gpu.md says what it proves and what it measured.

`stages` (each stage, on a shared Context), `checks` (the correctness and sync stages), `prices`
(a realistic-size pair built on the device, its step prices and cost-model files), `speed` (the
shipped pair's decoders timed), `report` (the table, gpu-table.md); `shapes.json` (the priced pairs'
shapes) and `inputs/` (what a device run reads, made on a CPU and committed).
"""

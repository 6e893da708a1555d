"""The scripts behind docs' measured tables (docs/measurements.md#the-scripts-behind-the-tables).

`bar`, `baseline_vs_generate`, `collect_policy`, `replay_reference`, `simulate_speed` and
`reference_pair.sh` (the shipped reference pair, every number at once), `budget` and `concurrency`
(batch sizes), `depth` (the context axis), `drafters`, `goodput`, `host_syncs` (host syncs per
round), `paired` (a sweep's headline sharpened), `record_from_continuations`, `repeatability`
(timing health), `sampled_speed` (what sampled replay costs), `temperature_verdict` (greedy- against
sampled-tuned), `llamacpp.sh` and `engine_prices.sh` (llama.cpp run for real, and its prices).
"""

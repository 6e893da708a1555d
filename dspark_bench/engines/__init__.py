"""Engines: everything we know about serving engines (llama.cpp, vLLM, SGLang, TensorRT-LLM, HF).

Their own file formats (`files`: each engine's config rendered and parsed back), the versions a
file is written for and the source lines that fix their meaning (`versions`), export of a tuned
policy in an engine's vocabulary (`export`; the run's policies it reads, `run_policies`), and
llama.cpp run for real: its `llama-server` found, started, queried and always stopped
(`llama_server`), `run --decoder llamacpp` beside our decoder and replay (`llamacpp_run`), its own
prices measured (`llamacpp_prices`), a sweep's best confirmed in it (`llamacpp_confirm`), and the
target's continuations written by an engine or by our decoder (`continuations`); what they lend a
sweep priced on an engine's costs, per engine (`registry`); and what a deployed engine counted of
its speculation, read from its Prometheus counters (`counters`) per draft position, with the draft
length its counters advise (`observed`: `dspark-bench observe`), held against replay's prediction
for the deployed policy (`drift`) once the engine is known to serve the sweep's target (`served`);
a policy's acceptance profile for the engines' simulators, and each domain's of a calibration
(`profiles`: `dspark-bench profile`, `calibrate`).

Below the search: `tuning` knows engines only through this layer. May import `harness` (the
pair, its GGUF files, the runner), `analysis`, `replay`, `decoding`, `tasks`, `reference` and the
core modules; never `tuning`, `reporting` or `cli`.
"""

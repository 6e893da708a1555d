"""Serving engines run for real, beside our decoder: llama.cpp's `llama-server`.

The top layer under the CLI. `llama_server` finds, starts, queries and always stops a server;
`llamacpp_run` runs one exported policy on llama.cpp and on our engine, each interleaved with
its own plain decoder, beside replay's prediction. May import everything below it (tuning for
the exported flags, harness for the pair, the prompts and the pair's GGUF files, replay for the
prediction).
"""

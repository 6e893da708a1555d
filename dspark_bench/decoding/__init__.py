"""Decoding: everything one decode step needs, and the decoders built from it.

The shared types of a decode (`types`: Round, DecodeResult, Block, the PassClock a decode may be
timed by), our speculative decoder at batch size 1 (`speculative`) and batched with continuous
batching (`batched`), the plain autoregressive and HF-assisted decoders it is measured against
(`autoregressive`), the drafters (`drafters`: the draft model, `heads`, `lookup`), the KV caches
(`cached_lm`, `batch_lm`; the batched one static, for captured passes: `static_batch_lm`), which
passes run from captured CUDA graphs (`capture`), sampling (`sampling`), confidence metrics
(`confidence`; the learned signal, `learned_signal`), stopping and engine rules as decoders run them (`rules`),
the budget schedule deciding for a whole batch (`budget`), the engines' own draft-length
controllers, whose state runs on across rounds and requests (`controllers`), the goodput rule and its acceptance
curves (`goodput`, with `as_numpy` for device math that rounds as the host does), a round's
draft under the host's rule (`proposal`), and every device-to-host read and clock synchronisation
(`host`).

May import: only the core modules at the top of the package (config, errors, results, ...);
never `tasks` or `reference`. Nothing here knows about replay, sweeps or reports; a decode is
timed only by the clock it is handed (`types.PassClock`, measure/pass_clock.py).
"""

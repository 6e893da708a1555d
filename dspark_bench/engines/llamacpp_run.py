"""`run --decoder llamacpp`: one policy on llama.cpp and on our engine, side by side, on one pair.

The policy is turned into llama-server flags by the function `export --format llamacpp` writes
with (for the build that runs), so what is measured here is what an export deploys. Four
decoders run the same prompts as the same token ids:

- llama.cpp speculative (the exported flags) against llama.cpp plain (the target alone), the two
  servers taking turns request by request, as our runner interleaves (A B, then B A);
- our engine against our baseline (harness.runner, the usual run folder);
- replay's prediction of the policy under llama.cpp's rule, on a record of these prompts.

What llama.cpp did comes from each response's `timings` (`draft_n`, `draft_n_accepted`,
predicted tokens per second) and the change of the server's counters over the request
(verification steps and plain decode calls: its rounds). Every llama.cpp output is compared with
the target's own greedy output (our baseline). Results go into the run folder as
`llamacpp.parquet` (one row per prompt) and `llamacpp.json`.
"""

from __future__ import annotations

import dataclasses
import signal
import statistics
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.schedule import expressible
from dspark_bench.engines.llama_server import LlamaServer, build_info, check_port_free, find_server
from dspark_bench.errors import DsparkError
from dspark_bench.harness.gguf import cached_gguf
from dspark_bench.harness.run import RunConfig, execute, plan_run
from dspark_bench.harness.runner import stage_steps
from dspark_bench.metrics import rates, summarize
from dspark_bench.prompts import encode
from dspark_bench.replay.record import record
from dspark_bench.replay.simulate import simulate
from dspark_bench.results import check_writable, write_json, write_parquet
from dspark_bench.tuning.engine_files import llamacpp_flags
from dspark_bench.tuning.engine_versions import LLAMACPP_CURRENT, llamacpp_version


def check_policy(configs: list[DecodeConfig]) -> DecodeConfig:
    """The one greedy, batch-1, draft-model policy llama.cpp can run exactly."""
    if len(configs) != 1:
        raise DsparkError(f"--decoder llamacpp runs one policy; this run has {len(configs)} (one --threshold, "
                          "--gamma-max, --min-draft-len each)")
    config = configs[0]
    if config.drafting.drafter != "model":
        raise DsparkError(f"--decoder llamacpp drafts with the draft model, not {config.drafting.drafter}")
    if config.batching.batch_size != 1:
        raise DsparkError("--decoder llamacpp runs at batch size 1 (one server slot)")
    if not config.greedy:
        raise DsparkError("--decoder llamacpp compares greedy outputs: drop --temperature")
    reasons = expressible(config, "llamacpp")
    if reasons:
        raise DsparkError(f"llama.cpp cannot run {config.label()}: it needs {'; '.join(reasons)} "
                          "(use --semantics llamacpp --metric top1 --schedule threshold, or --schedule fixed)")
    return config


@contextmanager
def stopped_on_sigterm():
    """SIGTERM ends the run as Ctrl-C does, so the servers' `with` blocks stop them."""
    def stop(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def execute_llamacpp(config: RunConfig, out: Path, progress=None, say=None, server: str | None = None,
                     port: int | None = None, gguf_dtype: str = "f32") -> tuple[Path, pd.DataFrame, pd.DataFrame]:
    """Run `config`'s one policy on llama.cpp and on our engine; returns (run folder, our table, the
    side-by-side table)."""
    if config.ignore_eos:
        raise DsparkError("--decoder llamacpp cannot ignore EOS as ours does (llama-server bans the token instead, "
                          "so the outputs part there); drop --ignore-eos")
    check_writable(out)  # before models load and servers start: the cheap checks first
    binary = find_server(server)
    for taken in (() if port is None else (port, port + 1)):
        check_port_free(taken)
    build = build_info(binary)
    # A build without its number (built outside git: "build 0") is taken to be current: an older
    # one refuses the current flags at start, and that line is what the user sees.
    version = llamacpp_version(f"b{build['build_number']}") if build["build_number"] else LLAMACPP_CURRENT
    planned = plan_run(config)
    policy = check_policy(planned.configs)
    pair, settings = planned.pair, config.settings()
    eos = settings.eos_ids(pair)
    if len(eos) > 1:
        raise DsparkError(f"the target stops at {len(eos)} EOS ids; a GGUF file names one, so llama.cpp would stop "
                          "elsewhere: --decoder llamacpp needs a pair with one")
    prompt_ids = [encode(pair.tokenizer, p.text, settings.chat_template) for p in planned.prompts]
    if say:
        say(f"llama.cpp b{build['build_number']} ({binary}); converting the pair to GGUF ({gguf_dtype}, cached)")
    target_file = cached_gguf(pair.target, pair.tokenizer, pair.fingerprints[0], gguf_dtype)
    draft_file = cached_gguf(pair.draft, pair.tokenizer, pair.fingerprints[1], gguf_dtype)
    flags = llamacpp_flags(policy, str(draft_file), version)
    context = max(len(ids) for ids in prompt_ids) + policy.verification.max_new_tokens + policy.stopping.gamma_max + 8
    threads = config.threads or None
    with stopped_on_sigterm(), ExitStack() as servers:
        plain = servers.enter_context(LlamaServer(binary, target_file, [], threads, context, port, "llama-server (plain)"))
        spec = servers.enter_context(LlamaServer(binary, target_file, flags, threads, context,
                                                 None if port is None else port + 1, "llama-server (speculative)"))
        tokenized = [plain.tokenize(pair.tokenizer.decode(ids)) == ids for ids in prompt_ids]
        rows = served(plain, spec, planned.prompts, prompt_ids, policy, settings.repeats,
                      stage_steps(progress, "llama.cpp", len(prompt_ids)))
    # Our side is an ordinary run (its folder, its health checks); llamacpp.json marks it.
    folder, ours = execute(dataclasses.replace(config, decoder="ours"), out, progress, say, planned)
    table = side_by_side(pair, prompt_ids, policy, eos, rows, ours.iloc[0], tokenized,
                         stage_steps(progress, "replay record", len(prompt_ids)))
    info = {"build": build, "binary": str(binary), "engine_version": version.name, "flags": flags,
            "argv": {"plain": plain.argv, "speculative": spec.argv}, "gguf": {"target": str(target_file),
            "draft": str(draft_file), "dtype": gguf_dtype}, "tokenized_identically": int(sum(tokenized)),
            "prompts": len(prompt_ids), "policy": policy.to_dict(), "table": table.to_dict(orient="records")}
    write_parquet(folder / "llamacpp.parquet", rows)  # beside our run's own files; llamacpp.json marks the folder
    write_json(folder / "llamacpp.json", info)
    return folder, ours, table


def served(plain: LlamaServer, spec: LlamaServer, prompts, prompt_ids, policy: DecodeConfig, repeats: int,
           progress=None) -> pd.DataFrame:
    """Each prompt on both servers, interleaved (A B, then B A); one row per prompt, medians of the times."""
    for server in (plain, spec):  # warm-up: the first request pays for allocations
        server.complete(prompt_ids[0], policy.verification.max_new_tokens)
    rows = []
    for p, (prompt, ids) in enumerate(zip(prompts, prompt_ids)):
        answers = {"plain": [], "spec": []}
        for repeat in range(max(repeats, 1)):
            order = ("plain", "spec") if (repeat + p) % 2 == 0 else ("spec", "plain")
            for side in order:
                server = plain if side == "plain" else spec
                answers[side].append(server.complete(ids, policy.verification.max_new_tokens))
        rows.append(prompt_row(prompt, answers))
        if progress:
            progress()
    return pd.DataFrame(rows)


def prompt_row(prompt, answers: dict) -> dict:
    """What both servers did on one prompt (the counts from the last answer: greedy repeats agree)."""
    spec, plain = answers["spec"][-1], answers["plain"][-1]
    timings, counters = spec["timings"], spec["counters"]
    drafted, accepted = int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
    tokens, plain_tokens = list(spec["tokens"]), list(plain["tokens"])
    # Rounds: the target's decode calls (the prompt's, which emits the first token, each verification,
    # each plain step); the draft model's calls are not among them. So tokens = rounds + accepted, as ours.
    if "n_decode_total" not in counters:
        raise DsparkError("llama-server's /metrics has no n_decode_total counter: this build cannot be compared")
    rounds = int(counters["n_decode_total"])
    return {
        "prompt_id": prompt.id, "category": prompt.category, "new_tokens": len(tokens),
        "baseline_new_tokens": len(plain_tokens), "drafted_total": drafted, "accepted_total": accepted,
        "emitted_total": len(tokens), "rounds": rounds, "full_blocks": np.nan,
        "verifications": int(counters.get("spec_decode_num_drafts_total", 0)),
        "spec_time_s": statistics.median(a["wall_s"] for a in answers["spec"]),
        "baseline_time_s": statistics.median(a["wall_s"] for a in answers["plain"]),
        "spec_predicted_per_second": statistics.median(a["timings"]["predicted_per_second"] for a in answers["spec"]),
        "baseline_predicted_per_second": statistics.median(a["timings"]["predicted_per_second"] for a in answers["plain"]),
        "tokens": tokens, "plain_tokens": plain_tokens,
    }


def side_by_side(pair, prompt_ids, policy: DecodeConfig, eos, rows: pd.DataFrame, ours: pd.Series,
                 tokenized: list[bool], progress=None) -> pd.DataFrame:
    """Per prompt and overall: llama.cpp's acceptance and rounds beside replay's, and who matches the target."""
    targets = [autoregressive_decode(pair.target, ids, policy, eos).tokens for ids in prompt_ids]
    rec = record(pair, prompt_ids, policy.verification.max_new_tokens, policy.stopping.gamma_max, eos_ids=eos,
                 continuations=targets, progress=progress)
    predicted = simulate(rec, policy)
    rows["identical_to_target"] = [list(t) == list(g) for t, g in zip(rows["tokens"], targets)]
    rows["plain_identical_to_target"] = [list(t) == list(g) for t, g in zip(rows["plain_tokens"], targets)]
    rows["tokenized_identically"] = tokenized
    rows["replay_drafted"] = [sum(r.drafted for r in rounds) for rounds in predicted]
    rows["replay_accepted"] = [sum(r.accepted for r in rounds) for rounds in predicted]
    rows["replay_rounds"] = [len(rounds) for rounds in predicted]
    rows["replay_tokens"] = [sum(r.emitted for r in rounds) for rounds in predicted]
    rows["acceptance_rate"] = rows["accepted_total"] / rows["drafted_total"].replace(0, np.nan)
    rows["replay_acceptance_rate"] = rows["replay_accepted"] / rows["replay_drafted"].replace(0, np.nan)
    llama = summarize(rows.assign(config_id=0, config_label=policy.label())).iloc[0]
    replayed = rates({"rounds": rows["replay_rounds"].sum(), "drafted_total": rows["replay_drafted"].sum(),
                      "accepted_total": rows["replay_accepted"].sum(), "emitted_total": rows["replay_tokens"].sum(),
                      "full_blocks": 0})
    line = lambda name, speedup, low, high, acceptance, per_round, draft, identical: {  # noqa: E731
        "decoder": name, "speedup": speedup, "speedup_low": low, "speedup_high": high, "acceptance_rate": acceptance,
        "tokens_per_round": per_round, "avg_draft_len": draft, "identical": identical}
    return pd.DataFrame([
        line("llama.cpp speculative vs llama.cpp plain", llama["speedup"], llama["speedup_low"], llama["speedup_high"],
             llama["acceptance_rate"], llama["tokens_per_round"], llama["avg_draft_len"],
             f"{int(rows['identical_to_target'].sum())}/{len(rows)}"),
        line("our engine vs our baseline", ours["speedup"], ours["speedup_low"], ours["speedup_high"],
             ours["acceptance_rate"], ours["tokens_per_round"], ours["avg_draft_len"],
             f"{int(round(ours['identical_to_baseline'] * len(rows)))}/{len(rows)}"
             if "identical_to_baseline" in ours else ""),
        line("replay, llama.cpp's rule (predicted)", np.nan, np.nan, np.nan, replayed["acceptance_rate"],
             replayed["tokens_per_round"], replayed["avg_draft_len"], ""),
    ])


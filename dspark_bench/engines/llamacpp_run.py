"""`run --decoder llamacpp`: each policy on llama.cpp and on our decoder, side by side, on one pair,
with replay's prediction of it priced on llama.cpp's costs and on ours.

Each policy is turned into llama-server flags by the function `export --format llamacpp` writes
with (for the build that runs), so what is measured here is what an export deploys. On the same
prompts as the same token ids:

- llama.cpp speculative (the exported flags) against llama.cpp plain (the target alone), the two
  servers taking turns request by request, as our runner interleaves (A B, then B A); one
  speculative server per policy, one plain server throughout;
- our decoder against our baseline (harness.runner, the usual run folder), every policy;
- replay's prediction of each policy under llama.cpp's rule, on a record of these prompts, priced
  on llama.cpp's own costs (engines/llamacpp_prices.py: measured with llama-bench, the server's
  overheads fitted on other prompts) and on our decoder's (measure/cost_model.py).

What llama.cpp did comes from each response's `timings` (`draft_n`, `draft_n_accepted`, the
generation phase's `predicted_ms`) and the change of the server's counters over the request
(verification steps and plain decode calls: its rounds). Its speedup is over the generation
phase (what replay prices; the wall-clock one is kept beside it). Every llama.cpp output is
compared with the target's own greedy output (our baseline). Results go into the run folder as
`llamacpp.parquet` (one row per prompt and policy) and `llamacpp.json`.

Where --target and --draft are GGUF files, llama-server gets exactly those files (any
architecture, any quantization) while our side decodes their de-quantized copy: the table then
shows how far the two engines' outputs and acceptance part.
"""

from __future__ import annotations

import dataclasses
import signal
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.rules import expressible
from dspark_bench.depth import DEPTH_LABELS, depth_bucket
from dspark_bench.engines.files import llamacpp_flags
from dspark_bench.engines.llama_server import LlamaServer, build_info, check_port_free, find_server, served
from dspark_bench.engines.llamacpp_prices import llamacpp_prices
from dspark_bench.engines.versions import LLAMACPP_CURRENT, llamacpp_version
from dspark_bench.errors import DsparkError
from dspark_bench.harness.gguf import cached_gguf
from dspark_bench.harness.gguf_read import is_gguf
from dspark_bench.harness.hf_cost_model import fit_prompts as spare_prompts
from dspark_bench.harness.run import RunConfig, execute, plan_run
from dspark_bench.harness.runner import stage_steps
from dspark_bench.measure.cost_model import measure_cost
from dspark_bench.measure.recording import record
from dspark_bench.metrics import rates, summarize
from dspark_bench.replay import cost_file
from dspark_bench.replay.sampled import rows_of
from dspark_bench.replay.simulate import simulate, simulate_grid
from dspark_bench.results import check_writable, write_json, write_parquet
from dspark_bench.tasks.prompts import encode


def build_version(build: dict):
    """The llama.cpp version whose flags a build takes. A build without its number (built outside
    git: "build 0") is taken to be current: an older one refuses the current flags at start, and
    that line is what the user sees."""
    return llamacpp_version(f"b{build['build_number']}") if build["build_number"] else LLAMACPP_CURRENT


def found_build(server: str | None = None) -> tuple[Path, dict, object]:
    """llama-server (`server`, else the one built here), its build and the version of its flags."""
    binary = find_server(server)
    build = build_info(binary)
    return binary, build, build_version(build)


def check_policies(configs: list[DecodeConfig]) -> list[DecodeConfig]:
    """The greedy, batch-1, draft-model policies llama.cpp can run exactly (each, or one line why not)."""
    for config in configs:
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
    return configs


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
    """Run `config`'s policies on llama.cpp and on our decoder, and price each under llama.cpp's and
    our decoder's costs; returns (run folder, our table, one row per policy side by side)."""
    if config.ignore_eos:
        raise DsparkError("--decoder llamacpp cannot ignore EOS as ours does (llama-server bans the token instead, "
                          "so the outputs part there); drop --ignore-eos")
    check_writable(out)  # before models load and servers start: the cheap checks first
    binary = find_server(server)
    for taken in (() if port is None else (port, port + 1)):
        check_port_free(taken)
    build = build_info(binary)
    version = build_version(build)
    planned = plan_run(config)
    policies = check_policies(planned.configs)
    pair, settings = planned.pair, config.settings()
    eos = settings.eos_ids(pair)
    if len(eos) > 1:
        raise DsparkError(f"the target stops at {len(eos)} EOS ids; a GGUF file names one, so llama.cpp would stop "
                          "elsewhere: --decoder llamacpp needs a pair with one")
    prompt_ids = [encode(pair.tokenizer, p.text, settings.chat_template) for p in planned.prompts]
    target_file, draft_file, given = gguf_files(config, pair, gguf_dtype, build, binary, say)
    max_new, gamma = policies[0].verification.max_new_tokens, max(p.stopping.gamma_max for p in policies)
    fit_prompts = spare_prompts(config, planned.prompts)
    fit_ids = [encode(pair.tokenizer, p.text, settings.chat_template) for p in fit_prompts]
    prices = llamacpp_prices(pair, fit_prompts, fit_ids, eos, max_new, gamma, binary, version, target_file, draft_file,
                             config.threads or None, say, progress)
    context = max(len(ids) for ids in prompt_ids) + max_new + gamma + 8
    served_files = (binary, target_file, draft_file, version, context)
    measured, plain_argv, tokenized = serve_policies(served_files, policies, planned, prompt_ids,
                                                     config.threads or None, port, progress)
    # Our side is an ordinary run (its folder, its health checks); llamacpp.json marks it.
    folder, ours = execute(dataclasses.replace(config, decoder="ours"), out, progress, say, planned)
    targets = [autoregressive_decode(pair.target, ids, policies[0], eos).tokens for ids in prompt_ids]
    rec = record(pair, prompt_ids, max_new, gamma, eos_ids=eos, continuations=targets,
                 progress=stage_steps(progress, "replay record", len(prompt_ids)))
    our_prices = measure_cost(pair, prompt_ids[0] + targets[0][: len(targets[0]) // 2], gamma)
    tables, per_prompt, summary = [], [], []
    for i, (policy, flags, argv, rows) in enumerate(measured):
        mine = ours[ours["config_label"] == policy.label()].iloc[0]
        table = side_by_side(rec, policy, targets, rows, mine, tokenized)
        tables.append({"policy": policy.label(), "flags": flags, "argv": argv,
                       "table": table.to_dict(orient="records")})
        summary.append({**policy_row(rec, policy, rows, mine, prices, our_prices),
                        "by_bucket": by_bucket(rec, policy, rows, prompt_ids, planned.prompts, prices.surface.at(1))})
        per_prompt.append(rows.assign(config_id=i, config_label=policy.label()))
    summary = pd.DataFrame(summary)
    full = sorted({p for _, _, _, rows in measured for p in rows.loc[rows["context_full"], "prompt_id"]})
    if full and say:
        say(f"llama.cpp stopped {len(full)} prompt(s) short of {max_new} tokens (first: {full[0]}): its context is "
            "capped at the target's trained length; use fewer --max-new-tokens or shorter prompts "
            "to compare like for like")
    info = {"build": build, "context_full": full, "binary": str(binary), "engine_version": version.name,
            "argv": {"plain": plain_argv}, "gguf": {"target": str(target_file), "draft": str(draft_file),
                                                    "dtype": "as given" if given else gguf_dtype, "given": given},
            "tokenized_identically": int(sum(tokenized)), "prompts": len(prompt_ids),
            "prices": prices_info(prices, our_prices), "policies": tables, "summary": summary.to_dict(orient="records")}
    write_parquet(folder / "llamacpp.parquet", pd.concat(per_prompt, ignore_index=True))  # beside our run's own files
    write_json(folder / "llamacpp.json", info)
    return folder, ours, summary


def serve_policies(files, policies, planned, prompt_ids, threads, port, progress):
    """Each policy timed on a speculative llama-server beside one plain server: (per policy
    (policy, flags, argv, rows), the plain server's argv, whether llama.cpp tokenizes each prompt
    as we do)."""
    binary, target_file, draft_file, version, context = files
    pair, settings, measured = planned.pair, planned.config.settings(), []
    with stopped_on_sigterm(), ExitStack() as servers:
        plain = servers.enter_context(LlamaServer(binary, target_file, [], threads, context, port,
                                                  "llama-server (plain)"))
        tokenized = [plain.tokenize(pair.tokenizer.decode(ids)) == ids for ids in prompt_ids]
        for policy in policies:
            flags = llamacpp_flags(policy, str(draft_file), version)
            with LlamaServer(binary, target_file, flags, threads, context, None if port is None else port + 1,
                             "llama-server (speculative)") as spec:
                rows = served(plain, spec, planned.prompts, prompt_ids, policy, settings.repeats,
                              stage_steps(progress, f"llama.cpp {policy.label()}", len(prompt_ids)))
            measured.append((policy, flags, spec.argv, rows))
        return measured, plain.argv, tokenized


def prices_info(prices, our_prices) -> dict:
    """llamacpp.json's "prices": llama.cpp's (where from, fitted on what) and ours."""
    fitted = prices.fitted_on and {k: v for k, v in prices.fitted_on.items() if k in ("policies", "prompts")}
    return {"llamacpp": prices.source, "label": prices.label, "timing_health": prices.timing_health,
            "fitted_on": fitted, "ours": our_prices.to_dict()}


def gguf_files(config: RunConfig, pair, dtype: str, build: dict, binary, say) -> tuple[Path, Path, bool]:
    """The GGUF files llama-server loads: the user's own, exactly as given, where --target and
    --draft are GGUF files (whatever their architecture and quantization; our side decodes their
    de-quantized copy); else the pair written as GGUF (`dtype`, cached)."""
    given = [is_gguf(str(name or "")) for name in (config.target, config.draft)]
    if all(given):
        files = [Path(str(name)).expanduser().resolve() for name in (config.target, config.draft)]
        if say:
            say(f"llama.cpp b{build['build_number']} ({binary}) on your GGUF files as they are: {files[0].name}, "
                f"{files[1].name}; our side decodes their de-quantized copy")
        return files[0], files[1], True
    if any(given):
        raise DsparkError("--decoder llamacpp hands GGUF files to llama-server as they are: give both --target and "
                          "--draft as GGUF files, or neither")
    if say:
        say(f"llama.cpp b{build['build_number']} ({binary}); converting the pair to GGUF ({dtype}, cached)")
    return (cached_gguf(pair.target, pair.tokenizer, pair.fingerprints[0], dtype),
            cached_gguf(pair.draft, pair.tokenizer, pair.fingerprints[1], dtype), False)


def generation_speedup(rows: pd.DataFrame, label: str) -> pd.Series:
    """llama.cpp's measured speedup over its generation phase (each response's own
    `timings.predicted_ms`, what replay prices: prefill is the same target pass on both sides),
    with its interval over prompts; the wall-clock one beside it."""
    gen = summarize(rows.assign(config_id=0, config_label=label, spec_time_s=rows["spec_gen_s"],
                                baseline_time_s=rows["baseline_gen_s"])).iloc[0]
    wall = summarize(rows.assign(config_id=0, config_label=label)).iloc[0]
    return pd.concat([gen, pd.Series({"wall_speedup": wall["speedup"], "wall_speedup_low": wall["speedup_low"],
                                      "wall_speedup_high": wall["speedup_high"]})])


def policy_row(rec, policy: DecodeConfig, rows: pd.DataFrame, ours: pd.Series, prices, our_prices) -> dict:
    """One policy: llama.cpp measured beside replay priced on llama.cpp's costs and on ours."""
    llama = generation_speedup(rows, policy.label())
    on_llama = float(simulate_grid(rec, [policy], prices.surface.at(1))["predicted_speedup"].iloc[0])
    on_ours = float(simulate_grid(rec, [policy], our_prices)["predicted_speedup"].iloc[0])
    return {"policy": policy.label(), "llamacpp_speedup": llama["speedup"],
            "llamacpp_speedup_low": llama["speedup_low"], "llamacpp_speedup_high": llama["speedup_high"],
            "llamacpp_wall_speedup": llama["wall_speedup"], "predicted_llamacpp": on_llama, "predicted_ours": on_ours,
            "error_llamacpp": on_llama / llama["speedup"] - 1, "error_ours": on_ours / llama["speedup"] - 1,
            "acceptance_rate": llama["acceptance_rate"],
            "replay_acceptance_rate": rows["replay_accepted"].sum() / max(rows["replay_drafted"].sum(), 1),
            "ours_speedup": ours["speedup"], "ours_speedup_low": ours["speedup_low"],
            "ours_speedup_high": ours["speedup_high"],
            "identical": f"{int(rows['identical_to_target'].sum())}/{len(rows)}"}


def by_bucket(rec, policy: DecodeConfig, rows: pd.DataFrame, prompt_ids, prompts, cost) -> list[dict]:
    """Per prompt-length bucket (depth.DEPTH_LABELS; [] where every prompt is in one): llama.cpp's
    measured generation speedup over the bucket's prompts beside replay's prediction for them on
    llama.cpp's prices, each round priced at its own depth where the prices have the depth axis
    (docs/depth.md#llamacpp-at-depth)."""
    buckets = depth_bucket([len(ids) for ids in prompt_ids])
    if len(set(buckets.tolist())) < 2:
        return []
    out = []
    for bucket in sorted(set(buckets.tolist())):
        members = np.flatnonzero(buckets == bucket)
        predicted = float(simulate_grid(rows_of(rec, members), [policy], cost)["predicted_speedup"].iloc[0])
        measured = generation_speedup(rows[rows["prompt_id"].isin({prompts[i].id for i in members})], policy.label())
        speedup, low, high = (float(measured[k]) for k in ("speedup", "speedup_low", "speedup_high"))
        out.append({"bucket": DEPTH_LABELS[bucket], "prompts": len(members), "predicted_llamacpp": predicted,
                    "llamacpp_speedup": speedup, "llamacpp_speedup_low": low, "llamacpp_speedup_high": high,
                    "error_llamacpp": predicted / speedup - 1})
    return out


def side_by_side(rec, policy: DecodeConfig, targets, rows: pd.DataFrame, ours: pd.Series,
                 tokenized: list[bool]) -> pd.DataFrame:
    """One policy, per prompt and overall: llama.cpp's acceptance and rounds beside replay's, and who matches
    the target."""
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
    llama = generation_speedup(rows, policy.label())
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
        line("our decoder vs our baseline", ours["speedup"], ours["speedup_low"], ours["speedup_high"],
             ours["acceptance_rate"], ours["tokens_per_round"], ours["avg_draft_len"],
             f"{int(round(ours['identical_to_baseline'] * len(rows)))}/{len(rows)}"
             if "identical_to_baseline" in ours else ""),
        line("replay, llama.cpp's rule (predicted)", np.nan, np.nan, np.nan, replayed["acceptance_rate"],
             replayed["tokens_per_round"], replayed["avg_draft_len"], ""),
    ])



def sweep_prices(spec, pair, prompts, gamma: int, max_new_tokens: int, say=None, progress=None):
    """`sweep --prices llamacpp`: llama.cpp's cost model of this pair, from the cache where one was
    measured at this sweep's depth, build, threads and γ, else measured now as `run --decoder
    llamacpp` measures it (llama-bench, then the fit runs of both servers on the source's spare
    prompts), with its plan said first. The server and llama-bench are found as `run` finds them."""
    if spec.ignore_eos:
        raise DsparkError("--prices llamacpp fits llama-server's costs, which cannot ignore EOS as ours does "
                          "(llama-server bans the token instead): drop --ignore-eos")
    binary, build, version = found_build()
    eos = spec.runner_settings().eos_ids(pair)
    if len(eos) > 1:
        raise DsparkError(f"the target stops at {len(eos)} EOS ids; a GGUF file names one, so llama.cpp would stop "
                          "elsewhere: --prices llamacpp needs a pair with one")
    target_file, draft_file, _ = gguf_files(spec, pair, "f32", build, binary, say)
    try:
        fit = spare_prompts(spec, prompts)
    except DsparkError:  # every prompt is in the sweep: none left to fit on; a file cached for the pair may do
        cached = cost_file.cached("llamacpp", pair.describe())
        if cached is None or len(cached.surface.at(1).t_verify) <= gamma:
            raise
        if say:
            say(f"llama.cpp's prices: {cached.source} (cached for this pair at depth "
                f"{cached.surface.at(1).context_tokens}; every prompt is in the sweep, none is left to measure "
                "them again at this one)")
        return cached
    fit_ids = [encode(pair.tokenizer, p.text, spec.chat_template) for p in fit]
    prices = llamacpp_prices(pair, fit, fit_ids, eos, max_new_tokens, gamma, binary, version, target_file, draft_file,
                             spec.threads or None, say, progress)
    prices.check_models(pair.describe())
    return prices

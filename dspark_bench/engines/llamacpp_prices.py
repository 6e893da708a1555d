"""llama.cpp's own prices: a cost-model file (replay/cost_file.py) measured with llama.cpp's tools.

A speculative round in llama-server (b11434) is: the draft model's decodes of one token each
(`common_speculative_draft`: one for the last sampled token, one per drafted token but the last
kept), one target pass over the round's k + 1 tokens, and the same k + 1 tokens passed through
the draft again (`common_speculative_process` mirrors every target batch into the draft's
context), then sampling each verified position and the cache edits. So:

- t_verify(k) = target pass over k + 1 tokens + draft pass over k + 1 tokens, each the median of
  `llama-bench -p k+1 -n 0 -d DEPTH -o json` at the deployment's context depth (with its thread
  flags). Not assumed linear or monotone in k: each k is its own measurement (llama.cpp issue
  #5625: one model's pp8 runs at twice pp9's throughput).
- t_draft = the draft's pass over one token at that depth (`llama-bench -p 1`).
- t_plain, t_round and t_round_token: what the server adds (sampling every verified and drafted
  position, cache edits, the slot's bookkeeping). Fitted on fixed γ = 2, 5 and 7 runs (FIT_GAMMAS)
  of both servers on prompts set apart for fitting (the task's last ones), each the median of
  FIT_REPEATS timed pairs, from llama-server's own `timings` (`predicted_ms`, the generation
  phase): t_plain = plain seconds per generated token; what the speculative side took beyond
  replay's passes for the same prompts, per round, is
  t_round + t_round_token per token drafted (the line through each policy's medians:
  replay/cost_file.py's fit_overheads). A round costs more the more it drafts: on the long pair
  2.1 ms + 0.19 ms a drafted token, so one t_round fitted on γ 5 and 7 priced every shorter
  draft too dear (docs/depth.md#what-a-round-adds-per-drafted-token).
- t_round_empty: what a round adds whose draft came back empty (p-min stopped it before its first
  token). The server then takes a plain step, the sampled token alone (server-context.cpp: no
  verification, no checkpoint), so it adds far less than t_round: on this machine pricing such
  rounds at t_round put every threshold policy 5-8 % low. Fitted the same way on a run of p-min 1
  (EMPTY_FIT: every draft empty, a policy nobody deploys) on the same prompts. Before the fit,
  llama-bench's passes are scaled to the server's where llama-bench runs them slower
  (server_scale). A prediction is a test only on policies, prompts and runs other than those,
  and the file's `fitted_on` names them.

Where the workload's prompts reach past the first depth bucket, the passes are also timed at each
of depth.PRICED_DEPTHS within the servers' context (`-d`), scaled alike: the file's depth axis
(CostModel.by_depth), so replay prices each round at its own depth on llama.cpp's prices too.

Files are cached by the build, the two GGUF files, the depth and the threads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import shutil
import statistics
import subprocess
from pathlib import Path

import numpy as np

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.depth import PRICED_DEPTHS
from dspark_bench.engines.files import llamacpp_flags
from dspark_bench.engines.llama_server import LlamaServer, build_info, served  # a run's own interleaved requests
from dspark_bench.errors import DsparkError
from dspark_bench.harness.health import Check, LoadProbe, cost_dispersion, grade, health
from dspark_bench.harness.hf_cost_model import FIT_GAMMAS as HF_FIT_GAMMAS
from dspark_bench.harness.runner import stage_steps
from dspark_bench.measure.recording import record
from dspark_bench.replay.cost import CostModel, CostSurface, relative_iqr
from dspark_bench.replay.cost_file import CostFile, cache_home, fit_overheads, machine, now, plain_seconds_per_token
from dspark_bench.replay.cost_file import load as load_file

# The fixed γ llama-server's own costs are fitted on: HF's (neither among those a comparison usually
# lists) and a short draft, so that what a round adds per drafted token has drafts to be read from.
FIT_GAMMAS = (2, *HF_FIT_GAMMAS)
# The fit's empty-draft run: p-min 1 stops every draft at its first token (t_round_empty).
EMPTY_FIT = dict(schedule=schedules.THRESHOLD, metric="top1", threshold=1.0, gamma_max=1)
# Each fit prompt's timed pairs (medians): one pair a prompt put one fit's t_round at 0.2 ms where
# two others read 1.0-1.1 (5 prompts, each a residual of a few per cent of its passes).
FIT_REPEATS = 3
REPETITIONS = 5  # llama-bench -r, in each of INVOCATIONS runs (a pass takes milliseconds: many are cheap)
INVOCATIONS = 6


def find_bench(server: Path) -> Path:
    """llama-bench beside the server binary (the build script builds both), else on PATH."""
    beside = Path(server).parent / "llama-bench"
    if beside.is_file():
        return beside
    found = shutil.which("llama-bench")
    if found:
        return Path(found)
    raise DsparkError(f"no llama-bench beside {server} or on PATH: rebuild with `bash tools/build-llama-server.sh` "
                      "(it builds llama-bench with the server)")


def bench(binary: Path, model: Path, sizes: list[int], depth: int, threads: int | None) -> dict[int, list[float]]:
    """Seconds of a pass over n tokens at `depth` for each n of `sizes`: llama-bench's own samples,
    from INVOCATIONS runs that each take the sizes in another order after an untimed one (on a
    shared machine a run's first tests and its drift would otherwise fall on the same k each time)."""
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for invocation in range(INVOCATIONS):
        order = random.Random(invocation).sample(sizes, len(sizes))
        argv = [str(binary), "-m", str(model), "-p", ",".join(map(str, [sizes[0]] + order)), "-n", "0",
                "-d", str(depth), "-r", str(REPETITIONS), "-o", "json"] + (["-t", str(threads)] if threads else [])
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise DsparkError(f"llama-bench did not run: {error}") from None
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            raise DsparkError(f"llama-bench failed on {model.name} (exit {done.returncode}): "
                              f"{(lines or ['no output'])[-1][:200]}")
        try:
            tests = json.loads(done.stdout)
        except json.JSONDecodeError:
            raise DsparkError(f"llama-bench wrote no JSON for {model.name}: {done.stdout[:120]!r}") from None
        for test in tests[1:]:  # the first: untimed warm-up
            samples[int(test["n_prompt"])] += [ns / 1e9 for ns in test["samples_ns"]]
    return samples


def pass_costs(binary: Path, target: Path, draft: Path, depth: int, gamma: int,
               threads: int | None) -> tuple[CostModel, dict]:
    """t_draft and t_verify(k), k = 0 .. gamma, from llama-bench (module docstring); and the raw medians."""
    sizes = list(range(1, gamma + 2))
    target_s, draft_s = bench(binary, target, sizes, depth, threads), bench(binary, draft, sizes, depth, threads)
    median = {role: {n: statistics.median(s) for n, s in samples.items()}
              for role, samples in (("target", target_s), ("draft", draft_s))}
    verify = [median["target"][k + 1] + median["draft"][k + 1] for k in range(gamma + 1)]
    spread = max(relative_iqr(s) for samples in (target_s, draft_s) for s in samples.values())
    return CostModel(median["draft"][1], verify, depth, spread=spread), median


def deep_enough(depth: int, context: int) -> list[int]:
    """The depths (depth.PRICED_DEPTHS) llama-bench times passes at, besides `depth`: those within
    the servers' `context`, where the workload reaches past the first depth bucket; else none."""
    return [d for d in PRICED_DEPTHS if d <= context] if depth > PRICED_DEPTHS[0] else []


def depth_passes(bench_binary: Path, target: Path, draft: Path, depths: list[int], gamma: int,
                 threads: int | None, scale: float, say=None) -> dict:
    """CostModel.by_depth from llama-bench's `-d` at each depth: the same passes as `pass_costs`,
    scaled to the server's as the fitted depth's are (server_scale)."""
    if depths and say:
        say(f"llama.cpp's passes at depths {', '.join(map(str, depths))} (llama-bench -d)")
    timed = {}
    for depth in depths:
        passes = scaled(pass_costs(bench_binary, target, draft, depth, gamma, threads)[0], scale)
        timed[depth] = {"t_draft": passes.t_draft, "t_verify": passes.t_verify}
    return timed


def fit_dispersion(per_prompt: list[dict]) -> Check:
    """How far the plain server's seconds per token for one prompt disagree between the fit runs
    (each fit policy serves every fit prompt on the plain server too: the same request, timed
    again minutes later), the median over prompts. Prompts differ in length and so in step cost;
    a repeat of the same prompt does not, so a wide spread here is the machine."""
    by_prompt: dict[str, list[float]] = {}
    for row in per_prompt:
        by_prompt.setdefault(row["prompt_id"], []).append(row["plain_per_token_s"])
    spread = statistics.median((max(v) - min(v)) / statistics.median(v) for v in by_prompt.values())
    return Check("fit_dispersion", grade(spread, 0.10, 0.25), {"relative_range": spread},
                 f"llama-server's plain seconds per token for the same prompt moved by {spread:.0%} (range / median, "
                 "the median over the fit prompts) between the fit runs")


def file_key(path: Path) -> str:
    stat = Path(path).stat()
    return hashlib.sha256(f"{Path(path).resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]


# Bumped when the way a file is fitted changes, so a cached file of the old way is measured again.
FIT_VERSION = 6  # 2: the passes scaled to the server's (server_scale); 3: t_round_empty, paired ratios;
# 4: each fit prompt priced at its own depths; 5: t_round_token, on fixed γ 2, 5 and 7; 6: FIT_REPEATS pairs


def cache_path(build: dict, target: Path, draft: Path, depth: int, threads: int | None) -> Path:
    """Keyed by what changes the prices: the build, the two model files, the cache depth and the
    threads (and how a file is fitted); not by the tokens a run decodes, which only set the depth."""
    return (cache_home() / f"llamacpp-b{build['build_number']}-{file_key(target)}-"
            f"{file_key(draft)}-d{depth}-t{threads or 0}-f{FIT_VERSION}.json")


def server_scale(passes: CostModel, runs) -> float:
    """What llama-bench's passes are scaled by to be the server's: llama-server's plain step
    (its whole step, sampling included, from the fit runs' plain side) over llama-bench's
    one-token target pass (t_verify(0) less the draft's mirrored one-token pass), where
    llama-bench's is the slower; else 1, since a plain step that costs more than the pass may be
    the server's own overhead, which t_plain and t_round carry. On this machine (b11434, one
    thread) llama-bench ran the one-token pass 8 % slower than the server's whole plain step
    (3.46 against 3.18 ms): unscaled, every pass is priced 8 % high and the per-round cost fitted
    on γ 5 and 7 comes out at half of it (0.92 against 1.83 ms), so short rounds, which pay it
    most often, are priced too low."""
    one_token = passes.t_verify[0] - passes.t_draft
    return min(1.0, plain_seconds_per_token(runs) / one_token) if one_token > 0 else 1.0


def scaled(passes: CostModel, scale: float) -> CostModel:
    return dataclasses.replace(passes, t_draft=passes.t_draft * scale, t_verify=[t * scale for t in passes.t_verify])


def cached_prices(where: Path, gamma: int, depth: int, say=None) -> CostFile | None:
    """The cached file at `where` if it prices drafts of up to `gamma` tokens (else None: measured again, deeper)."""
    if not where.is_file():
        return None
    prices = load_file(where)
    deepest = len(prices.surface.at(1).t_verify) - 1
    if deepest >= gamma:
        if say:
            say(f"llama.cpp's prices: {where} (cached; depth {depth}, drafts up to {deepest})")
        return prices
    if say:
        say(f"llama.cpp's prices cached in {where} price drafts of up to {deepest} tokens, not {gamma}: measuring "
            "them again, deeper")
    return None


def how_measured(scale: float) -> str:
    """The cost-model file's own account of how its prices were taken."""
    return ("t_verify(k): llama-bench -p k+1 -n 0 -d DEPTH, target + draft (the server passes every target batch "
            "through the draft too); t_draft: the draft's -p 1; medians of "
            f"{REPETITIONS * INVOCATIONS} repetitions over {INVOCATIONS} runs, sizes shuffled. t_plain, t_round, "
            f"t_round_token: fitted on llama-server's timings.predicted_ms ({FIT_REPEATS} pairs a prompt) of fixed "
            f"γ={', '.join(map(str, FIT_GAMMAS))} and plain runs: what each took beyond replay's passes per round, "
            "each prompt's at its own depths, the line through each policy's median against its tokens drafted per "
            "round (fitted_on); t_round_empty: the same per empty round of a p-min 1 run; every pass scaled by "
            f"{scale:.3f}, the server's plain step over "
            "llama-bench's one-token target pass where llama-bench's is the slower (server_scale)")


def llamacpp_prices(pair, fit_prompts, fit_ids: list[list[int]], eos, max_new_tokens: int, gamma: int,
                    binary: Path, version, target: Path, draft: Path, threads: int | None,
                    say=None, progress=None) -> CostFile:
    """llama.cpp's cost-model file for this pair (GGUF files `target`, `draft`), cached; measured
    with llama-bench and fitted on `fit_prompts` where it is not cached yet. `progress(stage, done,
    total)` follows the fit runs."""
    depth = int(np.mean([len(ids) for ids in fit_ids])) + max_new_tokens // 2  # a realistic cache: mid-answer
    build = build_info(binary)
    where = cache_path(build, target, draft, depth, threads)
    cached = cached_prices(where, gamma, depth, say)
    if cached is not None:
        return cached
    gamma = max(gamma, *FIT_GAMMAS)
    if say:
        say(f"measuring llama.cpp's prices (cached after): llama-bench passes of 1 to {gamma + 1} tokens at depth "
            f"{depth}, then {2 * FIT_REPEATS * len(fit_ids) * (len(FIT_GAMMAS) + 1)} fit requests ({len(fit_ids)} "
            f"prompts × fixed γ={', '.join(map(str, FIT_GAMMAS))} and p-min 1 × both servers × {FIT_REPEATS} pairs, "
            f"{max_new_tokens} tokens)")
    probe = LoadProbe()  # a busy machine while measuring is said, as for our own timings
    probe.sample("before llama-bench")
    passes, medians = pass_costs(find_bench(binary), target, draft, depth, gamma, threads)
    probe.sample("after llama-bench")
    policies = [DecodeConfig.of(**knobs, min_draft_len=0, semantics="llamacpp", max_new_tokens=max_new_tokens)
                for knobs in [*(dict(schedule=schedules.BASELINE, gamma_max=g) for g in FIT_GAMMAS), EMPTY_FIT]]
    if say:  # the fit's estimate, now that llama-bench has timed a plain step
        step = medians["target"][1]
        requests = 2 * FIT_REPEATS * len(fit_ids) * len(policies)
        say(f"llama.cpp's plain step: {step * 1e3:.1f} ms (llama-bench); the fit's {requests} "
            f"requests ≈ {requests * max_new_tokens * step:.0f} s at that step, the servers' "
            "starts aside")
    context = max(len(ids) for ids in fit_ids) + max_new_tokens + gamma + 8
    runs, steps = [], stage_steps(progress, "llama.cpp prices (fit)", len(fit_ids) * len(policies))
    with LlamaServer(binary, target, [], threads, context, None, "llama-server (plain, fit)") as plain:
        for policy in policies:
            with LlamaServer(binary, target, llamacpp_flags(policy, str(draft), version), threads, context, None,
                             "llama-server (speculative, fit)") as spec:
                rows = served(plain, spec, fit_prompts, fit_ids, policy, FIT_REPEATS, steps)
            runs.append((policy, rows.rename(columns={"spec_gen_s": "spec_s", "baseline_gen_s": "baseline_s"})))
    probe.sample("after the fit runs")
    rec = record(pair, fit_ids, max_new_tokens, gamma, eos_ids=eos)
    scale = server_scale(passes, runs)
    # The depth axis before the fit: each fit prompt's rounds priced at their own depths, as a run's are.
    deep = dataclasses.replace(scaled(passes, scale), by_depth=depth_passes(
        find_bench(binary), target, draft, deep_enough(depth, context), gamma, threads, scale, say))
    model, per_run = fit_overheads(deep, rec, runs, per_token=True)
    described = pair.describe()
    prices = CostFile(
        CostSurface({1: model}), {"name": "llamacpp", "version": f"b{build['build_number']}", "build": build},
        {"target": str(target), "draft": str(draft), "target_fingerprint": described["target_fingerprint"],
         "draft_fingerprint": described["draft_fingerprint"]}, how_measured(scale),
        {**machine(), "threads": threads or "llama.cpp's default"}, now(),
        {"policies": [p.label() for p in policies], "prompts": [p.id for p in fit_prompts], "runs": per_run,
         "pass_scale": scale, "fit_version": FIT_VERSION,
         "llama_bench_medians_s": {role: {str(n): s for n, s in m.items()} for role, m in medians.items()}},
        timing_health=health([*probe.checks(), cost_dispersion(CostSurface({1: passes})), fit_dispersion(per_run)]))
    prices.save(where)
    prices.source = str(where)
    return prices

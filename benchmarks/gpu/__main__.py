"""The GPU run (issue 47): one command on a CUDA machine proves the decoder there, prices a realistic
pair and measures how close our step comes to the memory-bandwidth bound.

Stages, each written to stages.json under --out as it ends, so a cut run resumes where it stopped
(--resume FILE: a stages.json from an earlier try; its finished stages are not run again):
  machine      the device, and its measured device-to-device copy bandwidth
  correctness  the shipped pair in fp32: greedy output identical to the target's own for every
               (metric, schedule) the tests cover, batch 1 (both draft modes) and batched; bf16's
               divergence as the run reports it; sampling lossless (chi-square, and a broken rule caught)
  syncs        host syncs per round: host.fetch's count and CUDA's own sync debug mode
  prices       a --size pair with random weights built on the device: the plain step against the
               bandwidth bound, t_verify(k) for k = 0..gamma at B = 1, 8, 32, the draft step, the
               round's overhead; written as cost-model files that name the device
  captured     batch 1's captured passes (what a decode runs there by default) alone, against their
               bounds, and inside running decodes (CUDA events): two more cost-model files
  replay       the shipped pair's code record replayed on those prices, beside the shipped pair's
               own prices on this device and (--cpu-prices) on a CPU: the best policy and best fixed γ
  compiled     the --size pair's plain step compiled (torch.compile, CUDA graphs) against the bound,
               and profiled (torch.profiler: profile-compiled-step.txt)
  timed        timed replay (issue 53): the shipped pair's rounds for fixed γ 2, 4, 6 and two threshold
               policies run on the --size pair's captured passes beside its plain decoding, each measured
               speedup beside replay's prediction on that pair's captured prices, timed alone and in
               decode (not yet timed on a device)
  batches      verify(k) and the draft step captured at B = 1 and each --batch-size (one CUDA graph per
               (B, k), as the engines capture them), beside the prices stage's eager surface
  speed        (only when named) the shipped pair's decoders timed: benchmarks/gpu/speed.py
Prints one table (also gpu-table.md) and exits 1 if a stage failed or a check did not hold. Says
its plan first; without CUDA it refuses the stages that build --size's pair (exit 2) unless given
--smoke or --allow-cpu.

    bash benchmarks/gpu/gpu.sh --out results/gpu                      # all but speed (6 min on an H200 before timed)
    bash benchmarks/gpu/gpu.sh --out results/gpu --resume results/gpu/stages.json   # finish a cut run
    bash benchmarks/gpu/gpu.sh --stages speed --limit 10              # the shipped pair's decoders timed
    bash benchmarks/gpu/gpu.sh --device cpu --smoke                   # the dry run on a CPU (tests/test_gpu_bench.py)
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.gpu import prices as gpu_prices
from benchmarks.gpu import report as gpu_report
from benchmarks.gpu import stages as gpu_stages

DEFAULT_STAGES = ("machine", "correctness", "syncs", "prices", "captured", "replay", "compiled", "timed", "batches")
ALL_STAGES = (*DEFAULT_STAGES, "speed")
INPUTS = Path(__file__).resolve().parent / "inputs"  # what a device run reads: made on a CPU, committed
CPU_PRICES = INPUTS / "cpu-prices-shipped-pair.json"


def arguments():
    parser = common.parser(__doc__, task="code", limit=10, max_new_tokens=128, out="results/gpu")
    parser.prog = "python -m benchmarks.gpu"  # not __main__.py
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto (default)")
    parser.add_argument("--stages", default=",".join(DEFAULT_STAGES),
                        help=f"comma-separated, of {', '.join(ALL_STAGES)}")
    parser.add_argument("--size", default="llama-8b-1b", help="the priced pair's shapes (benchmarks/gpu/shapes.json)")
    parser.add_argument("--price-dtype", default="bfloat16", help="the priced pair's dtype (default bfloat16)")
    parser.add_argument("--context", type=int, default=512, help="cache length the priced pair is timed at")
    parser.add_argument("--gamma", type=int, default=8, help="deepest draft priced, recorded and replayed")
    parser.add_argument("--batch-size", type=int, action="append", help="batch sizes priced above 1 (default 8, 32)")
    parser.add_argument("--cpu-prices", type=Path, default=CPU_PRICES if CPU_PRICES.is_file() else None,
                        help="the shipped pair's cost model measured on a CPU, replayed beside the device's")
    parser.add_argument("--prompts", type=Path, help="a JSONL file of prompts ({\"id\", \"text\"} each line) in "
                        "place of --task's: the same prompts on every machine (a task's code prompts are read from "
                        "the machine's installed packages)")
    parser.add_argument("--resume", type=Path, help="a stages.json from an earlier try: its finished stages stand")
    parser.add_argument("--budget-s", type=float, default=450.0, help="start no stage after this many seconds")
    parser.add_argument("--dtype", default="auto", help="the speed stage's dtype for the shipped pair")
    parser.add_argument("--target", help="the speed stage: a hub pair beside the shipped one")
    parser.add_argument("--draft")
    parser.add_argument("--no-compile", action="store_true", help="the speed stage: eager rows only")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and counts: the CPU dry run")
    parser.add_argument("--allow-cpu", action="store_true", help="run the full-size stages on a machine without "
                        "CUDA anyway (they build --size's pair in RAM: tens of GB for llama-8b-1b)")
    args = parser.parse_args()
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in args.stages if s not in ALL_STAGES]
    if unknown:
        parser.error(f"unknown stage {unknown[0]!r}; choose from {', '.join(ALL_STAGES)}")
    for flag, path in (("--resume", args.resume), ("--prompts", args.prompts), ("--cpu-prices", args.cpu_prices)):
        if path and not path.is_file():
            parser.error(f"{flag} {path}: no such file")
    if args.smoke:
        shrink(args)
    args.batch_size = sorted({b for b in (args.batch_size or [8, 32]) if b > 1})
    return args


def shrink(args) -> None:
    """The dry run: tiny shapes and counts, the compiled step through dynamo's "eager" backend
    (tracing, guards and the static cache, no code generation)."""
    from dspark_bench.decoding import cached_lm

    args.size, args.price_dtype, args.context = "tiny", "float32", 48
    args.limit, args.max_new_tokens, args.gamma = min(args.limit, 2), min(args.max_new_tokens, 24), 4
    args.batch_size = args.batch_size or [2]
    cached_lm.COMPILE_OPTIONS["backend"] = "eager"


PRICED = ("prices", "captured", "compiled", "timed", "batches")  # the stages that build --size's pair


def plan(args, device: torch.device) -> list[str]:
    """What the run will do and build, said before anything is built."""
    lines = [f"plan: stages {', '.join(args.stages)} on {device}"]
    if any(stage in PRICED for stage in args.stages):
        sizes = gpu_prices.resident_bytes(args.size, args.price_dtype)
        lines.append(f"plan: builds the {args.size} pair with random weights in {args.price_dtype} on {device} "
                     f"({sizes['target_params'] / 1e9:.2f} B + {sizes['draft_params'] / 1e9:.2f} B parameters, "
                     f"{sizes['bytes'] / 1e9:.1f} GB) for {', '.join(s for s in args.stages if s in PRICED)}")
    return lines


def refusal(args, device: torch.device) -> str | None:
    """Why this run should not start here: the full-size stages on a machine without CUDA build
    an 8B-shaped pair in RAM (19.5 GB resident, found when one ran on a CPU without a word)."""
    if device.type == "cuda" or args.smoke or args.allow_cpu or not any(s in PRICED for s in args.stages):
        return None
    return (f"no CUDA device here ({device}): the {'/'.join(s for s in args.stages if s in PRICED)} stages would "
            f"build the {args.size} pair in this machine's memory; pass --smoke for the dry run, --stages without "
            "them, or --allow-cpu to run them here anyway")


def main() -> int:
    args = arguments()
    start = time.perf_counter()

    def say(line: str) -> None:
        print(f"[{time.perf_counter() - start:6.0f} s] {line}", flush=True)

    from dspark_bench.errors import DsparkError
    from dspark_bench.harness.models import resolve_device

    try:
        device = resolve_device(args.device)
    except DsparkError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for line in plan(args, device):
        say(line)
    refused = refusal(args, device)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    state = json.loads(args.resume.read_text()) if args.resume else {}
    context = gpu_stages.Context(args, say, state)
    for stage in args.stages:
        if state.get(stage, {}).get("done"):
            say(f"{stage}: done in an earlier try")
            continue
        if time.perf_counter() - start > args.budget_s:
            say(f"{stage}: not started, past --budget-s {args.budget_s:.0f}: rerun with --resume")
            state[stage] = {"done": False, "skipped": "out of time"}
            continue
        state[stage] = run_stage(stage, context, say)
        save(args.out / "stages.json", state)
    table = gpu_report.table(state, args)
    (args.out / "gpu-table.md").write_text(table)
    print("\n" + table)
    failed = [s for s in args.stages if not state.get(s, {}).get("done") or state[s].get("holds") is False]
    say(f"stages failed or not holding: {', '.join(failed)}" if failed else "every stage done and holding")
    return 1 if failed else 0


def run_stage(stage: str, context, say) -> dict:
    """One stage: its result with done, seconds and (where it checks something) holds; a stage
    that raises is recorded with its error and the run goes on to the next."""
    say(f"{stage}: starting")
    began = time.perf_counter()
    try:
        result = getattr(gpu_stages, stage)(context)
        result.update(done=True)
    except Exception as error:  # recorded in stages.json and the table, and the exit status says so
        result = {"done": False, "error": f"{type(error).__name__}: {error}",
                  "traceback": traceback.format_exc()[-4000:]}
        say(f"{stage}: FAILED: {result['error']}")
    result["seconds"] = round(time.perf_counter() - began, 1)
    say(f"{stage}: {'done' if result['done'] else 'failed'} in {result['seconds']:.0f} s")
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def save(path: Path, state: dict) -> None:
    path.write_text(json.dumps(state, indent=1, default=str))


if __name__ == "__main__":
    raise SystemExit(main())

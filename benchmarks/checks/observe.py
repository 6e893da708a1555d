"""`dspark-bench observe`'s advice from counters alone, checked on a live llama-server (issue 66).

Registered before the runs. 1) `dspark-bench run --decoder llamacpp` times fixed γ = 1 .. K on
llama-server beside a plain server on the task's prompts (and measures llama.cpp's own prices,
cached). 2) A llama-server deployed at a fixed K (the flags export writes, --metrics on) serves the
same prompts; its /metrics is saved before and after. 3) `dspark-bench observe BEFORE AFTER --prices
LLAMACPP_PRICES` reads the window and prices every K' ≤ K from the counts alone. Each K''s
predicted speedup (with the counts' interval) is set beside its measured one from 1), and the
advised K' against the measured best. Also: the window's counts against the server's own
per-request `timings` (draft_n, draft_n_accepted). Writes observe.md and observe.json into --out.

`--drift`: a replay sweep of the task's first --limit prompts under llama.cpp's rule, the policy
`export --format llamacpp` writes deployed on llama-server, fed the sweep's own prompts, the task's
next --limit prompts (the same domain, prompts the sweep did not see) and --other-task's; each
window held against the sweep (`observe --against`): the first two should read "as predicted",
the other task's "drifted" where the pair accepts it otherwise (structured text does; prose, on the
shipped pair, does not). On this machine llama.cpp's measured prices make every export of the
shipped pair plain decoding, so the export here is priced on the sweep's own (our decoder's)
prices, as where speculation pays. Writes drift.md and drift.json.

    python -m benchmarks.checks.observe --out results/observe [--limit 10] [--max-new-tokens 64] [--gamma 6]
    python -m benchmarks.checks.observe --out results/observe --drift --limit 24 --other-task structured
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks import common
from dspark_bench.config import DecodeConfig
from dspark_bench.engines.counters import read_scrape, scrape
from dspark_bench.engines.files import llamacpp_flags
from dspark_bench.engines.llama_server import LlamaServer
from dspark_bench.engines.observed import observe


def cli(*args) -> None:
    done = subprocess.run([sys.executable, "-m", "dspark_bench.cli", *map(str, args)])
    if done.returncode:
        raise SystemExit(f"dspark-bench {args[0]} failed ({done.returncode})")


def measured_run(args, out: Path) -> Path:
    """Fixed γ = 1 .. K timed on llama-server beside plain decoding (run --decoder llamacpp)."""
    lengths = [x for g in range(1, args.gamma + 1) for x in ("--gamma-max", g)]
    cli("run", "--task", args.task, "--limit", args.limit, "--max-new-tokens", args.max_new_tokens,
        "--schedule", "fixed", *lengths, "--decoder", "llamacpp", "--device", "cpu", "--out", out)
    return max(out.iterdir(), key=lambda p: p.name)


def deployed_window(info: dict, prompts: list[list[int]], args, out: Path) -> tuple[list[str], dict]:
    """The K server (run's own binary, files and flags) serving `prompts` (`served_window`, warmed up),
    and its own per-request counts summed."""
    from dspark_bench.engines.llamacpp_run import found_build

    binary, _, version = found_build(info["binary"])
    flags = llamacpp_flags(DecodeConfig.of(schedule="fixed", gamma_max=args.gamma), info["gguf"]["draft"], version)
    paths, answers = served_window(binary, Path(info["gguf"]["target"]), flags, prompts, args.max_new_tokens, out,
                                   warm=True)
    own = {"draft_n": sum(a["timings"].get("draft_n", 0) for a in answers),
           "draft_n_accepted": sum(a["timings"].get("draft_n_accepted", 0) for a in answers)}
    return paths, own


def served_window(binary, target: Path, flags: list[str], prompts: list[list[int]], tokens: int, out: Path,
                  warm: bool = False) -> tuple[list[str], list[dict]]:
    """A llama-server with `flags` serving `prompts`: its /metrics saved before and after, as files,
    and its answers. `warm`: a first request before the window (it pays for allocations; outside it)."""
    paths = [out / "before.prom", out / "after.prom"]
    out.mkdir(parents=True, exist_ok=True)
    with LlamaServer(binary, target, flags, name="llama-server (deployed)") as server:
        if warm:
            server.complete(prompts[0], tokens)
        paths[0].write_text(scrape(server.url("/metrics")))
        answers = [server.complete(ids, tokens) for ids in prompts]
        paths[1].write_text(scrape(server.url("/metrics")))
    return [str(p) for p in paths], answers


def drift(args, out: Path) -> None:
    """The --drift check (module docstring)."""
    from dspark_bench.engines.drift import deployed, sweep_of
    from dspark_bench.engines.llamacpp_run import found_build
    from dspark_bench.harness.gguf import cached_gguf
    from dspark_bench.harness.models import load_pair
    from dspark_bench.tasks import load_prompts
    from dspark_bench.tasks.prompts import encode

    # On this machine llama.cpp's own prices make its export deploy plain decoding (nothing to observe):
    # export from the sweep's own prices instead (llama.cpp's cache hidden), as where speculation pays.
    # Drift is about what the traffic accepts, not about speed.
    os.environ["DSPARK_PRICES_HOME"] = str(out / "no-llamacpp-prices")
    cli("sweep", "--task", args.task, "--limit", args.limit, "--max-new-tokens", args.max_new_tokens,
        "--semantics", "llamacpp", "--confirm-top", 0, "--out", out / "sweep")
    sweep = max((p for p in (out / "sweep").iterdir() if "-sweep-" in p.name), key=lambda p: p.name)
    policy = deployed(sweep_of(sweep), "llamacpp")
    binary, _, version = found_build()
    pair = load_pair(device="cpu")
    files = [cached_gguf(m, pair.tokenizer, f, "f32") for m, f in zip((pair.target, pair.draft), pair.fingerprints)]
    flags = llamacpp_flags(policy, str(files[1]), version)
    swept, same = (lambda ps: (ps[:args.limit], ps[args.limit:]))(
        load_prompts(args.task, None, "train", None, None, 2 * args.limit)[0])
    other = load_prompts(args.other_task, None, "train", None, None, args.limit)[0]
    rows = []
    for name, prompts in ((f"{args.task} (the sweep's {args.limit})", swept),
                          (f"{args.task}-next (the next {args.limit})", same), (args.other_task, other)):
        ids = [encode(pair.tokenizer, p.text, "auto") for p in prompts]
        sources, _ = served_window(binary, files[0], flags, ids, args.max_new_tokens, out / name.split()[0])
        _, result = observe(sources, None, None, out / "observed", against=sweep)
        rows.append((name, result["against"]))
    (out / "drift.json").write_text(json.dumps({"sweep": str(sweep), "flags": flags,
                                                "windows": dict(rows)}, indent=1, default=str))
    lines = [f"Deployed: {policy.label()} (`{' '.join(flags)}`), from `export --format llamacpp` of {sweep.name} "
             f"({args.limit} {args.task} prompts × {args.max_new_tokens} tokens).", ""]
    for name, verdict in rows:
        lines += [f"### Traffic: {name} — {verdict['verdict']}", "",
                  f"{verdict['observed_rounds']} rounds seen, {verdict['predicted_rounds']} replayed.", "",
                  "| position | observed survival | predicted | difference (95 %) | drifted |", "|---|---|---|---|---|"]
        lines += [f"| {r['position']} | {r['observed']:.3f} | {r['predicted']:.3f} | {r['difference']:+.3f} "
                  f"[{r['difference_interval'][0]:+.3f}, {r['difference_interval'][1]:+.3f}] | "
                  f"{'yes' if r['drifted'] else ''} |" for r in verdict.get("positions", [])]
        lines.append("" if "why" not in verdict else f"\n{verdict['why']}\n")
    (out / "drift.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = common.parser(__doc__, task="code", limit=10, max_new_tokens=64, out="results/observe")
    parser.add_argument("--gamma", type=int, default=6, help="the deployed fixed draft length K")
    parser.add_argument("--drift", action="store_true", help="the drift check instead (module docstring)")
    parser.add_argument("--other-task", default="prose", help="--drift: the other domain's traffic")
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.drift:
        drift(args, out / "drift")
        return
    advice_check(args, out)


def advice_check(args, out: Path) -> None:
    """Steps 1-3 of the module docstring, and the window against replay of the same fixed K."""
    run = measured_run(args, out / "runs")
    info = json.loads((run / "llamacpp.json").read_text())
    pair, ids = prompt_ids(args)
    sources, own = deployed_window(info, ids, args, out)
    folder, result = observe(sources, None, Path(info["prices"]["llamacpp"]), out / "observed")
    window = read_scrape(Path(sources[1]).read_text()).since(read_scrape(Path(sources[0]).read_text()))
    rows = advice_rows(result, info)
    # K' = 0 is plain decoding, 1.0 by definition: the measured best is plain where no K' beats it.
    best_measured = max([{"draft_length": 0, "measured": 1.0}] + rows, key=lambda r: r["measured"] or 0)["draft_length"]
    verdict = against_replay(pair, ids, window, args)
    data = {"run": str(run), "observed": str(folder), "advice": result["advice"]["best"],
            "best_measured": best_measured, "rows": rows, "window": result, "against_replay": verdict,
            "own_counts": own, "window_counts": {"draft_tokens": window.draft_tokens, "accepted": window.accepted}}
    (out / "observe.json").write_text(json.dumps(data, indent=1, default=str))
    lines = [f"llama-server deployed at fixed K = {args.gamma} on {args.limit} {args.task} prompts × "
             f"{args.max_new_tokens} tokens; window {result['rounds']} rounds, {result['draft_tokens']} draft tokens, "
             f"{result['accepted']} accepted (its own per-request timings: {own['draft_n']} drafted, "
             f"{own['draft_n_accepted']} accepted, the warm-up request's outside them).", "",
             "| K' | predicted speedup (counts' 95 % interval) | measured llama.cpp speedup (its interval) | within |",
             "|---|---|---|---|"]
    lines += [f"| {r['draft_length']} | {r['predicted']:.3f} [{r['low']:.3f}, {r['high']:.3f}] | "
              + ("n/a" if r["measured"] is None else
                 f"{r['measured']:.3f} [{r['measured_interval'][0]:.3f}, {r['measured_interval'][1]:.3f}]")
              + f" | {'yes' if r['within'] else 'no'} |" for r in rows]
    lines += ["", f"Advised K' = {data['advice']}; measured best K' = {best_measured} (0: plain decoding). Prices: "
              f"{info['prices']['label']} ({info['prices']['llamacpp']}), timing health "
              f"{info['prices']['timing_health']['verdict']}.", "", *verdict_lines(verdict)]
    (out / "observe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def advice_rows(result: dict, info: dict) -> list[dict]:
    """Each K''s predicted speedup beside the one `run --decoder llamacpp` measured."""
    measured = {int(row["policy"].split("γ=")[1].split()[0]): row for row in info["summary"]}
    rows = []
    for entry in result["advice"]["by_length"][1:]:
        k, got = entry["draft_length"], measured.get(entry["draft_length"])
        low, high = entry["speedup_interval"]
        rows.append({"draft_length": k, "predicted": entry["speedup"], "low": low, "high": high,
                     "measured": got["llamacpp_speedup"] if got else None,
                     "measured_interval": [got["llamacpp_speedup_low"], got["llamacpp_speedup_high"]] if got else None,
                     "within": bool(got and low <= got["llamacpp_speedup"] <= high)})
    return rows


def against_replay(pair, ids: list[list[int]], window, args) -> dict:
    """The window against replay of the same fixed K under llama.cpp's rule, on a record of the same prompts."""
    from dspark_bench.engines.drift import compare, predicted
    from dspark_bench.measure.recording import record

    rec = record(pair, ids, args.max_new_tokens, args.gamma, eos_ids=pair.eos_ids)
    policy = DecodeConfig.of(schedule="fixed", gamma_max=args.gamma, semantics="llamacpp",
                             max_new_tokens=args.max_new_tokens)
    expected, effects = predicted(rec, policy, "llamacpp")
    return compare(window, expected, policy, effects)


def verdict_lines(verdict: dict) -> list[str]:
    lines = [f"Against replay of {verdict['policy']} on the same prompts: {verdict['verdict']} "
             f"({verdict['observed_rounds']} rounds seen, {verdict['predicted_rounds']} replayed).", "",
             "| position | observed survival | replayed | difference (95 %) | drifted |", "|---|---|---|---|---|"]
    return lines + [f"| {r['position']} | {r['observed']:.3f} | {r['predicted']:.3f} | {r['difference']:+.3f} "
                    f"[{r['difference_interval'][0]:+.3f}, {r['difference_interval'][1]:+.3f}] | "
                    f"{'yes' if r['drifted'] else ''} |" for r in verdict.get("positions", [])]


def prompt_ids(args):
    """The shipped pair, and the run's prompts (the task's first --limit) encoded as a run encodes them."""
    from dspark_bench.harness.models import load_pair
    from dspark_bench.tasks import load_prompts
    from dspark_bench.tasks.prompts import encode

    pair = load_pair(device="cpu")
    return pair, [encode(pair.tokenizer, p.text, "auto") for p in load_prompts(args.task, None, "train", None, None,
                                                                               args.limit)[0]]


if __name__ == "__main__":
    main()

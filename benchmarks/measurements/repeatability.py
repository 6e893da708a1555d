"""How far measured speedups move between identical runs, idle and with another process busy.

Runs the same two policies (top1 threshold 0.3 γ≤4 and fixed γ=4, on the code task) `--runs`
times in each condition — idle; with a CPU hog (a busy-looping subprocess this script starts and
stops, bounded in time) and torch's default threads; with the hog and `--threads 1` — and
reports, per condition and policy, the median measured speedup, its spread across runs
((max - min) / median) and the timing-health verdicts the runs gave themselves. Then, unless
`--no-sweep`, the README's first command (`sweep --task code --limit 4 --confirm-top 1`) once
idle and once with the hog, with the verdict each printed.

    python -m benchmarks.measurements.repeatability --runs 3 --limit 4

Run it on an otherwise idle machine: the hog is the only other process it means to measure.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common

POLICIES = ["--schedule", "threshold", "--schedule", "fixed", "--threshold", "0.3", "--gamma-max", "4"]
HOG = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


@contextlib.contextmanager
def hog(seconds: float):
    """One busy-looping process for at most `seconds`, stopped on the way out."""
    process = subprocess.Popen([sys.executable, "-c", HOG.format(seconds=seconds)])
    try:
        time.sleep(0.5)
        yield process
    finally:
        process.kill()
        process.wait()


def cli(*args: str) -> tuple[Path, str]:
    """Run `dspark-bench ARGS --out <tmp>`; returns the run folder and what it printed."""
    out = Path(tempfile.mkdtemp())
    done = subprocess.run([sys.executable, "-m", "dspark_bench.cli", *args, "--out", str(out)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"dspark-bench {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    (folder,) = [p for p in out.iterdir() if p.is_dir() and p.name[0].isdigit()]
    return folder, done.stdout


def one_run(limit: int, threads: int | None) -> dict:
    folder, _ = cli("run", "--task", "code", "--limit", str(limit), *POLICIES,
                    *(["--threads", str(threads)] if threads else []))
    summary = json.loads((folder / "summary.json").read_text())
    return {"speedups": {row["config_label"]: row["speedup"] for row in summary["configs"]},
            "verdict": summary["timing_health"]["verdict"]}


def condition(name: str, runs: int, limit: int, threads: int | None, busy: bool) -> list[str]:
    results = []
    for i in range(runs):
        with hog(900) if busy else contextlib.nullcontext():
            results.append(one_run(limit, threads))
        print(f"  {name} run {i + 1}: {results[-1]}", flush=True)
    lines = []
    for label in results[0]["speedups"]:
        values = [r["speedups"][label] for r in results]
        median = statistics.median(values)
        lines.append(f"| {name} | {label} | {median:.3f}× | {', '.join(f'{v:.3f}' for v in values)} | "
                     f"{(max(values) - min(values)) / median:.1%} | {', '.join(r['verdict'] for r in results)} |")
    return lines


def sweep_once(busy: bool) -> str:
    with hog(900) if busy else contextlib.nullcontext():
        folder, printed = cli("sweep", "--task", "code", "--limit", "4", "--confirm-top", "1")
    summary = json.loads((folder / "summary.json").read_text())
    table = printed[printed.index("policies searched by replay"):]
    return f"{'with the hog' if busy else 'idle'} → {summary['timing_health']['verdict']}\n{table}"


def main() -> None:
    parser = common.parser(__doc__, limit=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-sweep", action="store_true")
    args = parser.parse_args()
    rows = ["| condition | policy | median speedup | runs | spread (max − min) / median | timing health |",
            "|---|---|---:|---|---:|---|"]
    rows += condition("idle", args.runs, args.limit, None, busy=False)
    rows += condition("hog, default threads", args.runs, args.limit, None, busy=True)
    rows += condition("hog, --threads 1", args.runs, args.limit, 1, busy=True)
    print("\n".join(rows), flush=True)
    if not args.no_sweep:
        print(sweep_once(busy=False), flush=True)
        print(sweep_once(busy=True), flush=True)


if __name__ == "__main__":
    main()

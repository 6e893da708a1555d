"""What a batch's joins cost when a second cache grows beside a first (a benchmark, not a test):
the target's batched cache (decoding/batch_lm.py) filled with --task's first 8 prompts, one join at a
time, then a second one beside it, as the runner's two sides fill theirs, each join timed.

On glibc a process hands freed memory back, so whichever cache grows second pays for mapping what the
first holds (harness/allocator.py). `--keep` keeps freed memory mapped first, as `run` and `sweep` do
(each mode in a process of its own: the allocator's setting is the process's). Prints each join's
milliseconds, the first fill, then the second, --rounds times.

    python -m benchmarks.measurements.cache_growth --task long-code
    python -m benchmarks.measurements.cache_growth --task long-code --keep
"""

from __future__ import annotations

import time

import torch

from benchmarks import common
from dspark_bench.decoding.batch_lm import BatchLM
from dspark_bench.harness.allocator import keep_freed_memory
from dspark_bench.harness.models import load_pair
from dspark_bench.tasks import load_prompts
from dspark_bench.tasks.prompts import encode


def fill(lm: BatchLM, ids: list[list[int]]) -> list[int]:
    """Each join's milliseconds, the prompts joining `lm` one after the other."""
    taken = []
    for prompt in ids:
        start = time.perf_counter()
        lm.add(prompt[:-1])
        taken.append(round((time.perf_counter() - start) * 1e3))
    return taken


def main() -> None:
    argv = common.parser(__doc__, task="long-code", limit=8)
    argv.add_argument("--keep", action="store_true", help="keep freed memory mapped first (as run and sweep do)")
    argv.add_argument("--rounds", type=int, default=2, help="first and second fills, each round afresh (default 2)")
    args = argv.parse_args()
    if args.keep and not keep_freed_memory():
        raise SystemExit("--keep needs glibc's allocator (mallopt); this C library has none")
    pair = load_pair(None, None, "cpu", pair="long" if args.task.startswith("long") else "short")
    ids = [encode(pair.tokenizer, p.text, "auto") for p in load_prompts(args.task, None, limit=args.limit)[0]]
    print(f"{args.task}: {len(ids)} prompts of {min(map(len, ids))}-{max(map(len, ids))} tokens; "
          f"freed memory {'kept mapped' if args.keep else 'as glibc leaves it'}; ms per join")
    with torch.inference_mode():
        for round_ in range(args.rounds):
            first = BatchLM(pair.target)
            print(f"round {round_ + 1}, first cache:  {fill(first, ids)}")
            second = BatchLM(pair.target)
            print(f"round {round_ + 1}, second cache: {fill(second, ids)}")
            del first, second


if __name__ == "__main__":
    main()

"""The benchmarks' one CLI convention: each script builds its parser with `parser(__doc__, ...)`,
which adds the arguments the scripts share, each only when the script names it, with the script's
own default; the script then adds what is its alone.

    from benchmarks.common import parser  # each script runs as `python -m benchmarks.<folder>.<name>`
    args = parser(__doc__, sweep=True, limit=40, repeats=1, out="results").parse_args()

Shared: `sweep` (positional: a finished replay sweep's run folder, checked to hold summary.json),
`--task`, `--limit`, `--max-new-tokens`, `--repeats`, `--out` (a folder). `--help` prints the
script's docstring's first paragraph, its arguments, and the docstring's indented command lines.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def sweep_folder(text: str) -> Path:
    """A finished sweep's run folder (it holds summary.json), for argparse."""
    folder = Path(text)
    if not (folder / "summary.json").is_file():
        raise argparse.ArgumentTypeError(f"{folder} is not a finished sweep's folder (no summary.json)")
    return folder


def parser(doc: str, *, sweep: bool = False, task: str | None = None, limit: int | None = None,
           max_new_tokens: int | None = None, repeats: int | None = None,
           out: str | Path | None = None) -> argparse.ArgumentParser:
    """An argument parser described by the script's docstring, with the shared arguments asked for
    (an argument left at None is not added)."""
    first, _, rest = doc.strip().partition("\n\n")
    usage = "\n".join(line for line in rest.splitlines() if line.startswith("    "))  # its indented commands
    result = argparse.ArgumentParser(description=" ".join(first.split()), epilog=usage or None,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if sweep:
        result.add_argument("sweep", type=sweep_folder, help="a finished replay sweep's run folder")
    if task is not None:
        result.add_argument("--task", default=task, help=f"a built-in task (default {task})")
    if limit is not None:
        result.add_argument("--limit", type=int, default=limit, help=f"prompts (default {limit})")
    if max_new_tokens is not None:
        result.add_argument("--max-new-tokens", type=int, default=max_new_tokens,
                            help=f"new tokens per prompt (default {max_new_tokens})")
    if repeats is not None:
        result.add_argument("--repeats", type=int, default=repeats,
                            help=f"timed repeats per prompt (default {repeats})")
    if out is not None:
        result.add_argument("--out", type=Path, default=Path(out), help=f"output folder (default {out})")
    return result

"""The house's counts (issue 63's before → after table): `python tools/house_counts.py [ROOT]`.

Each line is one count, measured on the checkout at ROOT (default: this one) from its files alone,
so the same command on an older commit's worktree gives the "before" column.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path


def modules(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def long_functions(path: Path, limit: int = 60) -> list[str]:
    tree = ast.parse(path.read_text())
    return [f"{path.name}:{node.name}" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit]


def private_imports(path: Path) -> list[str]:
    """`from dspark_bench.x import _name` (dunders aside: `__version__` is public)."""
    tree = ast.parse(path.read_text())
    return [f"{path.name}:{alias.name}" for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dspark_bench")
            for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]


def imports_torch(path: Path) -> bool:
    return bool(re.search(r"^\s*(import torch|from torch\b)", path.read_text(), re.M))


# A schedule's flag read (schedules.of(c).by_depth, s.whole_batch, ...; CostModel.by_depth, a cost model's
# depth axis, is another thing), or asked for (where(table, by_depth=True)).
SCHEDULE_FLAG = r"(schedules\.(of|named)\([^)]*\)|\bschedule|\bs)\.{0}\b|{0}=True"


def files_reading(package: Path, pattern: str) -> int:
    """Modules whose code holds `pattern` (a string key read, a flag named)."""
    return sum(bool(re.search(pattern, p.read_text())) for p in modules(package))


def package_map_misses(root: Path) -> list[str]:
    """Modules of dspark_bench/ that the README's package map (its "## The package" section) never names."""
    readme = (root / "README.md").read_text()
    section = readme.split("## The package", 1)[-1].split("\n## ", 1)[0]
    return [str(p.relative_to(root)) for p in modules(root / "dspark_bench")
            if p.stem not in ("__init__", "__main__") and f"`{p.name}`" not in section
            and f"`{p.parent.name}/{p.name}`" not in section]


def counts(root: Path) -> dict[str, object]:
    package = root / "dspark_bench"
    found = modules(package)
    replay = [p for p in found if p.parent == package / "replay"]
    bench = [p for p in (root / "benchmarks").rglob("*") if p.is_file() and p.suffix in (".py", ".sh")
             and "__pycache__" not in p.parts]
    return {
        "package lines (dspark_bench/*.py)": sum(lines(p) for p in found),
        "replay/ modules importing torch": f"{sum(map(imports_torch, replay))} of {len(replay)}",
        "modules over 400 lines": len([p for p in found if lines(p) > 400]),
        "`# Long:` waivers": sum("# Long:" in p.read_text() for p in found),
        "functions over 60 lines": len([f for p in found for f in long_functions(p)]),
        "files at the package root": len(list(package.glob("*.py"))),
        "private names imported across modules": len([i for p in found for i in private_imports(p)]),
        'files reading the "sampling" key': files_reading(package, r"""\[["']sampling["']\]|get\(["']sampling["']"""),
        'files reading the "depth_search" key': files_reading(package, r"""["']depth_search["']"""),
        "files reading a schedule's by_depth": files_reading(package, SCHEDULE_FLAG.format("by_depth")),
        "files reading a schedule's whole_batch": files_reading(package, SCHEDULE_FLAG.format("whole_batch")),
        "benchmarks/ scripts": len(bench),
        "benchmarks/ lines": sum(lines(p) for p in bench),
        "modules the README's package map misses": len(package_map_misses(root)),
    }


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    for name, value in counts(root).items():
        print(f"{name}: {value}")

"""Count the places that branch on a schedule's name outside its own module (dspark_bench/schedules.py).

    python tools/schedule_branches.py [PACKAGE_DIR]    # default: dspark_bench

A branch is a comparison (==, !=, in, not in, a table's .isin) with a schedule's name written as a string ("fixed",
"goodput", ...) or with a tuple named for schedules (COST_AWARE, SCHEDULES), or one whose other side reads
a `schedule` (`config.stopping.schedule == …`, `table["schedule"] != …`). Constructing a policy
with a schedule's name (`DecodeConfig.of(schedule="fixed")`) is not a branch, but it is a
*literal*: a schedule's name written as a keyword's value (`schedule="fixed"`: use
`schedules.BASELINE` or the registry), or the learned metric's name compared (`== "learned"`: use
`config.LEARNED`). `literals` finds those. Prints each one and the counts; tests/test_layers.py
holds both at 0.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

NAMES = {"threshold", "ramp", "cumulative", "fixed", "goodput", "budget", "depth", "sglang-adaptive",
         "trtllm-schedule", "vllm-adaptive"}
GROUPS = {"COST_AWARE", "SCHEDULES", "THRESHOLD_SCHEDULES"}


def reads_schedule(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "schedule"
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(key, ast.Constant) and key.value == "schedule"
    return isinstance(node, ast.Name) and node.id == "schedule"


def names_schedule(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, ast.Name):
        return node.id in GROUPS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(names_schedule(e) for e in node.elts)
    if isinstance(node, ast.Starred):
        return names_schedule(node.value)
    return False


def branches(path: Path) -> list[int]:
    """Line numbers of `path`'s comparisons of a schedule with a schedule's name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "isin" and any(
                names_schedule(a) for a in node.args):
            found.append(node.lineno)  # table["schedule"].isin(["fixed", ...])
            continue
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if not all(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
            continue
        if any(reads_schedule(s) for s in sides) and any(names_schedule(s) for s in sides):
            found.append(node.lineno)
        elif any(names_schedule(s) and not isinstance(s, ast.Constant) for s in sides) and any(
                isinstance(s, (ast.Subscript, ast.Attribute, ast.Name)) for s in sides):
            found.append(node.lineno)  # x in COST_AWARE: a schedule's name tested by group
    return found


METRIC_NAMES = {"learned"}  # the metric with a constant of its own (config.LEARNED)


def literals(path: Path) -> list[int]:
    """Line numbers of `path`'s schedule names written as a `schedule=` keyword's value, and its
    comparisons with the learned metric's name written as a string."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.keyword) and node.arg == "schedule" and isinstance(node.value, ast.Constant) \
                and node.value.value in NAMES:
            found.append(node.value.lineno)
        elif isinstance(node, ast.Compare) and any(isinstance(s, ast.Constant) and s.value in METRIC_NAMES
                                                   for s in [node.left, *node.comparators]):
            found.append(node.lineno)
    return sorted(found)


def count(package: Path, find=branches) -> list[str]:
    """Every place `find` finds outside the registries (schedules.py; config.py declares the names)."""
    own = {package / "schedules.py", package / "config.py"} if find is literals else {package / "schedules.py"}
    return [f"{path.relative_to(package.parent)}:{line}" for path in sorted(package.rglob("*.py"))
            if path not in own for line in find(path)]


if __name__ == "__main__":
    package = Path(sys.argv[1] if len(sys.argv) > 1 else "dspark_bench")
    found, written = count(package), count(package, literals)
    print("\n".join(found + written))
    print(f"{len(found)} branches on a schedule's name outside schedules.py; "
          f"{len(written)} schedule or metric names written as literals outside the registries")

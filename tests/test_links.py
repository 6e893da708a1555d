"""No dead links: every relative link in README.md and docs/*.md reaches a file of the repository
(and a heading, where it names an anchor), and no source file cites a repository file that is
not there."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import typer

from dspark_bench.cli import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = sorted(p for folder in ("dspark_bench", "benchmarks", "tests") for p in (ROOT / folder).rglob("*")
                 if p.suffix in (".py", ".sh") and "__pycache__" not in p.parts)
# Files that live outside this repository: a citation of one is a dead link.
OUTSIDE = ("DESIGN.md", "STYLE.md")

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target) and [text](target "title")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
DOC_PATH = re.compile(r"\bdocs/[\w.-]+\.md\b")
ROOT_COMMAND = typer.main.get_command(app)


def prose(text: str) -> str:
    """The page without its code blocks and code spans, where brackets are not links."""
    return CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation but hyphens and spaces dropped,
    spaces to hyphens (markdown emphasis and code marks are punctuation too)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's slug, numbered -1, -2 ... when repeated, as GitHub numbers them."""
    seen: dict[str, int] = {}
    result = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        base = slug(heading)
        result.add(f"{base}-{seen[base]}" if base in seen else base)
        seen[base] = seen.get(base, 0) + 1
    return result


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text()))


def broken(page: Path, target: str) -> str | None:
    """Why a relative link of `page` is dead, or None."""
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    if not file.exists():
        return f"{file.relative_to(ROOT) if file.is_relative_to(ROOT) else file} does not exist"
    if not file.is_relative_to(ROOT):
        return "points outside the repository"
    if anchor and file.suffix == ".md" and anchor not in anchors(file):
        return f"{file.relative_to(ROOT)} has no heading #{anchor}"
    return None


def test_slug_follows_github():
    assert slug("Sweeps, replay, reports and calibration") == "sweeps-replay-reports-and-calibration"
    assert slug("`calibrate`, and decoding with a calibration") == "calibrate-and-decoding-with-a-calibration"
    assert slug("llama.cpp, for real") == "llamacpp-for-real"
    assert slug("On a GPU: `--draft-mode`, `benchmarks/gpu.sh`") == "on-a-gpu---draft-mode-benchmarksgpush"


def test_pages_found():
    assert (ROOT / "README.md") in PAGES and len(PAGES) > 5
    assert any(links(page) for page in PAGES)  # the link pattern matches what the pages use


def test_every_relative_link_resolves():
    dead = []
    for page in PAGES:
        for target in links(page):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
                continue
            reason = broken(page, target)
            if reason:
                dead.append(f"{page.relative_to(ROOT)}: ({target}) — {reason}")
    assert not dead, "dead links:\n" + "\n".join(dead)


def test_no_source_cites_a_missing_file():
    dead = []
    for source in SOURCES:
        if source == Path(__file__).resolve():
            continue  # this file names them to look for them
        for number, line in enumerate(source.read_text().splitlines(), 1):
            where = f"{source.relative_to(ROOT)}:{number}"
            dead += [f"{where}: cites {name}, which is not in the repository" for name in OUTSIDE if name in line]
            dead += [f"{where}: cites {path}, which does not exist" for path in DOC_PATH.findall(line)
                     if not (ROOT / path).is_file()]
    assert SOURCES and not dead, "citations of missing files:\n" + "\n".join(dead)


# A path into benchmarks/ ("benchmarks/checks/load.py") and a script run as a module ("python -m benchmarks.gpu").
BENCHMARK_PATH = re.compile(r"(?<![\w/.-])benchmarks/[\w/.-]*\w")
BENCHMARK_MODULE = re.compile(r"\bpython3? -m (benchmarks(?:\.\w+)+)")


def module_file(module: str) -> Path:
    """Where `python -m MODULE` finds its code: the module's file, or a package's __main__.py."""
    path = ROOT.joinpath(*module.split("."))
    return path / "__main__.py" if path.is_dir() else path.with_suffix(".py")


def benchmark_scripts() -> list[Path]:
    """What benchmarks/ runs: its shell scripts and every module with a main guard (the rest are
    the parts those import: benchmarks/common.py, the GPU run's stages)."""
    files = sorted((ROOT / "benchmarks").rglob("*"))
    return [p for p in files
            if p.suffix == ".sh" or (p.suffix == ".py" and 'if __name__ == "__main__"' in p.read_text())]


def cited_as(script: Path) -> tuple[str, ...]:
    """The ways a page names a script: its path, and as a module (`python -m benchmarks.gpu`)."""
    relative = script.relative_to(ROOT)
    module = ".".join(relative.with_suffix("").parts).removesuffix(".__main__")
    return (str(relative),) if script.suffix == ".sh" else (str(relative), f"-m {module}")


def test_every_benchmark_script_is_cited_from_a_docs_page():
    """No script in benchmarks/ that no page explains: each check and measurement is cited from
    docs/ (docs/measurements.md lists them all), so that an orphan cannot come back."""
    pages = "\n".join(page.read_text() for page in PAGES if page.parent.name == "docs")
    scripts = benchmark_scripts()
    orphans = [str(s.relative_to(ROOT)) for s in scripts
               if not any(re.search(re.escape(name) + r"(?![\w/])", pages) for name in cited_as(s))]
    assert len(scripts) > 20 and not orphans, "scripts in benchmarks/ no docs page cites:\n" + "\n".join(orphans)


def test_every_benchmarks_path_and_command_cited_exists():
    """A page or a source that names a path in benchmarks/ or runs a benchmark as a module names one
    that is there (a script since removed is named as such)."""
    dead = []
    for source in [*PAGES, *SOURCES]:
        if source == Path(__file__).resolve():
            continue  # its examples name the old paths
        for number, line in enumerate(source.read_text().splitlines(), 1):
            where = f"{source.relative_to(ROOT)}:{number}"
            dead += [f"{where}: {path} does not exist" for path in BENCHMARK_PATH.findall(line)
                     if not (ROOT / path).exists() and "since removed" not in line]
            dead += [f"{where}: python -m {module}: no {module_file(module).relative_to(ROOT)}"
                     for module in BENCHMARK_MODULE.findall(line) if not module_file(module).is_file()]
    assert not dead, "citations of benchmarks that are not there:\n" + "\n".join(dead)


# "`dspark-bench sweep …`" and the counts a page states for it: "N policies", "N (held-out) (code) prompts".
COMMAND = re.compile(r"dspark-bench sweep((?: +(?:--?[\w-]+|[\w./,][\w./,-]*))*)")  # values may hold "-"
COUNT = re.compile(r"\b(\d[\d,]*) (policies|(?:held-out )?(?:code )?prompts)\b(?! ?/)")


def blocks(text: str) -> list[str]:
    """A page in the pieces a count belongs to: a table row, a line of a code block, a sentence."""
    pieces, fenced = [], False
    for paragraph in re.split(r"\n\s*\n", text):
        lines = paragraph.splitlines()
        for line in lines:
            fenced ^= line.lstrip().startswith("```")
            if fenced or line.startswith("|"):
                pieces.append(line)
        prose = " ".join(line for line in lines if not (line.startswith("|") or line.lstrip().startswith("```")))
        if not fenced and not any(line.lstrip().startswith("```") for line in lines):
            pieces += re.split(r"(?<=[.;!?])\s+(?=[A-Z(*`])", prose)
    return pieces


def stated_counts(text: str):
    """(command's arguments, number, "policies" | "prompts") for each count a page states beside a
    `dspark-bench sweep` command, in the same table row, code line or sentence (the nearest
    command before it, else after it)."""
    for block in blocks(text):
        commands = [(m.start(), m.end(), m.group(1).split()) for m in COMMAND.finditer(block)]
        for count in COUNT.finditer(block):
            before = [args for _, end, args in commands if end <= count.start()]
            after = [args for start, _, args in commands if start >= count.end()]
            if before or after:
                number, kind = int(count.group(1).replace(",", "")), count.group(2).split()[-1]
                yield (before[-1] if before else after[0]), number, kind


@functools.lru_cache(maxsize=None)
def what_sweep_does(args: tuple[str, ...]) -> dict:
    """The policies a `sweep` with `args` replays, and its prompts, from its plan (no model loads)."""
    from dspark_bench.config import SEARCHABLE_FIELDS, DecodeConfig
    from dspark_bench.tuning.replay_sweep import replay_space
    from dspark_bench.tuning.sweep_plan import replayed_count
    from dspark_bench.tuning.spec import SweepSpec, points
    from dspark_bench.tuning.spec_files import command_overrides, resolve_spec

    params = ROOT_COMMAND.commands["sweep"].make_context("sweep", list(args)).params
    known = {f for f in SweepSpec.__dataclass_fields__} | set(SEARCHABLE_FIELDS)
    flags = {k: v for k, v in params.items() if k in known and k not in ("spec",)}
    flags["precision_budget_s"] = params.get("precision_budget_s")
    spec, _ = resolve_spec(params["spec"], command_overrides(flags, params.get("set_") or []))
    base = DecodeConfig.of(max_new_tokens=64, temperature=spec.temperature, top_p=spec.top_p)  # sampled: no learned
    return {"policies": replayed_count(replay_space(points(spec, base), base)), "prompts": spec.limit}


def test_every_count_a_page_states_for_a_sweep_is_what_it_does_today():
    """A page that says `dspark-bench sweep --task code` replays N policies on M prompts says what
    that command does now (its plan's count): no page states a count a change left behind."""
    checked, wrong = 0, []
    for page in PAGES:
        for args, number, kind in stated_counts(page.read_text()):
            if "--evaluation" in args or "--trials" in args:  # real (timed) sweeps state no replay count
                continue
            today = what_sweep_does(tuple(args))[kind]
            checked += 1
            if number != today:
                wrong.append(f"{page.relative_to(ROOT)}: `dspark-bench sweep {' '.join(args)}` — {number:,} {kind} "
                             f"stated, {today:,} today")
    assert checked >= 3 and not wrong, "\n".join(wrong)


def test_stated_counts_are_found_where_they_are_written():
    text = ("run `dspark-bench sweep --task code --limit 4`: it replays 3,486 policies on 4 prompts. Then 7 policies\n"
            "more. On 40 prompts (`dspark-bench sweep --limit 40`) too.\n\n"
            "| `dspark-bench sweep --task code` (20 held-out prompts) | 12 policies |\n| other | 9 policies |\n\n"
            "```bash\ndspark-bench sweep --task code   # 5 policies\n"
            "dspark-bench run --batch-size 8   # 8 policies\n```")
    assert sorted(stated_counts(text)) == sorted([
        (["--task", "code", "--limit", "4"], 3486, "policies"), (["--task", "code", "--limit", "4"], 4, "prompts"),
        (["--limit", "40"], 40, "prompts"), (["--task", "code"], 20, "prompts"), (["--task", "code"], 12, "policies"),
        (["--task", "code"], 5, "policies")])


def package_map() -> dict[str, str]:
    """The README's package map: each row's package folder (core: "") -> the row's text."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## The package\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 2 and cells[0] not in ("package", "---"):
            folder = re.search(r"`([\w/]+)/`", cells[0])
            rows["" if cells[0].startswith("core") else folder.group(1)] = cells[1]
    return rows


def test_the_readme_package_map_names_every_module_in_its_row():
    """A module added, moved or renamed shows in the README's map, in its own package's row."""
    rows = package_map()
    package = ROOT / "dspark_bench"
    missing = [str(p.relative_to(package)) for p in sorted(package.rglob("*.py"))
               if p.stem not in ("__init__", "__main__") and "__pycache__" not in p.parts
               and f"`{p.name}`" not in rows.get(str(p.parent.relative_to(package)).replace(".", ""), "")]
    assert missing == []
    assert {"", "decoding", "replay", "measure", "sections", "reporting/plots"} <= set(rows)

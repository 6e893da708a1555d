"""The long-context tasks (long-code, long-prose) and the reference pair a task is built for.

Building a long task reads the held-out corpus and, for long-prose, every training docstring (to
skip prompts that are training text): the first load takes a while, later ones hit the builders'
caches, shared with tests/test_tasks.py's when the suite runs in one process.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from dspark_bench.cli import app
from dspark_bench.depth import depth_label
from dspark_bench.errors import DsparkError
from dspark_bench.reference.corpus import split_of
from dspark_bench.reference.long import LONG_CONTEXT
from dspark_bench.tasks import builders, get_task, length_buckets, load_prompts, load_task, pair_of, validate_task_file
from dspark_bench.tasks.prompts import encode

runner = CliRunner()
LONG = ["long-code", "long-prose"]
BUCKETS = ["256-1k", "1k-2k", "2k-4k"]


def tokens(text: str) -> int:
    """A prompt's length as a run encodes it with the reference pair's tokenizer."""
    return len(encode(builders.reference_tokenizer(), text))


@pytest.mark.parametrize("name", LONG)
def test_a_long_task_spans_its_buckets_evenly_from_held_out_documents(name):
    spec = get_task(name)
    prompts = load_task(name)
    lengths = [tokens(p.text) for p in prompts]
    assert (spec.pair, len(prompts), spec.max_new_tokens) == ("long", 24, 128)
    assert length_buckets(spec) == BUCKETS
    # Every prompt, its 128 new tokens and a margin of 16 fit the long pair's context.
    assert all(512 <= n and n + 128 + 16 <= LONG_CONTEXT for n in lengths), lengths
    assert min(lengths) < 600 and max(lengths) >= 3500, (min(lengths), max(lengths))
    assert [p.category for p in prompts] == [depth_label(n) for n in lengths]
    assert Counter(p.category for p in prompts) == {bucket: 8 for bucket in BUCKETS}
    documents = [builders.document_of(p.id) for p in prompts]
    assert len(set(documents)) == 24 and all(split_of(key) == "heldout" for key in documents)
    training = builders.training_text(builders.CORPUS_DOMAIN[spec.source])
    assert not [p.id for p in prompts if p.text in training]
    if name == "long-code":  # the file up to a function's docstring: the next line is its body
        assert all(p.text.endswith("\n") and "def " in p.text for p in prompts)
    else:  # the document up to a sentence's end
        assert all(p.text[-1] in ".!?:" for p in prompts)


@pytest.mark.parametrize("name", LONG)
def test_long_task_selection_is_seeded_and_a_limit_takes_each_bucket_in_turn(name):
    first = load_task(name)
    assert load_task(name) == first
    assert load_task(name, limit=4) == first[:4]
    assert [p.category for p in first[:6]] == BUCKETS * 2
    other = load_task(name, seed=1)
    assert other != first and Counter(p.category for p in other) == {bucket: 8 for bucket in BUCKETS}


def test_pair_of_is_long_where_any_named_task_is_built_for_the_long_pair():
    assert [pair_of(task) for task in ("long-code", "long-prose", "code", "code,long-code", " code , prose ")] \
        == ["long", "long", "short", "long", "short"]
    assert pair_of(None) == "short"
    with pytest.raises(DsparkError, match="unknown task 'long-cod'"):
        pair_of("code,long-cod")


def test_a_task_file_is_checked_for_its_pair_and_token_bounds(tmp_path):
    def task(extra: str):
        path = tmp_path / "t.yaml"
        path.write_text("name: t\ndomain: code\ndescription: d\n" + extra)
        return path

    good = validate_task_file(task("source: heldout_long_code\npair: long\ncount: 6\n"
                                   "min_prompt_tokens: 300\nmax_prompt_tokens: 1500\n"))
    assert (good.pair, length_buckets(good)) == ("long", ["256-1k", "1k-2k"])
    assert validate_task_file(task("source: heldout_code\n")).pair == "short"
    refused = {"pair: medium\nsource: heldout_code\n": "pair must be one of short, long",
               "source: heldout_long_code\n": "min_prompt_tokens / max_prompt_tokens bound",
               "source: heldout_code\nmax_prompt_tokens: 900\n": "min_prompt_tokens / max_prompt_tokens bound",
               "source: heldout_long_code\nmin_prompt_tokens: 900\nmax_prompt_tokens: 600\n": "0 < min_prompt_tokens",
               "source: heldout_long_code\ncount: 7\nmin_prompt_tokens: 300\nmax_prompt_tokens: 1500\n":
                   "count 7 must be a multiple of the 2 length buckets its prompts span"}
    for extra, message in refused.items():
        with pytest.raises(DsparkError, match=message):
            validate_task_file(task(extra))


def test_a_missing_long_pair_is_one_line_saying_how_to_build_it(tmp_path, monkeypatch):
    from dspark_bench.harness import models

    monkeypatch.setattr(models, "long_pair_paths", lambda: (tmp_path / "long" / "target", tmp_path / "long" / "draft"))
    with pytest.raises(DsparkError, match=r"run `dspark-bench models build --long`") as refused:
        models.load_pair(pair="long")
    assert "\n" not in str(refused.value) and str(tmp_path / "long") in str(refused.value)
    assert models.default_pair() == tuple(str(p) for p in models.default_pair_paths())  # the short pair as before


class Loaded(Exception):
    """Raised by the stand-in load_pair: which pair a command asked for, before any model loads."""


@pytest.mark.parametrize("module, command", [
    ("dspark_bench.harness.run", ["run", "--limit", "1"]),
    ("dspark_bench.tuning.preparation", ["sweep", "--limit", "1"]),
    ("dspark_bench.engines.continuations", ["continuations", "prompts", "--limit", "1"]),
    ("dspark_bench.tuning.calibrate", ["calibrate", "--limit", "1"]),
])
def test_commands_load_the_long_pair_for_a_long_task_and_the_short_one_otherwise(module, command, monkeypatch,
                                                                                 tmp_path):
    import importlib

    asked = []

    def load_pair(*args, pair="short", **kwargs):
        asked.append(pair)
        raise DsparkError(f"stand-in load_pair: {pair}")

    monkeypatch.setattr(importlib.import_module(module), "load_pair", load_pair)
    option = "--tasks" if command[0] == "calibrate" else "--task"
    for task in ("long-code", "code", "structured,long-code"):
        result = runner.invoke(app, [*command, option, task, "--out", str(tmp_path / f"{len(asked)}.out")])
        assert result.exit_code == 1, result.output
    assert asked == ["long", "short", "long"]


def test_a_users_long_prompts_are_not_cut(tmp_path):
    """The 400-character cut is the 256-token tasks' (max_prompt_chars): a dataset's prompts load whole."""
    long_text = "Summarize the following article. " + "The committee met again on Tuesday. " * 200
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"prompt": long_text, "category": "summarization"}) + "\n")
    (prompt,), source, _ = load_prompts(None, str(path))
    assert (prompt.text, prompt.category, len(prompt.text)) == (long_text, "summarization", 7233)

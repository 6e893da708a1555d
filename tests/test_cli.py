"""The CLI, driven through a runner with every output in a temp folder."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import tiny
from cli_helpers import folder_digest, invoke  # noqa: E402


@pytest.fixture(scope="module")
def first_run(saved_pair, prompts_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    target, draft = saved_pair
    result = invoke("run", "--target", target, "--draft", draft, "--dataset", prompts_file, "--out", out,
                    "--threshold", "0.2", "--threshold", "0.6", "--gamma-max", "4", "--max-new-tokens", "16",
                    "--repeats", "1", "--trace")
    assert result.exit_code == 0, result.output
    (folder,) = [p for p in out.iterdir() if not p.name.startswith(".")]
    return out, folder, result


def test_run_writes_a_complete_run_folder(first_run):
    out, folder, result = first_run
    assert {p.name for p in folder.iterdir()} == {"run.json", "samples.parquet", "rounds.parquet", "summary.json"}
    samples = pd.read_parquet(folder / "samples.parquet")
    assert len(samples) == 3 * 2  # prompts × thresholds
    assert samples["identical_to_baseline"].all()
    assert (samples["new_tokens"] == 16).all()
    rounds = pd.read_parquet(folder / "rounds.parquet")
    per_sample = rounds.groupby(["prompt_id", "config_id"])["emitted"].sum()
    assert (per_sample == 16).all()
    info = json.loads((folder / "run.json").read_text())
    assert [c["threshold"] for c in info["configs"]] == [0.2, 0.6]
    assert info["prompts"]["count"] == 3 and len(info["prompts"]["fingerprint"]) == 16
    summary = json.loads((folder / "summary.json").read_text())
    assert {row["category"] for row in summary["by_category"]} == {"code", "prose"}
    assert "speedup" in result.output and "run folder" in result.output
    # The plan comes first, with its estimate; the machine is recorded with the numbers.
    assert "plan: 3 prompts × 2 configurations × 1 timed pair × 16 tokens ≈" in result.output
    assert result.output.index("plan:") < result.output.index("run folder")
    machine = info["environment"]["machine"]
    assert machine["cpu"] and machine["cpu_cores"] >= 1 and machine["torch_threads"] >= 1
    assert {"blas", "gpu"} <= set(machine)
    # On a CPU nothing is captured (decoding/capture.py), and run.json says so.
    assert info["capture"] == {"default": "eager", "eager_flag": False, "mode": "eager", "policies": {"eager": 2}}
    assert info["config"]["eager"] is False


def test_decode_shows_rounds(saved_pair):
    target, draft = saved_pair
    result = invoke("decode", "def add(a, b):", "--target", target, "--draft", draft, "--max-new-tokens", "12")
    assert result.exit_code == 0, result.output
    assert "tokens_per_round=" in result.output and "stop reasons:" in result.output


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--threshold", "1.5"], "threshold must be in [0, 1] (got 1.5)"),
        (["--gamma-max", "0"], "gamma_max must be at least 1"),
        (["--min-draft-len", "6", "--gamma-max", "5"], "must not exceed"),
        (["--target", "/nonexistent/model"], "does not exist"),
        (["--draft", "MISMATCH"], "vocabularies differ"),
        (["--out", "UNWRITABLE"], "not writable"),
        (["--dataset", "/nonexistent/prompts.jsonl"], "does not exist"),
        (["--dataset", "EMPTY"], "empty.jsonl: the file is empty"),
        (["--dataset", "BINARY"], "binary.jsonl: not UTF-8 text"),
        (["--batch-size", "0"], "batch_size must be at least 1 (got 0)"),
        (["--batching", "sometimes"], "unknown --batching 'sometimes'; choose one of refill, drain"),
        (["--budget-layout", "bogus"], "unknown budget layout 'bogus'"),  # a knob of one value is checked too
        (["--ngram-min", "5"], "lookup needs 1 <= ngram_min <= ngram_max"),
        (["--calibration", "/nonexistent/calibration.yaml"],
         "calibration file '/nonexistent/calibration.yaml' does not exist"),
        (["--batch-size", "2", "--turns", "all"], "use --batch-size 1 with it"),
        (["--draft-mode", "sideways"], "unknown draft mode 'sideways'"),
        (["--draft-mode", "verify-side", "--batch-size", "2"], "verify-side runs at batch size 1 only"),
        (["--schedule", "depth"], "the depth schedule needs --depth-policy: a policy per depth bucket"),
        (["--schedule", "depth", "--depth-policy", "0.5/4;0.3/6"],
         "depth_policy entry '0.5/4;0.3/6' is not threshold/gamma_max nor metric:schedule:threshold/gamma_max/"
         "min_draft_len (e.g. '0.5/4,0.3/6,0.2/8')"),
    ],
)
def test_bad_inputs_fail_in_one_line(flags, message, first_run, saved_pair, prompts_file, tmp_path):
    out, folder, _ = first_run
    before = folder_digest(folder)
    target, draft = saved_pair
    if "MISMATCH" in flags:
        other = tiny.llama(vocab=tiny.VOCAB + 8)
        other.save_pretrained(tmp_path / "other")
        flags = [f if f != "MISMATCH" else str(tmp_path / "other") for f in flags]
    if "UNWRITABLE" in flags:
        blocker = tmp_path / "a-file"
        blocker.write_text("not a folder")
        flags = [f if f != "UNWRITABLE" else str(blocker / "results") for f in flags]
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "binary.jsonl").write_bytes(bytes(range(128, 256)) * 4)
    files = {"EMPTY": tmp_path / "empty.jsonl", "BINARY": tmp_path / "binary.jsonl"}
    flags = [str(files.get(f, f)) for f in flags]
    args = {"--target": target, "--draft": draft, "--dataset": str(prompts_file), "--out": str(out)}
    for i in range(0, len(flags), 2):
        args[flags[i]] = flags[i + 1]
    result = invoke("run", *[x for kv in args.items() for x in kv], "--max-new-tokens", "4", "--repeats", "1")
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert folder_digest(folder) == before
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [folder.name]


def test_decode_runs_a_depth_policy_named_on_the_command_line(saved_pair):
    """`--schedule depth --depth-policy`: its gamma_max the largest bucket's (the default 5 is not the policy's)."""
    target, draft = saved_pair
    result = invoke("decode", "def add(a, b):", "--target", target, "--draft", draft, "--max-new-tokens", "12",
                    "--schedule", "depth", "--depth-policy", "0.5/2,0.3/6")
    assert result.exit_code == 0, result.output
    assert "tokens_per_round=" in result.output


def test_padded_lm_heads_with_one_tokenizer_are_aligned(saved_pair, tmp_path):
    """Model families pad their LM heads differently (Qwen2.5 7B vs 0.5B); same tokenizer → allowed."""
    from dspark_bench.harness.models import load_pair

    target, _ = saved_pair
    padded = tiny.llama(vocab=tiny.VOCAB + 8, seed=5)
    _, draft = tiny.save_pair(tmp_path, tiny.llama(), padded)
    pair = load_pair(target, draft)
    assert pair.draft.get_output_embeddings().weight.shape[0] == tiny.VOCAB
    assert pair.target.get_output_embeddings().weight.shape[0] == tiny.VOCAB


def test_hub_ids_with_dots_are_not_taken_for_paths():
    from dspark_bench.errors import DsparkError
    from dspark_bench.harness.models import load_pair

    with pytest.raises(DsparkError) as err:
        load_pair("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct")
    assert "does not exist" not in str(err.value)


def test_run_config_reruns_the_same_run(first_run, tmp_path):
    out, folder, _ = first_run
    info = json.loads((folder / "run.json").read_text())
    assert info["config"]["grid"]["threshold"] == [0.2, 0.6] and info["config"]["dataset"]
    result = invoke("run", "--config", folder / "run.json", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    (again,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    rerun = json.loads((again / "run.json").read_text())
    assert rerun["configs"] == info["configs"] and rerun["prompts"]["fingerprint"] == info["prompts"]["fingerprint"]
    assert rerun["config"] == info["config"]
    old, new = (pd.read_parquet(f / "samples.parquet") for f in (folder, again))
    assert old["output_ids"].map(list).tolist() == new["output_ids"].map(list).tolist()  # greedy: the same ids


def test_run_config_refuses_changes(first_run, prompts_file, tmp_path):
    out, folder, _ = first_run
    result = invoke("run", "--config", folder / "run.json", "--threshold", "0.9", "--out", tmp_path)
    assert result.exit_code == 1 and "drop --threshold" in result.stderr
    # The prompts file changed since the run: a re-run would measure something else.
    info = json.loads((folder / "run.json").read_text())
    edited = tmp_path / "prompts.jsonl"
    edited.write_text(prompts_file.read_text().replace("quick brown", "slow grey"))
    info["config"]["dataset"] = str(edited)
    (tmp_path / "run.json").write_text(json.dumps(info))
    result = invoke("run", "--config", tmp_path / "run.json", "--out", tmp_path / "out")
    assert result.exit_code == 1 and "prompts of" in result.stderr and "changed" in result.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_a_corrupt_table_is_one_line(first_run, tmp_path):
    import shutil

    _, folder, _ = first_run
    copy = tmp_path / "run"
    shutil.copytree(folder, copy)
    (copy / "samples.parquet").write_bytes(b"not parquet at all")
    result = invoke("report", copy)
    assert result.exit_code == 1 and "cannot be read" in result.stderr and "Traceback" not in result.output
    bad = tmp_path / "prompts.parquet"
    bad.write_bytes(b"PAR1 but not really")
    result = invoke("run", "--dataset", bad, "--out", tmp_path / "out")
    assert result.exit_code == 1 and "not a readable Parquet file" in result.stderr


@pytest.mark.parametrize("content,message", [
    ('{"kind": "sweep", "run_id": "x"}', "is not a run's run.json"),
    ("[1, 2]", "is not a run's run.json"),
    ('{"kind": "run", "configs": [], "prompts": {"task": "code", "count": 2}, "models": {}}', "no policy"),
])
def test_run_config_refuses_what_is_not_a_run(content, message, tmp_path):
    (tmp_path / "run.json").write_text(content)
    result = invoke("run", "--config", tmp_path / "run.json", "--out", tmp_path / "out")
    assert result.exit_code == 1 and message in result.stderr and "Traceback" not in result.output


def test_decode_refuses_zero_new_tokens(saved_pair):
    target, draft = saved_pair
    result = invoke("decode", "x", "--target", target, "--draft", draft, "--max-new-tokens", "0")
    assert result.exit_code == 1 and "max_new_tokens must be at least 1" in result.stderr


def test_a_run_folder_says_its_timing_health(first_run):
    _, folder, _ = first_run
    timing = json.loads((folder / "summary.json").read_text())["timing_health"]
    assert {c["name"] for c in timing["checks"]} >= {"load_drift", "load_dispersion", "baseline_drift"}
    assert (timing["verdict"] in ("ok", "noisy", "unreliable")
            and timing["headline"].startswith(f"timings {timing['verdict']}"))


def test_the_runs_table_fits_100_columns_with_its_labels_on_one_line(first_run):
    """policy · speedup [95 % CI] · tokens per round · acceptance · draft length · = target, in 100
    columns, however long a label gets; `--wide` keeps every column."""
    import os

    from rich.console import Console

    from dspark_bench.cli.console import run_table, summary_table
    from dspark_bench.metrics import summarize

    out, folder, result = first_run
    table = summarize(pd.read_parquet(folder / "samples.parquet"))
    table["config_label"] = table["config_label"] + " · llama.cpp rule · B=32"  # a batched llama.cpp-rule run's labels
    screen = Console(width=100, record=True, file=open(os.devnull, "w"))
    screen.print(run_table(table, "3 prompts · cpu · float32 · a title long enough to wrap " * 3))
    lines = screen.export_text().splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 100
    for label, speedup in zip(table["config_label"], table["speedup"]):
        (line,) = [line for line in lines if label in line]  # whole, on one line, with its numbers
        assert f"{speedup:.3f} [" in line and line.rstrip().endswith("yes")  # greedy fp32: the target's own
    wide = Console(width=300, record=True, file=open(os.devnull, "w"))
    wide.print(summary_table(table, "wide"))
    assert "block acceptance rate" in wide.export_text()
    assert "speedup [95 % CI]" in result.output and "= target" in result.output

"""Exports checked by the engines' own code: llama.cpp by running llama-server with the flags
`export` writes, HF by a real assisted generate loading the files as the docs say, SGLang by its
own argument parser where it imports on this CPU, and the rest pinned to the engine versions
(and source lines) versions.py cites."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from dspark_bench.cli import app
from dspark_bench.config import DecodeConfig
from dspark_bench.engines.files import FILES, llamacpp_flags, parse, trtllm_lookup, trtllm_schedule
from dspark_bench.engines.versions import LLAMACPP_CURRENT, LLAMACPP_LEGACY, llamacpp_version, version_for
from dspark_bench.errors import DsparkError

runner = CliRunner()
POLICY = DecodeConfig.of(semantics="llamacpp", threshold=0.3, gamma_max=6, min_draft_len=1, max_new_tokens=32)


def llama_server_or_skip() -> Path:
    """The built llama-server; CI (DSPARK_REQUIRE_LLAMACPP=1, set by .ci/run, which builds it) fails without one."""
    from dspark_bench.engines.llama_server import find_server

    try:
        return find_server()
    except DsparkError as error:
        if os.environ.get("DSPARK_REQUIRE_LLAMACPP"):
            raise
        pytest.skip(f"no llama-server on this machine ({error}); .ci/run builds one with tools/build-llama-server.sh")


@pytest.fixture(autouse=True, scope="module")
def gguf_home(tmp_path_factory):
    """The pair's GGUF files of these tests go to a folder of their own, not the user's cache."""
    saved = os.environ.get("DSPARK_GGUF_HOME")
    os.environ["DSPARK_GGUF_HOME"] = str(tmp_path_factory.mktemp("gguf"))
    yield
    if saved is None:
        os.environ.pop("DSPARK_GGUF_HOME")
    else:
        os.environ["DSPARK_GGUF_HOME"] = saved


# --- versions ---------------------------------------------------------------------------------------


def test_llamacpp_builds_map_to_the_flag_names_of_their_time():
    assert llamacpp_version("b11434") is llamacpp_version("11434") is LLAMACPP_CURRENT
    assert llamacpp_version("b7000") is llamacpp_version("legacy") is LLAMACPP_LEGACY
    with pytest.raises(DsparkError, match="between the flag rename"):
        llamacpp_version("b9000")
    with pytest.raises(DsparkError, match="give a llama.cpp build"):
        llamacpp_version("newest")
    with pytest.raises(DsparkError, match="sglang exports are written for 0.5, 0.5-early "):
        version_for("sglang", "0.3.1")
    # SGLang's adaptive controller as replayed arrived in 0.5.14; before, the same fixed-length keys
    assert version_for("sglang", "0.5.14") is version_for("sglang", "0.5.23") is version_for("sglang")
    assert version_for("sglang", "0.5.9").name == version_for("sglang", "0.5.13").name == "0.5-early"
    assert version_for("vllm", "0.23.2").name == "legacy" and version_for("vllm", "0.33.0").name == "0.24"
    assert version_for("vllm", "0.34.0").name == "current" and version_for("vllm", "0.24").name == "0.24"
    # The current names (common/arg.cpp of b11434); --draft-max is removed there (arg_removed).
    current = llamacpp_flags(POLICY, "d.gguf", LLAMACPP_CURRENT)
    assert current == ["--spec-type", "draft-simple", "--spec-draft-model", "d.gguf", "--spec-draft-n-max", "6",
                       "--spec-draft-n-min", "1", "--spec-draft-p-min", "0.3"]
    assert llamacpp_flags(POLICY, "d.gguf", LLAMACPP_LEGACY) == [
        "--model-draft", "d.gguf", "--draft-max", "6", "--draft-min", "1", "--draft-p-min", "0.3"]
    fixed = llamacpp_flags(DecodeConfig.of(schedule="fixed", gamma_max=4, min_draft_len=2), "d", LLAMACPP_CURRENT)
    assert fixed[-4:] == ["--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]  # a fixed length: no p-min, no discard


def test_trtllm_schedule_round_trips_through_its_upper_bound_rule():
    """TensorRT-LLM reads draft_len_schedule's keys as inclusive upper bounds and does not speculate
    above the last (PR #10860): every measured batch size gets its own length back."""
    measured = {1: 5, 4: 4, 16: 2, 32: 2}
    schedule = trtllm_schedule(measured)
    assert all(trtllm_lookup(schedule, b) == k for b, k in measured.items())
    assert [trtllm_lookup(schedule, b) for b in (2, 3, 5, 17, 33)] == [4, 4, 2, 2, 0]


def trtllm_validate(schedule: dict, max_draft_len: int) -> dict:
    """validate_draft_len_schedule_and_sort of tensorrt_llm/llmapi/llm_args.py (after PR #10860; the
    package has no CPU wheel, so its rule is restated here, pinned to that source)."""
    assert all(b >= 1 for b in schedule) and all(k >= 0 for k in schedule.values())
    assert schedule[min(schedule)] == max_draft_len and all(k <= max_draft_len for k in schedule.values())
    return dict(sorted(schedule.items()))


def vllm_validate(ranges: list) -> list:
    """validate_and_normalize_dynamic_sd_schedule of vllm/v1/spec_decode/dynamic/utils.py (0.33.0):
    sorted, non-overlapping inclusive (start, end, k) ranges, the first starting at 1."""
    assert ranges and all(len(r) == 3 for r in ranges) and ranges[0][0] == 1
    assert all(0 < lo <= hi and k >= 0 for lo, hi, k in ranges)
    assert all(prev[1] < nxt[0] for prev, nxt in zip(ranges, ranges[1:]))
    return ranges


def test_trtllm_and_vllm_tables_pass_their_engines_validators(tmp_path):
    from types import SimpleNamespace

    from dspark_bench.engines.files import render

    choices = [SimpleNamespace(batch_size=b, exported=DecodeConfig.of(schedule="fixed", gamma_max=k))
               for b, k in ((1, 5), (4, 4), (16, 2), (32, 3))]
    text = render("trtllm", choices, {}, version_for("trtllm"), "draft")[FILES["trtllm"]]
    config = yaml.safe_load(text)["speculative_config"]
    assert config["decoding_type"] == "Draft_Target" and config["speculative_model"] == "draft"
    schedule = trtllm_validate(config["draft_len_schedule"], config["max_draft_len"])
    assert {b: trtllm_lookup(schedule, b) for b in (1, 4, 16, 32)} == {1: 5, 4: 4, 16: 2, 32: 3}
    assert "above 32 (the largest measured) TensorRT-LLM does not speculate" in text
    legacy = yaml.safe_load(render("trtllm", choices, {}, version_for("trtllm", "legacy"), "d")[FILES["trtllm"]])
    assert legacy["speculative_config"]["decoding_type"] == "DraftTarget"
    vllm = json.loads(render("vllm", choices, {}, version_for("vllm", "0.33.0"), "d")[FILES["vllm"]])
    ranges = vllm_validate(vllm["num_speculative_tokens_per_batch_size"])
    assert [k for *_, k in ranges] == [5, 4, 2, 3] and vllm["num_speculative_tokens"] == 5
    old = json.loads(render("vllm", choices, {}, version_for("vllm", "0.20.1"), "d")[FILES["vllm"]])
    assert old == {"method": "draft_model", "model": "d", "num_speculative_tokens": 5}


# --- the files, through the engines' own code --------------------------------------------------------


def shipped_run(tmp_path: Path, policies: list[str]) -> Path:
    """A run of the shipped pair over a few policies (4 code prompts, 32 tokens): its best is exported."""
    args = ["run", "--task", "code", "--limit", "4", "--max-new-tokens", "32", "--out", str(tmp_path / "run"),
            "--device", "cpu", *policies]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "run").iterdir()
    return folder


@pytest.fixture(scope="module")
def llamacpp_run(tmp_path_factory) -> Path:
    return shipped_run(tmp_path_factory.mktemp("llamacpp"), ["--semantics", "llamacpp", "--threshold", "0.2",
                                                             "--threshold", "0.4", "--gamma-max", "6",
                                                             "--min-draft-len", "0"])


def test_a_depth_policy_exports_its_busiest_buckets_policy_and_says_why(llama_pair, tmp_path):
    """No engine keys its policy by the context's depth: an export of a depth policy says so, and writes
    the threshold policy of the bucket holding most of its rounds where the engine runs that (llama.cpp,
    here), else the best policy the engine runs (vLLM: a fixed length); each replayed on the record."""
    from types import SimpleNamespace

    import numpy as np
    import tiny

    from dspark_bench.decoding.rules import bucket_policies
    from dspark_bench.engines.export import RunPolicies, choose
    from dspark_bench.measure.recording import record
    from dspark_bench.replay.cost import CostModel
    from dspark_bench.replay.simulate import simulate_grid, simulate_priced

    target, draft = llama_pair
    rng = np.random.default_rng(3)
    prompts = [[int(i) for i in rng.integers(2, tiny.VOCAB, n)] for n in (246, 250, 252)]  # most rounds past 256
    rec = record(SimpleNamespace(target=target, draft=draft, eos_ids=frozenset()), prompts, 48, 6, topk=5)
    rec.save(tmp_path / "record")
    tuned = DecodeConfig.of(schedule="depth", depth_policy="0.6/2,0.3/5", semantics="llamacpp", min_draft_len=0,
                            max_new_tokens=48)
    cost = CostModel(t_draft=0.001, t_verify=[0.01 + 0.001 * k for k in range(7)], context_tokens=10)
    run = RunPolicies(tmp_path, {}, {1: (tuned, 1.1, "predicted")}, tmp_path / "record",
                      {"kind": "cost_model.json", **cost.to_dict()}, "ours")
    deep = bucket_policies(tuned)[1]
    assert deep.label() == "top1 threshold 0.3 γ≤5 min0 · llama.cpp rule"
    (llamacpp,) = choose(run, "llamacpp")
    assert llamacpp.exported == deep.replace(max_new_tokens=48)
    assert llamacpp.reasons[0] == "a policy per context depth (it has one threshold)"
    assert re.fullmatch(r"its 256-1k bucket's policy \(top1 threshold 0\.3 γ≤5 min0 · llama\.cpp rule\), where "
                        r"(\d+)% of its rounds on the record run, is written \(there one policy's choice weighs most\)",
                        llamacpp.reasons[1])
    assert int(re.search(r"(\d+)%", llamacpp.reasons[1]).group(1)) > 50
    assert llamacpp.tuned_speedup == pytest.approx(simulate_priced(rec, tuned, cost)[0]["predicted_speedup"].iloc[0])
    assert llamacpp.exported_speedup == pytest.approx(simulate_grid(rec, [deep], cost)["predicted_speedup"].iloc[0])
    (vllm,) = choose(run, "vllm")
    assert vllm.exported.stopping.schedule == "fixed" and vllm.reasons[0] == ("a policy per context depth (it "
                                                                              "drafts a fixed length)")
    assert "needs a threshold schedule (it drafts a fixed length) too: the best policy vllm runs" in vllm.reasons[1]


def test_sglang_file_is_yaml_with_dashed_names_that_its_parser_reads(tmp_path):
    run = shipped_run(tmp_path, ["--schedule", "fixed", "--gamma-max", "4"])
    result = runner.invoke(app, ["export", str(run), "--format", "sglang", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    path = tmp_path / FILES["sglang"]
    values = yaml.safe_load(path.read_text())
    assert path.suffix == ".yaml" and all("_" not in key for key in values)
    assert values["speculative-algorithm"] == "STANDALONE" and values["speculative-eagle-topk"] == 1
    assert values["speculative-num-draft-tokens"] == values["speculative-num-steps"] + 1  # SGLang forces it at topk 1
    assert "sglang.Engine(model_path=" in path.read_text()  # the Engine(**kwargs) form, beside it
    assert "0.5.23" in (tmp_path / "sglang.md").read_text()
    try:
        from sglang.srt.server_args import prepare_server_args  # SGLang's own parser (CPU: installs --no-deps)
    except Exception as error:  # noqa: BLE001 — any import failure means: not installed here
        pytest.skip(f"SGLang's parser does not import here ({type(error).__name__}: {error}); the file is checked "
                    "against sglang 0.5.23's server_args_config_parser.py by the assertions above")
    parsed = prepare_server_args(["--model-path", "target", "--config", str(path)])
    assert parsed.speculative_algorithm == "STANDALONE"
    assert parsed.speculative_num_steps == values["speculative-num-steps"]
    assert parsed.speculative_num_draft_tokens == values["speculative-num-draft-tokens"]
    assert parsed.speculative_draft_model_path == values["speculative-draft-model-path"]


def test_hf_files_load_onto_the_assistant_as_the_docs_say_and_run(tmp_path):
    """The assistant's three keys go to the assistant's generation_config (read there by
    AssistedCandidateGenerator); the two lines of Python in hf.md load them; the run is the target's own."""
    import torch
    from transformers import GenerationConfig

    from dspark_bench.decoding.autoregressive import autoregressive_decode, hf_assisted_decode, hf_rounds
    from dspark_bench.harness.models import load_pair
    from dspark_bench.tasks import load_prompts
    from dspark_bench.tasks.prompts import encode

    run = shipped_run(tmp_path, ["--semantics", "hf", "--threshold", "0.3", "--gamma-max", "6", "--min-draft-len", "0"])
    result = runner.invoke(app, ["export", str(run), "--format", "hf", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assistant = json.loads((tmp_path / FILES["hf"]).read_text())
    assert set(assistant) == {"num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"}
    GenerationConfig.from_dict(assistant).validate()  # HF's own checks
    about = (tmp_path / "hf.md").read_text()
    lines = [line for line in about.split("```")[1].strip().splitlines()]
    assert len(lines) == 2 and lines[0].startswith("draft.generation_config.update(")
    pair = load_pair(device="cpu")
    (prompt,), _, _ = load_prompts("code", None, limit=1)
    inputs = {"input_ids": torch.tensor([encode(pair.tokenizer, prompt.text)])}
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    target, draft, rounds = pair.target, pair.draft, []
    saved, cwd = draft.generation_config, os.getcwd()
    try:
        draft.generation_config = GenerationConfig.from_dict(saved.to_dict())
        os.chdir(tmp_path)  # the lines name the files beside them
        with hf_rounds(rounds):
            scope = {"json": json, "draft": draft, "target": target, "inputs": inputs}
            exec("\n".join(lines), scope)  # noqa: S102 — the documented lines, as a user runs them
    finally:
        os.chdir(cwd)
        draft.generation_config = saved
    generated = scope["out"][0, inputs["input_ids"].shape[1]:].tolist()
    reference = autoregressive_decode(target, inputs["input_ids"][0].tolist(), DecodeConfig.of(max_new_tokens=32),
                                      pair.eos_ids).tokens
    assert generated == reference
    # HF read the keys from the assistant: its rounds are those of the policy `--decoder hf` runs.
    policy = DecodeConfig.of(semantics="hf", threshold=assistant["assistant_confidence_threshold"], min_draft_len=0,
                          gamma_max=assistant["num_assistant_tokens"], max_new_tokens=32)
    expected = hf_assisted_decode(target, draft, inputs["input_ids"][0].tolist(), policy, pair.eos_ids).rounds
    assert [(r.drafted, r.accepted) for r in rounds] == [(r.drafted, r.accepted) for r in expected]
    assert max(r.drafted for r in rounds) > 1


# --- llama.cpp, for real ------------------------------------------------------------------------------


def test_llamacpp_export_starts_a_real_server_that_speculates_and_matches_replay(llamacpp_run, tmp_path):
    """The bar: the exported policy on llama-server speculates on every prompt, gives the target's
    own greedy output, and accepts what replay predicts under llama.cpp's rule (within 0.05)."""
    binary = llama_server_or_skip()
    exported = runner.invoke(app, ["export", str(llamacpp_run), "--format", "llamacpp", "--out", str(tmp_path / "x")])
    assert exported.exit_code == 0, exported.output
    gamma, p_min, minimum, _ = parse("llamacpp", (tmp_path / "x" / FILES["llamacpp"]).read_text())[1]
    args = ["run", "--task", "code", "--limit", "4", "--max-new-tokens", "32", "--semantics", "llamacpp",
            "--threshold", str(p_min), "--gamma-max", str(gamma), "--min-draft-len", str(minimum),
            "--decoder", "llamacpp", "--llama-server", str(binary), "--device", "cpu", "--out", str(tmp_path / "r")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "llama.cpp speculative vs llama.cpp plain" in result.output and "replay, llama.cpp's rule" in result.output
    (folder,) = (tmp_path / "r").iterdir()
    info = json.loads((folder / "llamacpp.json").read_text())
    # Exactly the flags export writes (the GGUF draft is converted now: export names it).
    again = runner.invoke(app, ["export", str(folder), "--format", "llamacpp", "--out", str(tmp_path / "y")])
    assert again.exit_code == 0, again.output
    line = [w for w in (tmp_path / "y" / FILES["llamacpp"]).read_text().splitlines() if not w.startswith("#")]
    (policy,) = info["policies"]
    assert shlex.split(line[0]) == policy["flags"] == policy["argv"][-len(policy["flags"]):]

    rows = pd.read_parquet(folder / "llamacpp.parquet")
    assert (rows["drafted_total"] > 0).all()  # it speculates on every prompt
    assert rows["identical_to_target"].mean() >= 0.9 and rows["tokenized_identically"].all()
    assert abs(rows["accepted_total"].sum() / rows["drafted_total"].sum()
               - rows["replay_accepted"].sum() / rows["replay_drafted"].sum()) <= 0.05
    assert abs(rows["drafted_total"].sum() - rows["replay_drafted"].sum()) <= 0.1 * rows["replay_drafted"].sum()
    assert (rows["new_tokens"] == rows["rounds"] + rows["accepted_total"]).all()  # its rounds, counted as ours


def test_llamacpp_bad_inputs_end_in_one_line_and_leave_no_server(tmp_path, monkeypatch):
    binary = llama_server_or_skip()
    from dspark_bench.engines.llama_server import LlamaServer

    missing = runner.invoke(app, ["run", "--task", "code", "--limit", "1", "--decoder", "llamacpp",
                                  "--llama-server", str(tmp_path / "none")])
    assert missing.exit_code != 0 and "is not an executable file" in missing.output
    corrupt = tmp_path / "broken.gguf"
    corrupt.write_bytes(b"GGUF" + os.urandom(256))
    server = LlamaServer(binary, corrupt, name="llama-server (broken)")
    with pytest.raises(DsparkError, match="exited at start") as error:
        server.__enter__()
    assert "\n" not in str(error.value) and server.process.poll() is not None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = runner.invoke(app, ["run", "--task", "code", "--limit", "1", "--max-new-tokens", "8", "--semantics",
                                   "llamacpp", "--decoder", "llamacpp", "--port", str(port), "--device", "cpu",
                                   "--out", str(tmp_path / "busy")])
    assert busy.exit_code != 0 and f"port {port} on 127.0.0.1 is in use" in busy.output
    # The plain server up, the speculative one failing on its draft: both end, in one line.
    from dspark_bench.engines import llamacpp_run

    real = llamacpp_run.cached_gguf
    monkeypatch.setattr(llamacpp_run, "cached_gguf", lambda model, tokenizer, fingerprint, dtype="f32": corrupt
                        if model.config.num_hidden_layers == 1 else real(model, tokenizer, fingerprint, dtype))
    args = ["run", "--task", "code", "--limit", "1", "--max-new-tokens", "8", "--decoder", "llamacpp",
            "--device", "cpu"]
    broken = runner.invoke(app, args + ["--out", str(tmp_path / "b")])  # its prices first: llama-bench on the draft
    assert broken.exit_code != 0 and "llama-bench failed on broken.gguf" in broken.output
    lines = broken.output.strip().splitlines()  # the plan lines and the stage's bar, then the error, in one line
    assert (len(lines) <= 4 and lines[-1].startswith("error: llama-bench failed")
            and sum("error" in x for x in lines) == 1)
    monkeypatch.setattr(llamacpp_run, "llamacpp_prices", lambda *args, **kwargs: None)  # as if measured
    broken = runner.invoke(app, args + ["--out", str(tmp_path / "c")])
    assert broken.exit_code != 0 and "llama-server (speculative) exited at start" in broken.output
    assert len(broken.output.strip().splitlines()) <= 3, broken.output
    left = subprocess.run(["pgrep", "-f", f"{binary} --model"], capture_output=True, text=True).stdout.split()
    assert not left, "a llama-server was left running"


def test_llamacpp_runs_several_policies_on_the_users_gguf_files_priced_on_its_own_costs(tmp_path, prices_home):
    """The user's (quantized) GGUF files go to llama-server and llama-bench as they are; every
    policy is measured there beside replay priced on llama.cpp's measured costs and on ours; those
    costs are a cached cost-model file fitted on prompts the run does not decode."""
    binary = llama_server_or_skip()
    from dspark_bench.harness.gguf import write_gguf
    from dspark_bench.harness.models import load_pair
    from dspark_bench.replay import cost_file

    pair = load_pair(device="cpu")
    files = [write_gguf(model, pair.tokenizer, tmp_path / f"{role}-Q8_0.gguf", "q8_0")
             for role, model in (("target", pair.target), ("draft", pair.draft))]
    args = ["run", "--task", "code", "--limit", "2", "--max-new-tokens", "16", "--schedule", "fixed",
            "--gamma-max", "2", "--gamma-max", "3", "--decoder", "llamacpp", "--llama-server", str(binary),
            "--target", str(files[0]), "--draft", str(files[1]), "--device", "cpu", "--out", str(tmp_path / "r")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "on your GGUF files as they are" in result.output and "predicted, llama.cpp prices" in result.output
    (folder,) = (tmp_path / "r").iterdir()
    info = json.loads((folder / "llamacpp.json").read_text())
    assert info["gguf"]["given"] and info["argv"]["plain"][info["argv"]["plain"].index("--model") + 1] == str(files[0])
    for policy in info["policies"]:  # the very files given, not a conversion
        assert policy["argv"][policy["argv"].index("--model") + 1] == str(files[0])
        assert policy["argv"][policy["argv"].index("--spec-draft-model") + 1] == str(files[1])
    assert [row["policy"] for row in info["summary"]] == ["fixed γ=2 · llama.cpp rule", "fixed γ=3 · llama.cpp rule"]
    for row in info["summary"]:
        assert row["llamacpp_speedup"] > 0 and row["predicted_llamacpp"] > 0 and row["predicted_ours"] > 0
        assert row["error_llamacpp"] == pytest.approx(row["predicted_llamacpp"] / row["llamacpp_speedup"] - 1)
    prices = cost_file.load(info["prices"]["llamacpp"])
    assert Path(prices.source).parent == prices_home and prices.measured_by["name"] == "llamacpp"
    assert prices.models["target"] == str(files[0]) and prices.timing_health["verdict"] in ("ok", "noisy", "unreliable")
    ran = set(pd.read_parquet(folder / "llamacpp.parquet")["prompt_id"])
    assert prices.fitted_on["prompts"] and not ran & set(prices.fitted_on["prompts"])  # out of sample
    assert len(prices.surface.at(1).t_verify) == 8 and prices.surface.at(1).t_plain > 0  # k = 0 .. 7, the deeper fit γ
    # What an empty draft adds, fitted on a run of p-min 1 (every draft empty) on the same prompts.
    assert "top1 threshold 1 γ≤1 min0 · llama.cpp rule" in prices.fitted_on["policies"]
    assert prices.surface.at(1).t_round_empty is not None and prices.surface.at(1).t_round_empty >= 0
    empty_runs = [r for r in prices.fitted_on["runs"] if r["policy"].startswith("top1 threshold 1 ")]
    assert empty_runs and all(2 * r["empty_rounds"] > r["rounds"] for r in empty_runs)


def test_a_prompt_llama_cpp_stopped_for_a_full_context_is_marked():
    """llama-server caps its context at the model's trained length and stops a prompt there
    ("truncated"): the side-by-side row says so, where the two engines decode different lengths."""
    from types import SimpleNamespace

    from dspark_bench.engines.llama_server import prompt_row

    def answer(tokens, truncated):
        return {"tokens": tokens, "truncated": truncated, "wall_s": 1.0, "counters": {"n_decode_total": 3.0},
                "timings": {"draft_n": 2, "draft_n_accepted": 1, "predicted_ms": 10.0, "predicted_per_second": 1.0}}

    prompt = SimpleNamespace(id="p", category="code")
    full = prompt_row(prompt, {"spec": [answer([1, 2, 3], True)], "plain": [answer([1, 2, 3], True)]})
    whole = prompt_row(prompt, {"spec": [answer([1, 2, 3], False)], "plain": [answer([1, 2, 3], False)]})
    assert full["context_full"] and not whole["context_full"]


def test_a_sweep_priced_by_llamacpp_measures_its_prices_itself_and_reuses_or_deepens_them(tmp_path, prices_home):
    """From an empty cache `sweep --prices llamacpp` measures llama.cpp's prices (saying what it
    will run first), caches them, re-uses them, and measures them again deeper for a deeper space."""
    llama_server_or_skip()
    from dspark_bench.replay import cost_file

    for old in prices_home.glob("llamacpp-*.json"):  # an empty cache, whatever ran before in this session
        old.unlink()
    args = ["sweep", "--task", "code", "--limit", "2", "--max-new-tokens", "12", "--metric", "top1", "--threshold",
            "0.3", "--min-draft-len", "0", "--confirm-top", "1", "--prices", "llamacpp", "--device", "cpu"]

    def sweep(*more):
        result = runner.invoke(app, args + list(more) + ["--out", str(tmp_path / f"s{len(list(tmp_path.iterdir()))}")])
        assert result.exit_code == 0, result.output
        return " ".join(result.output.split())

    said = sweep("--gamma-max", "3")
    assert "measuring llama.cpp's prices (cached after): llama-bench passes of 1 to 8 tokens" in said
    assert re.search(r"llama.cpp's plain step: [\d.]+ ms \(llama-bench\); the fit's \d+ requests ≈ \d+ s", said)
    assert "predicted on llama.cpp b11434's prices" in said
    # Confirmed in llama.cpp: its best policy there and its defaults, each against a plain server.
    (folder,) = [f for f in (tmp_path / "s0").iterdir() if f.name != "records"]
    verdict = json.loads((folder / "summary.json").read_text())["engine_verdict"]
    assert verdict["engine"] == "llama.cpp b11434" and verdict["sentence"].startswith("in llama.cpp b11434 here, ")
    assert verdict["sentence"] in said and "confirmed in llama.cpp b11434" in said
    policies = [r["policy"] for r in verdict["rows"]]
    assert len(policies) == 2 and "fixed γ=3 · llama.cpp rule" in policies  # the best there, and the defaults
    assert all(r["measured"] > 0 and r["measured_low"] <= r["measured"] <= r["measured_high"] for r in verdict["rows"])
    assert verdict["wins"] in ("plain", "speculative", "neither")
    assert (verdict["wins"] == "plain") == (verdict["best"]["measured_high"] < 1)
    exported = runner.invoke(app, ["export", str(folder), "--format", "llamacpp", "--out", str(tmp_path / "x")])
    told = " ".join(exported.output.split())  # export writes what llama.cpp measured, and says so
    assert exported.exit_code == 0 and verdict["sentence"] in told
    assert (("writes plain decoding: the sweep measured it in llama.cpp b11434" in told)
            == (verdict["wins"] != "speculative"))
    (cached,) = prices_home.glob("llamacpp-*.json")
    assert len(cost_file.load(cached).surface.at(1).t_verify) == 8  # k = 0 .. 7: the fit's deeper γ
    assert "(cached; depth" in sweep("--gamma-max", "2")
    assert "not 9: measuring them again, deeper" in sweep("--gamma-max", "9")
    (deeper,) = prices_home.glob("llamacpp-*.json")
    assert deeper == cached and len(cost_file.load(deeper).surface.at(1).t_verify) == 10

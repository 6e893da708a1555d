"""benchmarks/gpu/gpu.sh --device cpu --smoke: the GPU run's every stage, with tiny shapes, on CI's CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from dspark_bench.config import METRICS, SCHEDULES
from dspark_bench.replay import cost_file

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("machine", "correctness", "syncs", "prices", "captured", "replay", "compiled", "timed", "batches", "speed")


def gpu_sh(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env_python = Path(sys.executable).parent
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu" / "gpu.sh"), "--device", "cpu", "--smoke", "--out",
                           str(tmp_path), *args], capture_output=True, text=True, timeout=900,
                          env={"PATH": f"{env_python}:/usr/bin:/bin", "HOME": str(tmp_path)})


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu")
    result = gpu_sh(out, "--stages", ",".join(STAGES), "--prompts",
                    str(ROOT / "benchmarks" / "gpu" / "inputs" / "code-prompts.jsonl"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, result.stdout, json.loads((out / "stages.json").read_text())


def test_every_stage_is_done_and_its_checks_hold(dry_run):
    _, stdout, stages = dry_run
    assert [s for s in STAGES if not stages[s]["done"]] == []
    greedy, sampling = stages["correctness"]["greedy"], stages["correctness"]["sampling"]
    assert greedy["identical"] and greedy["differ"] == [] and greedy["accepted_tokens"] > 0
    # the captured path (compiled; dynamo's eager backend on this dry run): every policy, both modes,
    # and batched (2 prompts) every policy whose schedule decides per row (budget, one per metric, does not)
    captured = greedy["captured"]
    assert captured["identical"] and captured["batched_decodes"] == 2 * (greedy["policies"] - len(METRICS))
    # 2 prompts, both draft modes (vLLM's controller, one policy per metric: early-stop only), and batched
    assert captured["decodes"] == 2 * (2 * greedy["policies"] - len(METRICS)) + captured["batched_decodes"]
    assert greedy["captured"]["baseline_equals_eager"]
    # every metric × schedule: the depth schedule's and the engines' controllers' too
    assert greedy["policies"] == len(METRICS) * len(SCHEDULES) == 50
    assert sampling["p_value"] > 0.001 and sampling["broken_rule_p_value"] < 1e-4
    bf16 = stages["correctness"]["bf16"]["rows"]  # reported, not required: bf16 may part after a near-tie
    assert len(bf16) == 2 and all(0.0 <= r["identical_share"] <= 1.0 for r in bf16)
    assert "every stage done and holding" in stdout


def test_syncs_per_round(dry_run):
    rows = dry_run[2]["syncs"]["rows"]
    assert {r["draft_mode"] for r in rows} == {"early-stop", "verify-side"}
    for r in rows:  # verify-side waits once per round; early-stop once per draft step besides
        if r["draft_mode"] == "verify-side":
            assert r["fetches_per_round"] == 1.0
        else:
            assert r["fetches_per_round"] > 1.0
        assert r["cuda_syncs_per_round"] is None  # no CUDA here: not counted, not invented


def test_prices_are_cost_model_files_that_load(dry_run):
    out, _, stages = dry_run
    prices = stages["prices"]
    with_round = cost_file.load(out / "cost-model-cpu-tiny.json")
    surface = cost_file.load(out / "cost-surface-cpu-tiny.json")
    assert sorted(surface.surface.models) == [1, 2] and list(with_round.surface.models) == [1]
    assert len(with_round.surface.at(1).t_verify) == 5  # k = 0 .. gamma 4
    # t_round is a fitted overhead clamped at 0 (the H200 fitted it negative too), so it is the
    # file's agreement with the stage that is checked, not its sign on a shared CPU
    assert with_round.surface.at(1).t_round == prices["rounds"]["t_round"] >= 0
    assert prices["rounds"]["per_gamma"]  # fitted from fixed-gamma decodes, one row per gamma
    assert with_round.models["shapes"] == "benchmarks/gpu/shapes.json#tiny"
    assert prices["bandwidth_bound_s"] > 0 and prices["eager_step"]["seconds"] > prices["bandwidth_bound_s"]
    # Batch 1 as CUDA decodes it by default (compiled here, through dynamo's eager backend), timed
    # alone and inside running decodes: two more files, naming how their passes ran.
    captured = stages["captured"]
    alone = cost_file.load(out / "cost-model-cpu-tiny-captured.json")
    inside = cost_file.load(out / "cost-model-cpu-tiny-in-decode.json")
    assert alone.measured_by["build"]["capture"] == inside.measured_by["build"]["capture"] == "compiled"
    assert inside.surface.at(1).t_round == captured["in_decode"]["t_round"] >= 0
    assert inside.surface.at(1).t_plain > 0 and len(inside.surface.at(1).t_verify) == 5
    assert captured["in_decode_detail"]["rounds"] > 0 and "4" in captured["in_decode_detail"]["verify_passes"]
    assert captured["target_step_over_bound"] > 1 and captured["draft_step_over_bound"] > 1
    table = (out / "gpu-table.md").read_text()
    assert "## captured passes at B = 1" in table and "inside running decodes" in table


def test_replay_picks_on_each_price(dry_run):
    out, _, stages = dry_run
    picks = stages["replay"]["picks"]
    assert {p["prices"] for p in picks} == {"shipped pair, cpu", "shipped pair, CPU", "tiny, cpu, eager",
                                            "tiny, cpu, captured", "tiny, cpu, captured in decode"}
    assert {p["pick"] for p in picks} == {"best policy", "best fixed γ"}
    assert all(p["policy"].startswith("fixed") == (p["pick"] == "best fixed γ") for p in picks)
    cost_file.load(out / "cost-model-cpu-shipped-pair.json")
    assert stages["compiled"]["ratio_compiled"] > 0
    profiled = stages["compiled"]["profile"]  # where the compiled step's time goes, its heaviest ops first
    assert profiled["top_per_step"][0]["self_cpu_ms"] >= profiled["top_per_step"][-1]["self_cpu_ms"] > 0
    assert "aten::" in (out / profiled["table"]).read_text()


def test_timed_replay_stage(dry_run):
    """Five policies' rounds (--smoke: γ ≤ 4, so fixed γ 2 and 4 and two thresholds) run on the priced
    pair's passes, each beside replay's prediction on that pair's prices, in the run's table."""
    out, _, stages = dry_run
    rows = stages["timed"]["rows"]
    assert [r["policy"] for r in rows] == ["fixed γ=2 · compiled", "fixed γ=4 · compiled",
                                           "top1 threshold 0.3 γ≤4 min1 · compiled",
                                           "top1 threshold 0.6 γ≤4 min1 · compiled"]
    for row in rows:
        assert row["measured_speedup"] > 0 and row["rounds"] > 0
        assert row["error"] == pytest.approx(row["predicted_speedup"] / row["measured_speedup"] - 1)
        assert row["error_in_decode"] == pytest.approx(row["predicted_in_decode"] / row["measured_speedup"] - 1)
    table = (out / "gpu-table.md").read_text()
    assert "## timed replay: the shipped pair's rounds on the priced pair's captured passes" in table


def test_speed_stage_rows(dry_run):
    _, stdout, stages = dry_run
    rows = stages["speed"]["rows"]
    decoders = {r["decoder"] for r in rows}
    assert decoders == {"ours", "HF assisted generation", "autoregressive: ours", "autoregressive: model.generate",
                        "draft loop, host sync per step", "draft loop, decisions on the device",
                        "draft loop, host sync per step, compiled", "draft loop, decisions on the device, compiled"}
    policies = [r["policy"] for r in rows if r["decoder"] == "ours"]
    assert sum("verify-side" in p for p in policies) == 4 and sum("compiled" in p for p in policies) == 4
    assert all(r["identical"] == 1.0 for r in rows if "identical" in r)  # greedy fp32: token for token
    samples = pd.read_parquet(Path(stages["speed"]["run_folder"]) / "samples.parquet")
    assert set(samples["draft_mode"]) == {"early-stop", "verify-side"} and samples["compiled"].any()
    assert "## speed" in stdout


def test_a_cut_run_resumes_without_redoing_its_stages(dry_run, tmp_path):
    out, _, _ = dry_run
    result = gpu_sh(tmp_path, "--stages", "machine,prices", "--resume", str(out / "stages.json"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("done in an earlier try") == 2
    assert "plain step, eager" in (tmp_path / "gpu-table.md").read_text()


def test_bad_arguments_end_in_one_line(tmp_path):
    result = gpu_sh(tmp_path, "--stages", "machine,warp")
    assert result.returncode == 2 and "unknown stage 'warp'" in result.stderr
    result = gpu_sh(tmp_path, "--resume", str(tmp_path / "missing.json"))
    assert result.returncode == 2 and "no such file" in result.stderr


def test_step_bytes_count_what_a_step_reads():
    from benchmarks.gpu import prices as gpu_prices  # the GPU run's own; pytest runs from the repository root

    entry = gpu_prices.shapes("tiny")
    target = gpu_prices.build_model(entry["target"], torch.device("cpu"), torch.float32)
    draft = gpu_prices.build_model(entry["draft"], torch.device("cpu"), torch.float32)
    t, d = entry["target"], entry["draft"]
    # The untied target reads every weight but its input embedding; the tied draft reads its embedding as its head.
    params = sum(p.numel() for p in target.parameters())
    assert gpu_prices.step_bytes(target, 0)["weight_bytes"] == 4 * (params - t["vocab_size"] * t["hidden_size"])
    assert gpu_prices.step_bytes(draft, 0)["weight_bytes"] == 4 * sum(p.numel() for p in draft.parameters())
    kv = gpu_prices.step_bytes(target, 100)["kv_bytes"]
    assert kv == 4 * 2 * t["num_hidden_layers"] * t["num_key_value_heads"] * t["head_dim"] * 100
    assert next(target.parameters()).dtype == torch.float32 and d["tie_word_embeddings"]


def test_full_size_on_a_cpu_is_refused_with_its_plan(tmp_path):
    """Without CUDA and without --smoke the run says what it would build and builds nothing (one
    run on a CPU built the 8B-shaped pair in 19.5 GB of RAM without a word)."""
    env_python = Path(sys.executable).parent
    out = tmp_path / "out"
    result = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu" / "gpu.sh"), "--device", "cpu", "--out", str(out),
                             "--stages", "machine,timed"], capture_output=True, text=True, timeout=300,
                            env={"PATH": f"{env_python}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert result.returncode == 2
    assert "builds the llama-8b-1b pair" in result.stdout and "18.5 GB" in result.stdout  # 8.03 B + 1.24 B in bf16
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line
    assert "--allow-cpu" in result.stderr and not out.exists()


def test_batches_stage_captures_each_batch_size(dry_run):
    """verify(k) and the draft step from captured passes (compiled; the dry run's eager backend) at
    B = 1 and each --batch-size, beside the prices stage's eager surface."""
    out, _, stages = dry_run
    batches = stages["batches"]
    assert sorted(batches["captured"], key=int) == ["1", "2"] and sorted(batches["eager"], key=int) == ["1", "2"]
    for entry in batches["captured"].values():
        assert len(entry["t_verify"]) == 5 and entry["t_draft"] > 0 and min(entry["t_verify"]) > 0
    assert "## verify(k) and the draft step captured per (B, k)" in (out / "gpu-table.md").read_text()

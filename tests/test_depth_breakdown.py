"""A run's metrics by context depth: each round's depth, the samples' per-bucket totals, summary.json's
by_depth and by_prompt_depth, the report's table and the run's note."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import tiny
from cli_helpers import invoke  # noqa: E402  (tests/ is on sys.path, see conftest.py)

from dspark_bench.decoding import speculative
from dspark_bench.depth import DEPTH_LABELS, depth_label
from dspark_bench.harness.depth_breakdown import depth_fields
from dspark_bench.harness.samples import round_rows, sample_row
from dspark_bench.metrics import DEPTH_TOTAL_COLUMNS, TOTAL_COLUMNS, summarize_by_depth
from dspark_bench.reporting.report import build_report


def test_each_rounds_depth_is_where_it_writes_and_its_totals_add_up(llama_pair):
    target, draft = llama_pair
    prompt = [int(i) for i in np.random.default_rng(0).integers(2, tiny.VOCAB, 200)]
    config = tiny.policy(threshold=0.3, gamma_max=4, max_new_tokens=96)
    result = speculative.speculative_decode(target, draft, prompt, config)
    rows = round_rows(result, {"prompt_id": 0}, len(prompt))
    emitted_before = 0
    for row, r in zip(rows, result.rounds, strict=True):
        assert row["depth"] == len(prompt) + emitted_before
        # The round writes its accepted draft, then the target's token, from its depth on.
        at = row["depth"] - len(prompt)
        assert result.tokens[at: at + r.accepted] == r.draft_tokens[: r.accepted]
        assert r.target_token in (-1, result.tokens[at + r.accepted])
        emitted_before += r.emitted
    depths = [row["depth"] for row in rows]
    assert depths[0] == 200 and depths[-1] + result.rounds[-1].emitted == 200 + len(result.tokens) == 296
    assert min(depths) < 256 <= max(depths)  # the rounds cross 256
    fields = depth_fields(result.rounds, len(prompt))
    totals = sample_row(result, config)
    for column in TOTAL_COLUMNS:  # every bucket's totals sum to the sample's, exactly
        assert sum(fields[f"{column}_by_depth"]) == totals[column]
        assert len(fields[f"{column}_by_depth"]) == len(DEPTH_LABELS)
    assert fields["rounds_by_depth"][:2] == [sum(d < 256 for d in depths), sum(d >= 256 for d in depths)]
    assert fields["emitted_total_by_depth"][0] == sum(r.emitted for r, d in zip(result.rounds, depths) if d < 256)


def test_by_depth_keeps_only_buckets_with_rounds_and_counts_a_prompt_once_over_passes():
    samples = pd.DataFrame({
        "config_id": [0, 0, 0], "config_label": ["p"] * 3, "pass": [0, 0, 1],
        "rounds_by_depth": [[3, 0, 1, 0, 0], [2, 0, 0, 0, 0], [3, 0, 1, 0, 0]],
        "drafted_total_by_depth": [[6, 0, 4, 0, 0], [4, 0, 0, 0, 0], [6, 0, 4, 0, 0]],
        "accepted_total_by_depth": [[3, 0, 4, 0, 0], [1, 0, 0, 0, 0], [3, 0, 4, 0, 0]],
        "emitted_total_by_depth": [[6, 0, 5, 0, 0], [3, 0, 0, 0, 0], [6, 0, 5, 0, 0]],
        "full_blocks_by_depth": [[1, 0, 1, 0, 0], [0, 0, 0, 0, 0], [1, 0, 1, 0, 0]],
    })
    table = summarize_by_depth(samples, DEPTH_LABELS).set_index("depth")
    assert list(table.index) == ["0-256", "1k-2k"]
    assert table.loc["0-256", ["prompts", "rounds", "drafted_total", "emitted_total"]].tolist() == [2, 8, 16, 15]
    assert table.loc["0-256", "acceptance_rate"] == 7 / 16 and table.loc["0-256", "block_acceptance_rate"] == 2 / 8
    assert table.loc["1k-2k", "prompts"] == 1 and table.loc["1k-2k", "tokens_per_round"] == 5.0
    assert summarize_by_depth(samples.drop(columns="rounds_by_depth"), DEPTH_LABELS).empty  # an older run


@pytest.fixture(scope="module")
def deep_run(saved_pair, tmp_path_factory):
    """Three prompts: one of 192 tokens whose rounds cross 256, one of 264 tokens, one short; traced."""
    root = tmp_path_factory.mktemp("depth")
    rows = [{"prompt": "def add(a, b):\n    return a + b\n" * 8, "category": "code"},
            {"prompt": "def add(a, b):\n    return a + b\n" * 11, "category": "code"},
            {"prompt": "The quick brown fox", "category": "prose"}]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    target, draft = saved_pair
    result = invoke("run", "--target", target, "--draft", draft, "--dataset", root / "prompts.jsonl",
                    "--out", root / "results", "--schedule", "threshold", "--schedule", "fixed", "--threshold", "0.3",
                    "--gamma-max", "3", "--max-new-tokens", "72", "--trace")
    assert result.exit_code == 0, result.output
    (folder,) = [p for p in (root / "results").iterdir() if not p.name.startswith(".")]
    return folder, result.output


def test_summary_by_depth_matches_the_trace_and_the_runs_totals(deep_run):
    folder, output = deep_run
    samples = pd.read_parquet(folder / "samples.parquet")
    rounds = pd.read_parquet(folder / "rounds.parquet")
    summary = json.loads((folder / "summary.json").read_text())
    assert sorted(set(samples["prompt_tokens"])) == [4, 192, 264]
    # The trace's depths: the prompt's tokens, then every token emitted before the round.
    for _, trace in rounds.groupby(["prompt_id", "config_id"]):
        prompt_tokens = samples.loc[samples["prompt_id"] == trace["prompt_id"].iloc[0], "prompt_tokens"].iloc[0]
        assert trace["depth"].tolist() == (prompt_tokens + trace["emitted"].cumsum() - trace["emitted"]).tolist()
    by_depth = pd.DataFrame(summary["by_depth"])
    assert summary["depth_edges"] == [0, 256, 1024, 2048, 4096]
    for config_id, part in by_depth.groupby("config_id"):
        assert part["depth"].tolist() == ["0-256", "256-1k"]  # only the buckets that have rounds
        mine = samples[samples["config_id"] == config_id]
        for column in TOTAL_COLUMNS:  # the buckets add up to the run's totals
            assert part[column].sum() == mine[column].sum()
        traced = rounds[rounds["config_id"] == config_id]
        cut = traced.groupby(traced["depth"].map(depth_label), sort=False)
        assert part["rounds"].tolist() == [len(traced[traced["depth"] < 256]), len(traced[traced["depth"] >= 256])]
        assert part.set_index("depth")["emitted_total"].to_dict() == cut["emitted"].sum().to_dict()
        assert part.set_index("depth")["prompts"].to_dict() == {"0-256": 2, "256-1k": 2}
        below = part.iloc[0]
        assert below["tokens_per_round"] == below["emitted_total"] / below["rounds"]
        assert below["acceptance_rate"] == below["accepted_total"] / below["drafted_total"]
    for row, sample in zip(samples[list(DEPTH_TOTAL_COLUMNS)].itertuples(index=False), samples.itertuples()):
        assert sum(row.rounds_by_depth) == sample.rounds
    # Speedup is cut by the prompt's length only, each bucket with its own bootstrap interval.
    by_prompt = pd.DataFrame(summary["by_prompt_depth"])
    assert by_prompt.groupby("config_id")["prompt_depth"].apply(list).tolist() == [["0-256", "256-1k"]] * 2
    assert by_prompt.groupby("config_id")["prompts"].apply(list).tolist() == [[2, 1]] * 2
    assert (by_prompt["speedup_low"] <= by_prompt["speedup"]).all()
    assert (by_prompt["speedup"] <= by_prompt["speedup_high"]).all()
    assert "rounds span context depths 0-256, 256-1k: metrics per depth in summary.json's by_depth" in output


def test_report_shows_the_depth_tables(deep_run, tmp_path):
    folder, _ = deep_run
    text = build_report([folder], out=tmp_path).read_text().split("## Figures")[0]
    summary = json.loads((folder / "summary.json").read_text())
    assert "### By depth" in text
    for role, label in (("best", "top1 threshold 0.3 γ≤3 min1"), ("classic (best fixed γ)", "fixed γ=3")):
        for row in (r for r in summary["by_depth"] if r["config_label"] == label):
            assert (f"| {role} | {label} | {row['depth']} | {row['prompts']} | {row['rounds']} | "
                    f"{row['emitted_total']} | {row['tokens_per_round']:.3f} | {row['acceptance_rate']:.3f} |") in text
        for row in (r for r in summary["by_prompt_depth"] if r["config_label"] == label):
            assert (f"| {role} | {label} | {row['prompt_depth']} | {row['prompts']} | {row['speedup']:.2f}× "
                    f"[{row['speedup_low']:.2f}, {row['speedup_high']:.2f}] |") in text

"""Depth: buckets, costs by depth, and replay's totals and prices per depth bucket."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dspark_bench.config import DecodeConfig
from dspark_bench.depth import DEPTH_LABELS, depth_bucket, depth_label, priced_depths, round_depths, spans_depth
from dspark_bench.errors import DsparkError
from dspark_bench.measure.recording import record
from dspark_bench.replay import cost_file
from dspark_bench.replay.cost import CostModel
from dspark_bench.replay.simulate import simulate, simulate_grid, simulate_grid_by_depth, simulate_priced

N, G = 24, 5
# Prompt lengths that put the rounds of one prompt on both sides of 256, one prompt deep in
# 256-1k and one short: the record's depths are prompt_tokens + j (the tiny model reads any).
PROMPTS = [[1 + i % 50 for i in range(n)] for n in (245, 300, 6)]


def test_buckets_and_labels():
    assert DEPTH_LABELS == ("0-256", "256-1k", "1k-2k", "2k-4k", "4k+")
    assert list(depth_bucket([0, 255, 256, 1023, 1024, 4095, 4096, 10**6])) == [0, 0, 1, 1, 2, 3, 4, 4]
    assert depth_label(1500) == "1k-2k"
    assert list(round_depths(100, [3, 1, 5])) == [100, 103, 104]
    assert priced_depths(3853, 4096) == (256, 1024, 2048, 4096) and priced_depths(900, 4096) == (256, 1024)
    assert priced_depths(377, 512) == (256,) and priced_depths(5000, 4096) == (256, 1024, 2048, 4096)
    assert spans_depth([10, 300]) and not spans_depth([10, 200]) and not spans_depth([10] * 19 + [300])


def test_cost_at_depths_interpolates_and_extrapolates():
    model = CostModel(1.0, [10.0, 11.0, 12.0], 256, t_round=0.5,
                      by_depth={256: {"t_draft": 1.0, "t_verify": [10.0, 11.0, 12.0]},
                                1024: {"t_draft": 2.0, "t_verify": [20.0, 21.0, 22.0]}})
    draft, rounds = model.at_depths(np.array([0, 256, 640, 1024, 1792]))
    assert draft.tolist() == pytest.approx([1.0, 1.0, 1.5, 2.0, 3.0])  # flat below, linear between, beyond
    # every round pays t_round on top (an engine's overhead; it has no depth axis)
    assert rounds[:, 0].tolist() == pytest.approx([10.5, 10.5, 15.5, 20.5, 30.5])
    assert rounds[2, 2] == pytest.approx(17.0 + 0.5)
    flat = dataclasses.replace(model, by_depth={})
    assert flat.at_depths(np.array([5000]))[1][0].tolist() == pytest.approx([10.5, 11.5, 12.5])
    again = CostModel.from_dict(model.to_dict())
    assert again.by_depth == model.by_depth and "by_depth" not in flat.to_dict()


def cost_entry(**extra) -> dict:
    return {"format": cost_file.FORMAT, "format_version": 2, "measured_by": {"name": "ours"},
            "models": {"target": "t"}, "method": "test",
            "batch_sizes": {"1": {"t_draft": 0.001, "t_verify": [0.01, 0.011], "context_tokens": 256, **extra}}}


def test_cost_file_depth_axis_loads_and_bad_ones_are_refused():
    depths = {"1024": {"t_draft": 0.002, "t_verify": [0.02, 0.021]}}
    loaded = cost_file.from_dict(cost_entry(by_depth=depths)).surface.at(1)
    assert loaded.by_depth == {1024: {"t_draft": 0.002, "t_verify": [0.02, 0.021]}}
    assert cost_file.from_dict(cost_entry()).surface.at(1).by_depth == {}  # a file of one depth, as before
    for bad, said in (({"x": depths["1024"]}, "not a context length"),
                      ({"1024": {"t_draft": 0.002, "t_verify": [0.02]}}, "fewer than the entry's 2"),
                      ({"1024": {"t_draft": -1, "t_verify": [0.02, 0.03]}}, "not a positive number")):
        with pytest.raises(DsparkError, match=said):
            cost_file.from_dict(cost_entry(by_depth=bad))


@pytest.fixture(scope="module")
def deep_record(llama_pair):
    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=frozenset())
    return record(pair, PROMPTS, N, G, topk=5)


def policies() -> list[DecodeConfig]:
    return [DecodeConfig.of(threshold=t, gamma_max=g, max_new_tokens=N) for t in (0.0, 0.3, 0.7) for g in (2, G)]


DEPTH_COST = CostModel(0.001, [0.010, 0.011, 0.012, 0.013, 0.014, 0.015], 256,
                       by_depth={256: {"t_draft": 0.001, "t_verify": [0.010, 0.011, 0.012, 0.013, 0.014, 0.015]},
                                 1024: {"t_draft": 0.003, "t_verify": [0.030, 0.031, 0.032, 0.033, 0.034, 0.035]}})


def test_depth_totals_add_up_to_the_grid_and_follow_the_rounds(deep_record):
    configs = policies()
    table, by_depth = simulate_grid_by_depth(deep_record, configs, DEPTH_COST)
    assert set(by_depth["depth_bucket"]) == {"0-256", "256-1k"}
    sums = by_depth.groupby("config_id")[["rounds", "drafted_total", "accepted_total", "emitted_total"]].sum()
    for column in ("rounds", "drafted_total", "accepted_total", "emitted_total"):
        assert sums[column].tolist() == table[column].tolist()
    # Each round lands in the bucket of the depth it starts at, counted from simulate's own rounds.
    for c, config in enumerate(configs):
        expected = {}
        for prompt, rounds in zip(PROMPTS, simulate(deep_record, config)):
            for depth, r in zip(round_depths(len(prompt), [x.emitted for x in rounds]), rounds):
                expected[depth_label(depth)] = expected.get(depth_label(depth), 0) + 1
        got = by_depth[by_depth["config_id"] == c].set_index("depth_bucket")["rounds"].to_dict()
        assert got == expected, config.label()


def test_a_measured_plain_step_follows_depth_as_its_pass_does(deep_record):
    """t_plain is measured at the model's own depth (an engine's fit, ours inside decodes): its one-token
    pass follows the depth axis, what the step adds past it does not. Held flat, plain decoding at 245
    tokens was priced as at 1,024 (speculation read far faster on short prompts, slower on long ones)."""
    from dspark_bench.replay.tables import plain_by_depth, record_depths

    measured = dataclasses.replace(DEPTH_COST, context_tokens=1024, t_plain=0.033)  # its pass 0.030 + 0.003
    depths = record_depths(deep_record)
    bucket = depth_bucket(depths)
    plain = plain_by_depth(deep_record, measured, depths, bucket)
    steps = DEPTH_COST.at_depths(depths)[1][..., 0] + 0.003  # the pass at each depth, and the step's own 3 ms
    generated = np.arange(depths.shape[1])[None, :] < deep_record.lengths[:, None]
    prefill = np.bincount(bucket[:, 0], weights=measured.prefills(np.asarray([len(p) for p in PROMPTS]))[0],
                          minlength=len(DEPTH_LABELS))
    expected = np.bincount(bucket[generated], weights=steps[generated], minlength=len(DEPTH_LABELS)) + prefill
    assert plain == pytest.approx(expected)
    assert steps[2, 0] == pytest.approx(0.013) and plain[0] < 0.033 * generated[bucket == 0].sum()


def test_llama_cpp_runs_are_held_to_replay_per_prompt_length_bucket(deep_record):
    """`run --decoder llamacpp` over prompts of two buckets: per bucket, llama.cpp's generation speedup over
    that bucket's prompts beside replay's prediction for them alone, priced at each round's depth."""
    import pandas as pd

    from dspark_bench.engines.llamacpp_run import by_bucket, generation_speedup
    from dspark_bench.replay.sampled import rows_of
    from dspark_bench.tasks.prompts import Prompt

    prompts = [Prompt(f"p{i}", "x") for i in range(len(PROMPTS))]
    rows = pd.DataFrame({"prompt_id": [p.id for p in prompts], "new_tokens": N, "baseline_new_tokens": N,
                         "drafted_total": 6, "accepted_total": 3, "emitted_total": N, "rounds": 5, "full_blocks": 0,
                         "spec_time_s": 1.0, "baseline_time_s": 1.5, "baseline_gen_s": 1.0,
                         "spec_gen_s": [0.5 + 0.1 * i for i in range(len(PROMPTS))]})
    policy = policies()[3]
    parts = by_bucket(deep_record, policy, rows, PROMPTS, prompts, DEPTH_COST)
    assert [p["bucket"] for p in parts] == ["0-256", "256-1k"]
    buckets = depth_bucket([len(ids) for ids in PROMPTS])
    for part, bucket in zip(parts, (0, 1)):
        members = np.flatnonzero(buckets == bucket)
        alone = simulate_grid(rows_of(deep_record, members), [policy], DEPTH_COST)["predicted_speedup"].iloc[0]
        measured = generation_speedup(rows.iloc[members], policy.label())["speedup"]
        assert part["prompts"] == len(members) and part["predicted_llamacpp"] == pytest.approx(alone)
        assert part["llamacpp_speedup"] == pytest.approx(measured) and measured > 1
        assert part["error_llamacpp"] == pytest.approx(alone / measured - 1)
    shallow = np.flatnonzero(buckets == 0)
    assert by_bucket(rows_of(deep_record, shallow), policy, rows, [PROMPTS[i] for i in shallow], prompts,
                     DEPTH_COST) == []  # one bucket: nothing to split


def test_depth_prices_charge_deeper_rounds_more(deep_record):
    configs = policies()
    flat = dataclasses.replace(DEPTH_COST, by_depth={})
    priced, deep = simulate_grid(deep_record, configs, flat), simulate_grid(deep_record, configs, DEPTH_COST)
    assert (deep["predicted_time"] > priced["predicted_time"]).all()  # the deep prompt's rounds cost 2-3x
    assert "predicted_baseline_time" in deep and "predicted_baseline_time" not in priced
    # The baseline: every generated token's plain step at its own depth, by hand.
    steps = DEPTH_COST.at_depths(np.array([len(p) + j for p in PROMPTS for j in range(N)]))[1][:, 0]
    assert deep["predicted_baseline_time"].iloc[0] == pytest.approx(steps.sum())
    # One policy walked round by round prices exactly as the grid's walk does.
    for c, config in enumerate(configs):
        one, one_by_depth = simulate_priced(deep_record, config, DEPTH_COST)
        assert one["predicted_time"].iloc[0] == pytest.approx(deep["predicted_time"].iloc[c], rel=1e-12)
        assert one["rounds"].iloc[0] == deep["rounds"].iloc[c]
        grid_rows = simulate_grid_by_depth(deep_record, [config], DEPTH_COST)[1]
        assert one_by_depth["predicted_time"].tolist() == pytest.approx(grid_rows["predicted_time"].tolist())


def test_depth_search_takes_each_buckets_best_and_replays_it_exactly(deep_record):
    from dspark_bench import schedules
    from dspark_bench.decoding.rules import bucket_policies
    from dspark_bench.sections.depth import depth_search

    configs = [DecodeConfig.of(threshold=t, gamma_max=g, max_new_tokens=N, metric=m)
               for m in ("top1", "margin") for t in (0.1, 0.4, 0.8) for g in (1, 3, G)]
    configs += [DecodeConfig.of(schedule=schedules.BASELINE, gamma_max=g, min_draft_len=0, max_new_tokens=N)
                for g in (1, 3, G)]
    choice = depth_search(deep_record, configs, DEPTH_COST)
    assert choice is not None and schedules.of(choice.config).by_depth
    rows = choice.by_depth[choice.by_depth["config_id"] < len(configs)]
    rows = rows.assign(per_token=rows["predicted_time"] / rows["emitted_total"])
    for pick in choice.per_bucket.itertuples():  # each bucket's choice: the cheapest per token there, any metric
        there = rows[rows["depth_bucket"] == pick.depth_bucket]
        assert pick.seconds_per_token == pytest.approx(there["per_token"].min())
    runs = bucket_policies(choice.config)
    for pick in choice.per_bucket.itertuples():  # ... which the composed policy runs in that bucket
        mine, stop = runs[DEPTH_LABELS.index(pick.depth_bucket)].stopping, configs[pick.config_id].stopping
        assert (mine.schedule, mine.metric, mine.gamma_max) == (stop.schedule, stop.metric, stop.gamma_max)
        assert mine.threshold == stop.threshold or schedules.of(stop).baseline
    exact, _ = simulate_priced(deep_record, choice.config, DEPTH_COST)
    assert choice.row["predicted_time"].iloc[0] == exact["predicted_time"].iloc[0]
    best_single = simulate_grid(deep_record, configs, DEPTH_COST)["predicted_time"].min()
    # Separable up to the rounds that cross a bucket's edge: the composed policy is about as good or better.
    assert exact["predicted_time"].iloc[0] <= 1.05 * best_single


def test_the_bound_over_every_family_takes_each_buckets_cheapest_policy_of_any_schedule(deep_record):
    """Beyond the families the depth schedule composes (cumulative rules here, which it cannot run):
    in each bucket the cheapest policy per token of any schedule, at the best single policy's tokens
    there; never slower than that policy, and at least as fast as the composed depth policy."""
    from dspark_bench import schedules
    from dspark_bench.sections.depth import depth_search, every_family

    configs = [DecodeConfig.of(threshold=t, gamma_max=g, max_new_tokens=N, schedule=schedule)
               for schedule in (schedules.THRESHOLD, schedules.CUMULATIVE) for t in (0.1, 0.4, 0.8) for g in (1, 3, G)]
    configs += [DecodeConfig.of(schedule=schedules.BASELINE, gamma_max=g, min_draft_len=0, max_new_tokens=N)
                for g in (1, 3, G)]
    bound = every_family(deep_record, configs, DEPTH_COST)
    grid, by_depth = simulate_grid_by_depth(deep_record, configs, DEPTH_COST)
    single = int(grid["predicted_speedup"].idxmax())
    assert bound["best_single"] == {"config_label": configs[single].label(),
                                    "predicted_speedup": pytest.approx(grid["predicted_speedup"].max())}
    per_token = by_depth.assign(t=by_depth["predicted_time"] / by_depth["emitted_total"])
    mine = per_token[per_token["config_id"] == single].set_index("depth_bucket")
    assert [b["depth_bucket"] for b in bound["per_bucket"]] == [b for b in DEPTH_LABELS if b in mine.index]
    for b in bound["per_bucket"]:
        cheapest = per_token[per_token["depth_bucket"] == b["depth_bucket"]]["t"].min()
        own = mine.loc[b["depth_bucket"]]
        expected = own["predicted_baseline_time"] / (cheapest * own["emitted_total"])
        assert b["predicted_speedup"] == pytest.approx(expected)
        assert b["predicted_speedup"] >= b["best_single_there"] - 1e-12
    assert bound["bound_speedup"] >= bound["best_single"]["predicted_speedup"] and bound["gain"] >= 0
    composed = depth_search(deep_record, configs, DEPTH_COST).row["predicted_speedup"].iloc[0]
    assert composed <= bound["bound_speedup"] * 1.05  # a round crossing a bucket's edge aside
    assert any(b["config_label"] != bound["best_single"]["config_label"] for b in bound["per_bucket"]) or \
        bound["gain"] == pytest.approx(0)


def test_a_workload_in_one_bucket_gets_no_depth_policy(llama_pair):
    from dspark_bench.sections.depth import depth_search

    target, draft = llama_pair
    rec = record(SimpleNamespace(target=target, draft=draft, eos_ids=frozenset()), [[3, 4, 5]], N, G)
    assert depth_search(rec, policies(), DEPTH_COST) is None


def test_llama_cpp_prices_follow_depth_with_llama_bench_d(monkeypatch):
    """Each depth's passes come from llama-bench's own -d runs at that depth, scaled like the fitted ones."""
    from pathlib import Path

    from dspark_bench.engines import llamacpp_prices

    calls = []

    def fake_bench(binary, model, sizes, depth, threads):  # a pass: 1 ms a token plus 1 µs per cached token
        calls.append((model.name, depth))
        return {n: [0.001 * n + 1e-6 * depth] * 3 for n in sizes}

    monkeypatch.setattr(llamacpp_prices, "bench", fake_bench)
    assert llamacpp_prices.deep_enough(120, 4200) == []  # a short workload: one depth, as before
    depths = llamacpp_prices.deep_enough(1500, 3000)
    assert depths == [256, 1024, 2048]  # within the servers' context only
    timed = llamacpp_prices.depth_passes(Path("llama-bench"), Path("t.gguf"), Path("d.gguf"), depths, 2, None, 0.5)
    assert sorted(calls) == sorted((m, d) for m in ("t.gguf", "d.gguf") for d in depths)
    assert timed[1024]["t_draft"] == pytest.approx(0.5 * (0.001 + 1e-6 * 1024))
    # verify(k): target + draft passes over k + 1 tokens, as at the fitted depth
    assert timed[2048]["t_verify"] == pytest.approx([0.5 * 2 * (0.001 * (k + 1) + 1e-6 * 2048) for k in range(3)])


@pytest.fixture(scope="module")
def long_sweep(saved_pair, tmp_path_factory):
    """A replay sweep over prompts past the first depth bucket: its folder and what it printed."""
    import json

    from typer.testing import CliRunner

    from dspark_bench.cli import app

    tmp_path = tmp_path_factory.mktemp("long_sweep")
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    rows = [" ".join(words[(i + k) % len(words)] for k in range(n)) for i, n in enumerate((20, 30, 60, 70))]
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps({"prompt": r, "category": "long"}) + "\n" for r in rows))
    target, draft = saved_pair
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["sweep", "--target", target, "--draft", draft, "--dataset", str(data),
                                      "--out", str(out), "--max-new-tokens", "16", "--threshold", "0.2",
                                      "--threshold", "0.6", "--gamma-max", "2", "--gamma-max", "4",
                                      "--confirm-top", "1"])
    assert result.exit_code == 0, result.output
    (folder,) = [p for p in out.iterdir() if p.name != "records"]
    return folder, result.output


def test_a_sweep_over_long_prompts_proposes_a_depth_policy_and_judges_it(long_sweep):
    """Prompts past the first depth bucket: our passes timed at depth, each bucket's best composed
    into a depth policy, replayed, confirmed beside the best single one, and the two paired."""
    import json

    import pandas as pd

    folder, output = long_sweep
    # The plan counts the depth policy among the confirmed: the best single one, it, and fixed γ.
    assert "confirm 3 × 4 prompts" in " ".join(output.split())
    # Rounds reach 377 tokens; the tiny target reads 512: timed at 256 alone (none past what it reads).
    assert "our passes are timed at depths 256 and each round is priced at its own depth" in " ".join(output.split())
    prices = json.loads((folder / "prices.json").read_text())["batch_sizes"]["1"]
    assert set(prices["by_depth"]) == {"256"}
    table = pd.read_parquet(folder / "trials.parquet")
    depth = table[table["schedule"] == "depth"]
    assert len(depth) == 1 and depth["source"].iloc[0] == "confirmed"
    summary = json.loads((folder / "summary.json").read_text())
    by_depth = summary["depth_search"]
    assert by_depth["buckets"] == ["0-256", "256-1k"]
    assert [b["depth_bucket"] for b in by_depth["per_bucket_best"]] == by_depth["buckets"]
    assert by_depth["depth_policy"]["config_label"] == depth["config_label"].iloc[0]
    verdict = summary["depth_verdict"]
    assert verdict["candidate"] == depth["config_label"].iloc[0] and "sentence" in verdict
    assert set(pd.read_parquet(folder / "depth.parquet")["depth_bucket"]) == {"0-256", "256-1k"}
    said = " ".join(output.split())
    assert "by context depth: each bucket's best policy" in said
    assert f"depth policy vs best single policy, paired on the same prompts: {verdict['sentence']}" in said
    bound = by_depth["every_family"]  # over every family the sweep searched, learned and goodput included
    assert bound["bound_speedup"] >= bound["best_single"]["predicted_speedup"]
    assert [b["depth_bucket"] for b in bound["per_bucket"]] == by_depth["buckets"]
    assert f"replay's bound: {bound['bound_speedup']:.3f}×" in said


def test_the_report_of_a_depth_search_says_each_buckets_best_and_draws_it(long_sweep, tmp_path):
    """report: figure 14 and the sweep's "By depth" words, each bucket's best as summary.json says."""
    import json

    from dspark_bench.reporting.report import build_report, figures_written

    folder, _ = long_sweep
    summary = json.loads((folder / "summary.json").read_text())
    search, verdict = summary["depth_search"], summary["depth_verdict"]
    report = build_report(folder, out=tmp_path)
    assert "plots/depth.png" in figures_written(report) and (tmp_path / "plots" / "depth.png").stat().st_size > 0
    text = " ".join(report.read_text().split())
    assert "### By depth" in text and "by context depth: skipped" not in text
    single = {b["depth_bucket"]: b["predicted_speedup"] for b in search["best_single"]["buckets"]}
    for best in search["per_bucket_best"]:  # a goodput choice reads no threshold: —
        threshold = "—" if best["threshold"] is None else f"{best['threshold']:.2f}"
        assert (f"| {best['depth_bucket']} | {best['config_label']} | {threshold} | {best['gamma_max']} | "
                f"{best['predicted_speedup']:.3f} | {single[best['depth_bucket']]:.3f} |") in text
    assert f"Depth policy vs best single policy, paired on the same prompts: {verdict['sentence']}." in text
    assert f"into the depth policy {search['depth_policy']['config_label']}: predicted" in text


def test_the_depth_figure_draws_the_summarys_numbers_and_the_measured_speedups(long_sweep):
    """Figure 14's lines are summary.json's per-bucket numbers; its measured points are each prompt
    length bucket's sample_speedup of the policy's timed samples (the depth policy's shared with
    the policy that did the same work)."""
    import json

    import pandas as pd

    from dspark_bench.metrics import sample_speedup
    from dspark_bench.reporting import plots
    from dspark_bench.reporting.depth_tables import depth_search_rows
    from dspark_bench.reporting.plots.depth import ROLES
    from dspark_bench.reporting.report_inputs import load_inputs

    folder, _ = long_sweep
    search = json.loads((folder / "summary.json").read_text())["depth_search"]
    fig = plots.depth_axis(depth_search_rows(load_inputs(folder)))
    accept, gamma, threshold, speed = fig.axes[:4]
    assert [t.get_text() for t in speed.get_xticklabels()] == search["buckets"]

    def drawn(ax, role):  # a role's line with markers (the depth policy's band has none, a measured point no line)
        (line,) = [x for x in ax.lines if x.get_color() == ROLES[role] and x.get_marker() not in ("None", "")
                   and x.get_linestyle() != "None"]
        return list(line.get_xdata()), list(line.get_ydata())

    for key, role in (("depth_policy", "depth policy"), ("best_single", "best single policy"),
                      ("best_fixed", "best fixed γ")):
        buckets = search[key]["buckets"]
        xs = [search["buckets"].index(b["depth_bucket"]) for b in buckets]
        assert drawn(accept, role) == (xs, pytest.approx([b["acceptance_rate"] for b in buckets]))
        assert drawn(speed, role) == (xs, pytest.approx([b["predicted_speedup"] for b in buckets]))
    chosen = search["per_bucket_best"]
    assert drawn(gamma, "depth policy")[1] == [b["gamma_max"] for b in chosen]
    assert drawn(threshold, "depth policy")[1] == pytest.approx([np.nan if b["threshold"] is None else b["threshold"]
                                                                 for b in chosen], nan_ok=True)  # goodput: none

    trials, samples = pd.read_parquet(folder / "trials.parquet"), pd.read_parquet(folder / "samples.parquet")
    shared = dict(zip(trials["config_label"], trials["same_as"].fillna(trials["config_label"])))
    points = {c.lines[0].get_color(): list(c.lines[0].get_ydata()) for c in speed.containers}
    for key, role in (("depth_policy", "depth policy"), ("best_single", "best single policy")):
        mine = samples[samples["config_label"] == shared[search[key]["config_label"]]]
        bucket = ["0-256" if n < 256 else "256-1k" for n in mine["prompt_tokens"]]
        expected = [sample_speedup(group)[0] for _, group in mine.groupby(bucket, sort=True)]
        assert len(expected) == 2 and points[ROLES[role]] == pytest.approx(expected)
    assert ROLES["best fixed γ"] not in points  # measured: the two the sweep pairs


def test_the_depth_figure_orders_buckets_and_styles_each_task():
    """Rows in any order: every line runs shallowest bucket first, on DEPTH_LABELS' order; two
    tasks get a line style each and a legend entry each."""
    import pandas as pd

    from dspark_bench.reporting import plots
    from dspark_bench.reporting.plots.depth import ROLES

    buckets = ["2k-4k", "0-256", "1k-2k"]  # 256-1k: no rounds there
    rows = pd.DataFrame(
        [{"task": task, "role": role, "source": "replay", "config_label": role, "depth_bucket": b,
          "acceptance_rate": 0.1 * i + t, "predicted_speedup": 1.0 + i, "gamma_max": None, "threshold": None}
         for t, task in enumerate(("code", "prose")) for role in ROLES for i, b in enumerate(buckets)]
        + [{"task": "code", "role": "each bucket's best", "source": "replay", "config_label": "x", "depth_bucket": b,
            "gamma_max": g, "threshold": 0.5} for b, g in zip(buckets, (2, 6, 4))])
    fig = plots.depth_axis(rows)
    accept, gamma = fig.axes[:2]
    assert [t.get_text() for t in accept.get_xticklabels()] == ["0-256", "1k-2k", "2k-4k"]
    (chosen,) = gamma.lines
    xs = list(chosen.get_xdata())  # nudged a little: the tasks side by side
    assert [round(x) for x in xs] == [0, 1, 2] and list(chosen.get_ydata()) == [6, 4, 2]
    styles = {line.get_linestyle() for line in accept.lines if line.get_color() == ROLES["best fixed γ"]}
    assert styles == {"-", "--"}
    assert {"code", "prose"} <= {t.get_text() for t in fig.legends[0].get_texts()}


def test_loss_by_depth_averages_each_buckets_positions(llama_pair):
    """The long pair's report: mean next-token loss over each bucket's positions, and agreement the
    share of positions where the draft's top-1 is the target's (a model agrees with itself: 1)."""
    import torch

    from dspark_bench.reference.long import loss_by_depth

    target, draft = llama_pair
    windows = np.random.default_rng(0).integers(1, 100, size=(2, 301))
    got = loss_by_depth(target, windows, draft=target, edges=(0, 100, 300))
    assert list(got["loss"]) == ["0-100", "100-300"] and set(got["agreement_top1"].values()) == {1.0}
    with torch.inference_mode():
        ids = torch.from_numpy(windows)
        losses = torch.nn.functional.cross_entropy(target(ids[:, :300]).logits.transpose(1, 2).float(), ids[:, 1:],
                                                   reduction="none")
    assert got["loss"]["0-100"] == pytest.approx(float(losses[:, :100].mean()), abs=1e-4)
    assert got["loss"]["100-300"] == pytest.approx(float(losses[:, 100:].mean()), abs=1e-4)
    assert "agreement_top1" not in loss_by_depth(draft, windows, edges=(0, 100, 300))


def test_a_prompt_past_the_targets_trained_context_is_said_in_one_line(llama_pair, monkeypatch):
    import dspark_bench.tasks.prompts as prompts_module
    from dspark_bench.harness.models import context_warning
    from dspark_bench.tasks.prompts import Prompt

    target, _ = llama_pair
    pair = SimpleNamespace(target=target, tokenizer=None)
    trained = target.config.max_position_embeddings
    monkeypatch.setattr(prompts_module, "encode", lambda tokenizer, text, template="auto": list(range(len(text))))
    assert context_warning(pair, [Prompt("a", "x" * 10)], 8) is None
    said = context_warning(pair, [Prompt("a", "x" * 10), Prompt("b", "x" * trained)], 8)
    assert said == (f"note: the longest prompt is {trained:,} tokens; with 8 new ones it runs past the target's "
                    f"trained context of {trained:,} tokens (a long task's pair: `dspark-bench models build --long`)")


def test_a_depth_policy_with_an_entry_no_round_reaches_is_refused_before_decoding(tmp_path):
    """The shipped target is trained on 256 tokens: an entry for 256-1k is read by no round of a short
    prompt (one line, nothing decoded or written); one for its own bucket alone decodes. A prompt that
    itself runs past 256 tokens reaches the entry, and it is taken."""
    from typer.testing import CliRunner

    from dspark_bench.cli import app

    runner = CliRunner()
    refused = runner.invoke(app, ["decode", "def f(x):", "--schedule", "depth", "--depth-policy", "0.5/4,0.3/6",
                                  "--max-new-tokens", "8"])
    assert refused.exit_code == 1 and "its entry 0.3/6 is for depths 256-1k, where no round starts" in refused.output
    assert refused.output.count("\n") <= 2
    out = tmp_path / "runs"
    run = runner.invoke(app, ["run", "--task", "code", "--limit", "1", "--schedule", "depth", "--depth-policy",
                              "0.5/4,0.3/6", "--max-new-tokens", "8", "--out", str(out)])
    assert run.exit_code == 1 and "where no round starts" in run.output and not any(out.iterdir())
    fine = runner.invoke(app, ["decode", "def f(x):", "--schedule", "depth", "--depth-policy", "0.5/4",
                               "--max-new-tokens", "8"])
    assert fine.exit_code == 0, fine.output
    deep = runner.invoke(app, ["decode", "x = 1\n" * 80, "--schedule", "depth", "--depth-policy", "0.5/4,0.3/6",
                               "--max-new-tokens", "4"])
    assert deep.exit_code == 0, deep.output


def test_a_sweep_over_the_depth_schedule_says_it_is_composed_not_searched(saved_pair, prompts_file, tmp_path):
    from typer.testing import CliRunner

    from dspark_bench.cli import app

    target, draft = saved_pair
    result = CliRunner().invoke(app, ["sweep", "--target", target, "--draft", draft, "--dataset", str(prompts_file),
                                      "--out", str(tmp_path), "--schedule", "depth"])
    assert result.exit_code == 1 and "the depth schedule is not searched: a replay sweep composes" in result.output
    assert list(tmp_path.iterdir()) == []  # refused before anything is written


def test_a_grid_with_depth_policies_walks_them_one_at_a_time_in_their_places(deep_record):
    from dspark_bench import schedules

    depth = DecodeConfig.of(schedule=schedules.DEPTH, depth_policy="0.3/2,0.0/5", max_new_tokens=N)
    configs = [policies()[0], depth, policies()[3]]
    table, by_depth = simulate_grid_by_depth(deep_record, configs, DEPTH_COST)
    assert table["config_id"].tolist() == [0, 1, 2] and table["config_label"].tolist() == [c.label() for c in configs]
    alone, alone_by_depth = simulate_priced(deep_record, depth, DEPTH_COST)
    assert table.iloc[1]["predicted_time"] == alone["predicted_time"].iloc[0]
    assert by_depth[by_depth["config_id"] == 1]["rounds"].tolist() == alone_by_depth["rounds"].tolist()
    plain = simulate_grid(deep_record, [configs[0], configs[2]], DEPTH_COST)
    assert table.iloc[[0, 2]]["predicted_time"].tolist() == plain["predicted_time"].tolist()


def test_long_prompts_prefills_are_priced_on_both_sides(deep_record):
    """A measured speedup includes each side's prefill; with the depth axis timing them, replay does too."""
    entry = {d: {**e, "t_prefill_target": 1e-4 * (1 + d / 1024), "t_prefill_draft": 1e-5}
             for d, e in DEPTH_COST.by_depth.items()}
    cost = dataclasses.replace(DEPTH_COST, by_depth=entry)
    target, draft = cost.prefills([256, 640, 1024])
    assert target.tolist() == pytest.approx([256 * 1.25e-4, 640 * 1.625e-4, 1024 * 2e-4])
    assert draft.tolist() == pytest.approx([256e-5, 640e-5, 1024e-5])
    configs = policies()
    without, with_prefill = simulate_grid(deep_record, configs, DEPTH_COST), simulate_grid(deep_record, configs, cost)
    prompt_target, prompt_draft = cost.prefills([len(p) for p in PROMPTS])
    assert (with_prefill["predicted_baseline_time"] - without["predicted_baseline_time"]).tolist() == pytest.approx(
        [prompt_target.sum()] * len(configs))
    assert (with_prefill["predicted_time"] - without["predicted_time"]).tolist() == pytest.approx(
        [prompt_target.sum() + prompt_draft.sum()] * len(configs))
    _, by_depth = simulate_grid_by_depth(deep_record, configs, cost)
    assert by_depth.groupby("config_id")["predicted_time"].sum().tolist() == pytest.approx(
        with_prefill["predicted_time"].tolist())


def test_the_long_pair_decodes_a_long_prompts_slice_exactly_as_its_target(tmp_path):
    """The shipped long-context pair on a slice of a long prompt that crosses depth 256 (the long
    prompts themselves: benchmarks/measurements/depth.py): greedy speculative output, under a depth policy and a
    fixed γ, is the target's own token for token, and replay walks the decoder's rounds."""
    from dspark_bench import schedules
    from dspark_bench.decoding.autoregressive import autoregressive_decode
    from dspark_bench.decoding.speculative import speculative_decode
    from dspark_bench.harness.models import load_pair
    from dspark_bench.reference.long import long_pair_paths

    pair = load_pair(None, None, pair="long")
    assert pair.target_name == str(long_pair_paths()[0]) and pair.target.config.max_position_embeddings == 4096
    text = (Path(__file__).resolve().parents[1] / "dspark_bench" / "replay" / "simulate.py").read_text()
    ids = pair.tokenizer(text)["input_ids"][:240]
    tokens = 40
    plain = autoregressive_decode(pair.target, ids, DecodeConfig.of(max_new_tokens=tokens), pair.eos_ids).tokens
    rec = record(pair, [ids], tokens, 6, eos_ids=pair.eos_ids)
    for config in (DecodeConfig.of(schedule=schedules.DEPTH, depth_policy="0.0/2,0.3/6", max_new_tokens=tokens),
                   DecodeConfig.of(schedule=schedules.BASELINE, gamma_max=4, min_draft_len=0, max_new_tokens=tokens)):
        real = speculative_decode(pair.target, pair.draft, ids, config, pair.eos_ids)
        assert real.tokens == plain, config.label()
        replayed = simulate(rec, config)[0]
        assert [(r.drafted, r.accepted) for r in replayed] == [(r.drafted, r.accepted) for r in real.rounds]

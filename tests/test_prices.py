"""Cost-model files (replay/cost_file.py): the format and its one-line refusals, rounds priced
with an engine's per-round and plain-decoding costs, a sweep ranked on an engine's prices, and
an export that writes plain decoding where no speculative policy wins on those prices."""

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_sweep import base_args, only_folder
from typer.testing import CliRunner

from dspark_bench.cli import app
from dspark_bench.config import DecodeConfig
from dspark_bench.engines.export import break_even
from dspark_bench.engines.files import parse
from dspark_bench.errors import DsparkError
from dspark_bench.replay import cost_file
from dspark_bench.replay.cost import CostModel, CostSurface
from dspark_bench.replay.simulate import Record, simulate, simulate_grid

runner = CliRunner()
MODELS = {"target": "t", "draft": "d", "target_fingerprint": "aaaa", "draft_fingerprint": "bbbb"}


def engine_costs(**changes) -> CostModel:
    values = {"t_draft": 0.002, "t_verify": [0.010, 0.011, 0.0115, 0.012, 0.013, 0.0135, 0.014, 0.015, 0.016],
              "context_tokens": 100, "t_round": 0.001, "t_plain": 0.0105, **changes}
    return CostModel.from_dict(values)


def engine_file(models=MODELS, **changes) -> cost_file.CostFile:
    return cost_file.CostFile(CostSurface({1: engine_costs(**changes)}), {"name": "llamacpp", "version": "b11434"},
                              dict(models), "made up for a test", cost_file.machine(), cost_file.now())


def test_a_cost_model_file_round_trips_with_its_provenance(tmp_path):
    path = engine_file().save(tmp_path / "prices.json")
    loaded = cost_file.load(path)
    assert loaded.to_dict() == engine_file().to_dict() | {"measured": loaded.measured, "machine": loaded.machine}
    assert loaded.label == "llama.cpp b11434" and loaded.surface.at(1).t_round == 0.001
    emptied = cost_file.load(engine_file(t_round_empty=0.0004).save(tmp_path / "empty.json")).surface.at(1)
    assert emptied.t_round_empty == 0.0004 and emptied.round_costs()[:2] == [0.0104, 0.012]
    assert json.loads(path.read_text())["format_version"] == cost_file.FORMAT_VERSION
    # What a round adds per drafted token is kept; a model flat in the draft is written as before the term.
    per_token = cost_file.load(engine_file(t_round_token=0.0003).save(tmp_path / "token.json")).surface.at(1)
    assert per_token.t_round_token == 0.0003 and per_token.round_costs()[:3] == pytest.approx([0.011, 0.0123, 0.0131])
    assert "t_round_token" not in json.loads(path.read_text())["batch_sizes"]["1"]


def test_a_version_1_cost_model_file_still_loads(tmp_path):
    """Version 1 named who measured the costs "engine", our decoder included ("ours")."""
    data = engine_file().to_dict()
    data = {**{k: v for k, v in data.items() if k != "measured_by"}, "format_version": 1,
            "engine": data["measured_by"]}
    (tmp_path / "v1.json").write_text(json.dumps(data))
    loaded = cost_file.load(tmp_path / "v1.json")
    assert loaded.label == "llama.cpp b11434" and loaded.measured_by == {"name": "llamacpp", "version": "b11434"}
    written = loaded.to_dict()
    assert written["format_version"] == 2 and "engine" not in written and written["measured_by"]["name"] == "llamacpp"


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("format"), "is not a dspark-bench cost model"),
    (lambda d: d.update(format_version=3), "has format_version 3"),
    (lambda d: d.pop("method"), "has no 'method'"),
    (lambda d: d["measured_by"].pop("name"), "names nobody who measured it"),
    (lambda d: d["batch_sizes"]["1"].pop("t_verify"), "lacks t_verify"),
    (lambda d: d["batch_sizes"]["1"].update(t_verify=[0.01]), "at least k = 0 and 1"),
    (lambda d: d["batch_sizes"]["1"].update(t_round=-0.001), "t_round is -0.001"),
    (lambda d: d["batch_sizes"]["1"].update(t_round_empty=-0.001), "t_round_empty is -0.001"),
    (lambda d: d["batch_sizes"]["1"].update(t_round_token=-0.001), "t_round_token is -0.001"),
    (lambda d: d["batch_sizes"]["1"]["t_verify"].__setitem__(3, float("nan")), r"t_verify\[3\] is nan"),
    (lambda d: d["batch_sizes"]["1"].update(t_draft="fast"), "t_draft is 'fast'"),
    (lambda d: d["batch_sizes"].update({"0": d["batch_sizes"]["1"]}), "batch size '0'"),
    (lambda d: d["batch_sizes"].update({"8": d["batch_sizes"]["1"]}), "fold them into t_verify"),
])
def test_a_bad_cost_model_file_is_refused_in_one_line(tmp_path, change, message):
    data = engine_file().to_dict()
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DsparkError, match=message) as error:
        cost_file.load(path)
    assert "\n" not in str(error.value)


def test_a_cost_model_for_other_models_is_refused():
    with pytest.raises(DsparkError, match="was measured for another draft"):
        engine_file().check_models({**MODELS, "draft_fingerprint": "cccc"})
    named = engine_file({"target": "org/big", "draft": "org/small"})
    named.check_models({"target": "org/big", "draft": "org/small", "target_fingerprint": "x"})
    with pytest.raises(DsparkError, match="was measured for target 'org/big', not 'org/other'"):
        named.check_models({"target": "org/other", "draft": "org/small"})
    with pytest.raises(DsparkError, match="is not a file"):
        cost_file.resolve("/nowhere/prices.json", MODELS)
    with pytest.raises(DsparkError, match="no llama.cpp cost model for this pair yet"):
        cost_file.resolve("llamacpp", {**MODELS, "target_fingerprint": "none-measured"})


def synthetic_record(prompts: int = 6, tokens: int = 40, gamma: int = 8, seed: int = 0) -> Record:
    """A record whose draft agrees with the continuation at random, top1 a noisy cue of agreement."""
    rng = np.random.default_rng(seed)
    continuation = rng.integers(3, 50, size=(prompts, tokens))
    agree = rng.random((prompts, tokens, gamma)) < 0.7
    ahead = np.full((prompts, tokens, gamma), -1)
    for k in range(gamma):
        ahead[:, : tokens - k, k] = continuation[:, k:]
    rollout = np.where(agree & (ahead >= 0), ahead, 1)
    top1 = np.clip(np.where(agree, 0.8, 0.3) + rng.normal(0, 0.15, agree.shape), 0.01, 1).astype(np.float32)
    confidences = {name: top1 for name in ("top1", "llamacpp_top1", "entropy", "margin", "topk_mass", "gini")}
    info = {"topk": 5, "max_new_tokens": tokens, "gamma_record": gamma}
    return Record(continuation, np.full(prompts, tokens), rollout, confidences, frozenset(), info,
                  np.full((prompts, tokens), gamma))


def test_round_and_plain_costs_price_every_round():
    """predicted = N · t_plain / Σ (s · t_draft + t_verify(L) + t_round + L · t_round_token), from the
    rounds themselves, t_round_empty in place of t_round where a draft came back empty; a cost model
    without it charges t_round there, one without any prices as before (plain = t_verify(0), no
    round cost)."""
    rec = synthetic_record()
    policies = [DecodeConfig.of(schedule="fixed", gamma_max=g, min_draft_len=0, max_new_tokens=40, semantics="llamacpp")
                for g in (1, 3, 6)] + [DecodeConfig.of(threshold=0.5, gamma_max=8, min_draft_len=0, max_new_tokens=40,
                                                       semantics="llamacpp")]
    assert sum(r.drafted == 0 for prompt in simulate(rec, policies[-1]) for r in prompt) > 20  # empty drafts to price
    for cost in (engine_costs(), engine_costs(t_round_empty=0.0002), engine_costs(t_round=0.0, t_plain=0.0),
                 engine_costs(t_round_empty=0.0002, t_round_token=0.0004)):
        table = simulate_grid(rec, policies, cost)
        empty = cost.t_round if cost.t_round_empty is None else cost.t_round_empty
        for config, predicted in zip(policies, table["predicted_speedup"]):
            rounds = [r for prompt in simulate(rec, config) for r in prompt]
            spent = sum(r.draft_forwards * cost.t_draft + cost.t_verify[r.drafted]
                        + (cost.t_round + r.drafted * cost.t_round_token if r.drafted else empty)
                        for r in rounds)
            plain = cost.t_plain or cost.t_verify[0]
            assert predicted == pytest.approx(rec.lengths.sum() * plain / spent, rel=1e-12)
            assert predicted == pytest.approx(cost.predict(rounds, int(rec.lengths.sum())), rel=1e-12)
    # Cheaper empty rounds raise the threshold policy's prediction; the fixed γ's barely (only a
    # prompt's last round, with no room left, drafts nothing).
    same, cheaper = (simulate_grid(rec, policies, engine_costs(t_round_empty=e))["predicted_speedup"]
                     for e in (None, 0.0))
    assert cheaper.iloc[-1] > same.iloc[-1] * 1.01 and np.allclose(cheaper.iloc[:3], same.iloc[:3], rtol=5e-3)
    # A round's fixed cost favours fewer, longer rounds: it can change which γ wins.
    cheap, dear = (simulate_grid(rec, policies[:3], engine_costs(t_round=r)) for r in (0.0, 0.02))
    assert cheap["predicted_speedup"].idxmax() != dear["predicted_speedup"].idxmax()


def test_the_fit_finds_what_an_engine_adds_per_drafting_and_per_empty_round():
    """Timings made from known overheads (2 ms per drafting round, 0.5 ms per empty one) over
    replay's own rounds: fit_overheads gives both back, t_round from the fixed γ runs and
    t_round_empty from the run whose drafts are all empty (llama.cpp's p-min 1 fit run)."""
    rec = synthetic_record()
    passes = CostModel(0.002, [0.010, 0.011, 0.0115, 0.012, 0.013, 0.0135, 0.014, 0.015, 0.016], 100)
    policies = [DecodeConfig.of(schedule="fixed", gamma_max=g, min_draft_len=0, max_new_tokens=40, semantics="llamacpp")
                for g in (5, 7)] + [DecodeConfig.of(threshold=1.0, gamma_max=1, min_draft_len=0, max_new_tokens=40,
                                                    semantics="llamacpp")]
    runs = []
    for policy in policies:
        rows = []
        for p, rounds in enumerate(simulate(rec, policy)):
            spec = sum(r.draft_forwards * passes.t_draft + passes.t_verify[r.drafted] + (0.002 if r.drafted else 0.0005)
                       for r in rounds)
            rows.append({"prompt_id": f"p{p}", "spec_s": spec, "new_tokens": int(rec.lengths[p]),
                         "baseline_s": 0.0105 * 40, "baseline_new_tokens": 40})
        runs.append((policy, pd.DataFrame(rows)))
    model, per_run = cost_file.fit_overheads(passes, rec, runs)
    assert model.t_round == pytest.approx(0.002, rel=0.02) and model.t_round_empty == pytest.approx(0.0005, rel=1e-6)
    assert model.t_plain == pytest.approx(0.0105) and len(per_run) == 3 * 6
    alone, _ = cost_file.fit_overheads(passes, rec, runs[:2])  # no empty run: empty rounds cost t_round
    assert alone.t_round_empty is None and alone.round_costs()[0] == passes.t_verify[0] + alone.t_round
    # A slow stretch of the machine under a whole fit run slows both of its sides: the fit reads
    # each pair's ratio, so it finds the same costs (absolute seconds would put 30 % of a round in t_round).
    slow = runs[1][1].assign(spec_s=runs[1][1]["spec_s"] * 1.3, baseline_s=runs[1][1]["baseline_s"] * 1.3)
    drifted, _ = cost_file.fit_overheads(passes, rec, [runs[0], (runs[1][0], slow), runs[2]])
    assert drifted.t_round == pytest.approx(model.t_round, rel=0.02) and drifted.t_plain == pytest.approx(0.0105)


def test_the_fit_finds_what_a_round_adds_per_drafted_token():
    """Timings made from rounds that cost more the more they draft (1.5 ms + 0.4 ms a drafted token
    past their passes; 0.5 ms an empty one), on llama.cpp's fit runs (fixed γ 2, 5 and 7, p-min 1):
    the per-token fit gives all three back, and prices what a threshold policy's rounds, mostly
    short drafts, took past their passes as they were made. One t_round fitted flat (as before the
    term) reads the long drafts' overhead and prices those rounds' more than 15 % too dear."""
    from dspark_bench.engines.llamacpp_prices import FIT_GAMMAS

    rec = synthetic_record()
    passes = CostModel(0.002, [0.010, 0.011, 0.0115, 0.012, 0.013, 0.0135, 0.014, 0.015, 0.016], 100)
    overhead = lambda r: 0.0015 + 0.0004 * r.drafted if r.drafted else 0.0005  # noqa: E731

    def timed(policy) -> pd.DataFrame:
        rows = []
        for p, rounds in enumerate(simulate(rec, policy)):
            spec = sum(r.draft_forwards * passes.t_draft + passes.t_verify[r.drafted] + overhead(r) for r in rounds)
            rows.append({"prompt_id": f"p{p}", "spec_s": spec, "new_tokens": int(rec.lengths[p]),
                         "baseline_s": 0.0105 * 40, "baseline_new_tokens": 40})
        return pd.DataFrame(rows)

    knobs = dict(min_draft_len=0, max_new_tokens=40, semantics="llamacpp")
    fits = [DecodeConfig.of(schedule="fixed", gamma_max=g, **knobs) for g in FIT_GAMMAS]
    fits.append(DecodeConfig.of(threshold=1.0, gamma_max=1, **knobs))
    runs = [(policy, timed(policy)) for policy in fits]
    model, per_run = cost_file.fit_overheads(passes, rec, runs, per_token=True)
    assert model.t_round == pytest.approx(0.0015, rel=0.03) and model.t_round_token == pytest.approx(0.0004, rel=0.03)
    assert model.t_round_empty == pytest.approx(0.0005, rel=0.05) and {r["drafted"] for r in per_run} != {0}
    threshold = DecodeConfig.of(threshold=0.5, gamma_max=7, **knobs)
    rounds = [r for prompt in simulate(rec, threshold) for r in prompt]
    assert np.mean([r.drafted for r in rounds if r.drafted]) < 4  # mostly short drafts: where the two fits part
    made = sum(overhead(r) for r in rounds)  # what its rounds took past their passes
    priced = lambda cost: sum(cost.round_costs()[r.drafted] - passes.t_verify[r.drafted] for r in rounds)  # noqa
    assert priced(model) == pytest.approx(made, rel=0.02)
    flat, _ = cost_file.fit_overheads(passes, rec, runs)
    assert flat.t_round_token == 0.0 and priced(flat) / made - 1 > 0.15
    # Fitted on policies that draft alike there is no slope to read: the fit stays flat.
    alike, _ = cost_file.fit_overheads(passes, rec, [runs[1], runs[1]], per_token=True)
    assert alike.t_round_token == 0.0


def test_the_fit_prices_each_fit_prompt_at_its_own_depth():
    """Fit prompts of 300 to 3,400 tokens, timed on passes that grow with depth (each drafting round
    2 ms past its passes, each plain step 0.3 ms past its one-token pass): priced at their own
    depths, as replay prices a run's rounds, the fit gives both back. Priced at one depth, as it
    was, t_round came out far off (llama-server's fit read 2.6 ms where its prompts' depths said 2.4)."""
    rec = synthetic_record()
    rec.info["prompt_tokens"] = [300, 700, 1200, 1800, 2500, 3400]
    shallow = [0.010, 0.011, 0.0115, 0.012, 0.013, 0.0135, 0.014, 0.015, 0.016]
    grow = lambda depth: 1 + (depth - 256) / 1792  # noqa: E731  twice the cost at 2,048, linear past it
    passes = CostModel(0.003, [2 * t for t in shallow], 2048,
                       by_depth={256: {"t_draft": 0.002, "t_verify": shallow},
                                 2048: {"t_draft": 0.003, "t_verify": [2 * t for t in shallow]}})
    policies = [DecodeConfig.of(schedule="fixed", gamma_max=g, min_draft_len=0, max_new_tokens=40, semantics="llamacpp")
                for g in (5, 7)]
    runs = []
    for policy in policies:
        rows = []
        for p, rounds in enumerate(simulate(rec, policy)):
            depth, spec = rec.info["prompt_tokens"][p], 0.0
            for r in rounds:
                spec += r.draft_forwards * 0.001 * (1 + grow(depth)) + shallow[r.drafted] * grow(depth) + 0.002
                depth += r.emitted
            plain = sum(shallow[0] * grow(rec.info["prompt_tokens"][p] + i) + 0.0003 for i in range(40))
            rows.append({"prompt_id": f"p{p}", "spec_s": spec, "new_tokens": 40, "baseline_s": plain,
                         "baseline_new_tokens": 40})
        runs.append((policy, pd.DataFrame(rows)))
    model, _ = cost_file.fit_overheads(passes, rec, runs)
    assert model.t_round == pytest.approx(0.002, rel=1e-6)
    assert model.t_plain == pytest.approx(2 * shallow[0] + 0.0003, rel=1e-6)  # its pass at 2,048 and what it adds
    flat, _ = cost_file.fit_overheads(dataclasses.replace(passes, by_depth={}), rec, runs)
    assert abs(flat.t_round / 0.002 - 1) > 0.25


def test_break_even_acceptance_matches_the_fixed_gamma_it_names():
    cost = engine_costs()
    alpha, gamma = break_even(cost)
    tokens = sum(alpha ** i for i in range(gamma + 1))
    assert (tokens * cost.t_plain / (gamma * cost.t_draft + cost.t_verify[gamma] + cost.t_round)
            == pytest.approx(1, abs=1e-6))
    for other in range(1, len(cost.t_verify)):  # every other γ needs more
        tokens = sum(alpha ** i for i in range(other + 1))
        assert tokens * cost.t_plain <= (other * cost.t_draft + cost.t_verify[other] + cost.t_round) * (1 + 1e-6)


def test_sweep_ranks_on_an_engines_prices_and_export_writes_plain_decoding_where_none_wins(
        saved_pair, prompts_file, tmp_path, monkeypatch):
    """Priced on a file: every prediction is that file's (re-replayed exactly), our decoder's own
    prediction sits beside it for the confirmation, and the summary says whose prices. An engine
    on whose prices no policy beats plain decoding gets plain decoding from export, with why."""
    prices_home = tmp_path / "prices"  # its own: the made-up prices must not reach other tests' exports
    monkeypatch.setenv("DSPARK_PRICES_HOME", str(prices_home))
    ours_out = tmp_path / "ours"
    result = runner.invoke(app, base_args(saved_pair, prompts_file, ours_out) + ["--confirm-top", "1"])
    assert result.exit_code == 0, result.output
    ours = cost_file.load(only_folder(ours_out) / "prices.json")  # our decoder's, with this pair's fingerprints
    assert ours.measured_by["name"] == "ours" and "predicted on our decoder's prices" in " ".join(result.output.split())
    # A slow draft: speculation loses everywhere on these prices.
    slow = cost_file.CostFile(CostSurface({1: CostModel(0.05, [0.01] * 5, 20, t_round=0.002, t_plain=0.0101)}),
                              {"name": "llamacpp", "version": "b11434"}, ours.models, "made up for a test")
    slow.save(prices_home / "llamacpp-test.json")
    assert parse("llamacpp", "# plain\n") == {1: (0, 0.0, 0, "plain")}
    out = tmp_path / "engine"
    result = runner.invoke(app, base_args(saved_pair, prompts_file, out)
                           + ["--confirm-top", "1", "--prices", "llamacpp"])
    assert result.exit_code == 0, result.output
    assert "predicted on llama.cpp b11434's prices" in " ".join(result.output.split())
    folder = only_folder(out)
    summary = json.loads((folder / "summary.json").read_text())
    assert (summary["prices"]["label"] == "llama.cpp b11434"
            and summary["cost_model_accuracy"]["priced_by"] == "predicted_speedup_ours")
    assert cost_file.load(folder / "prices.json").to_dict()["batch_sizes"] == slow.to_dict()["batch_sizes"]
    table = pd.read_parquet(folder / "trials.parquet")
    rec = Record.load(Path(summary["record"]))
    from dspark_bench.engines.export import policy_of

    plain = table[table["metric"] != "learned"].head(12)
    configs = [policy_of(row, folder) for _, row in plain.iterrows()]
    assert np.allclose(simulate_grid(rec, configs, slow.surface.at(1))["predicted_speedup"], plain["predicted_speedup"])
    ours_here = cost_file.load(folder / "prices_ours.json").surface.at(1)
    assert np.allclose(simulate_grid(rec, configs, ours_here)["predicted_speedup"], plain["predicted_speedup_ours"])
    assert (table["predicted_speedup"] < 1).all()
    exported = runner.invoke(app, ["export", str(folder), "--format", "llamacpp", "--out", str(tmp_path / "x")])
    assert exported.exit_code == 0, exported.output
    flags = (tmp_path / "x" / "llama_cpp_flags.txt").read_text()
    # no speculative flags
    assert not [line for line in flags.splitlines() if line.strip() and not line.startswith("#")]
    about = (tmp_path / "x" / "llamacpp.md").read_text()
    assert "plain decoding (no speculative flags)" in about and "breaks even only where each drafted token" in about
    assert "writes plain decoding" in exported.output and "llama.cpp's own default policy" in exported.output
    # The sweep's own prices.json is llama.cpp's: copied to a machine without the cache, the same export.
    monkeypatch.setenv("DSPARK_PRICES_HOME", str(tmp_path / "empty"))
    elsewhere = runner.invoke(app, ["export", str(folder), "--format", "llamacpp", "--out", str(tmp_path / "y")])
    assert elsewhere.exit_code == 0 and "writes plain decoding" in elsewhere.output
    assert (tmp_path / "y" / "llama_cpp_flags.txt").read_text() == flags
    # Where the sweep measured its picks in llama.cpp, export writes what was measured, not replay's pick.
    summary_path = folder / "summary.json"
    measured = DecodeConfig.of(schedule="fixed", gamma_max=2, min_draft_len=0, semantics="llamacpp",
                               max_new_tokens=rec.max_new_tokens)
    best = {"policy": measured.label(), "config": measured.to_dict(), "measured": 1.2, "measured_low": 1.1,
            "measured_high": 1.3}
    defaults = {"policy": "fixed γ=3 · llama.cpp rule", "measured": 1.2}  # a row from before rows kept configs
    for wins, sentence, chosen in (("speculative", "fixed γ=2 is faster there", best),
                                   ("neither", "no policy is faster there", best),
                                   ("speculative", "the defaults are faster there", defaults)):
        summary_path.write_text(json.dumps({**summary, "engine_verdict": {
            "engine": "llama.cpp b11434", "wins": wins, "best": chosen, "sentence": sentence, "rows": []}}))
        out = tmp_path / sentence.replace(" ", "-")
        said = runner.invoke(app, ["export", str(folder), "--format", "llamacpp", "--out", str(out)])
        assert said.exit_code == 0, said.output
        written = [line for line in (out / "llama_cpp_flags.txt").read_text().splitlines()
                   if line.strip() and not line.startswith("#")]
        if wins == "speculative":  # replay on these prices said plain decoding; llama.cpp measured it faster
            gamma = 2 if chosen is best else 3
            assert written and f"--spec-draft-n-max {gamma}" in " ".join(written)
            told = " ".join(said.output.split())
            assert "writes plain decoding" not in told and f"measured by the sweep: {sentence}" in told
            assert chosen["policy"] in told and "own default policy" not in told  # what it writes, no stale prediction
        else:
            assert not written
            assert f"writes plain decoding: the sweep measured it in llama.cpp b11434: {sentence}" in " ".join(
                said.output.split())
    summary_path.write_text(json.dumps(summary))
    # A file for a batch size the sweep does not have is refused before anything is replayed.
    refused = runner.invoke(app, base_args(saved_pair, prompts_file, tmp_path / "b8") + [
        "--prices", str(prices_home / "llamacpp-test.json"), "--batch-size", "1", "--batch-size", "8"])
    assert refused.exit_code == 1 and "not 8" in refused.output


def test_hf_runs_are_priced_on_hfs_own_costs_fitted_on_other_prompts(tmp_path, prices_home):
    """`run --decoder hf`: each policy's measured speedup beside replay priced on HF assisted
    generation's own costs (fitted on fixed γ 5 and 7 over prompts the run does not decode) and
    on ours; the prediction is replay's rounds priced exactly on that file."""
    out = tmp_path / "r"
    result = runner.invoke(app, ["run", "--task", "code", "--limit", "2", "--max-new-tokens", "16", "--decoder", "hf",
                                 "--semantics", "hf", "--min-draft-len", "0", "--schedule", "fixed", "--gamma-max", "2",
                                 "--gamma-max", "4", "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "HF assisted generation" in result.output and "predicted, our prices" in result.output
    (folder,) = out.iterdir()
    priced = json.loads((folder / "priced.json").read_text())
    prices = cost_file.load(priced["prices"])
    assert Path(prices.source).parent == prices_home and prices.measured_by["name"] == "hf"
    assert prices.fitted_on["policies"] == ["fixed γ=5 · HF rule", "fixed γ=7 · HF rule"]
    ran = set(pd.read_parquet(folder / "samples.parquet")["prompt_id"])
    assert not ran & set(prices.fitted_on["prompts"])
    assert [row["policy"] for row in priced["rows"]] == ["fixed γ=2 · HF rule", "fixed γ=4 · HF rule"]
    for row in priced["rows"]:
        assert (row["predicted_engine"] > 0
                and row["error_engine"] == pytest.approx(row["predicted_engine"] / row["speedup"] - 1))
    cost = prices.surface.at(1)
    assert cost.t_plain > 0 and cost.t_round >= 0 and len(cost.t_verify) == 8  # k = 0 .. 7, the deeper fit γ


def test_an_hf_run_of_every_prompt_stands_and_says_it_is_not_priced(saved_pair, prompts_file, tmp_path):
    """No prompt is left to fit HF's costs on: the run is written as ever, and says so in one line."""
    target, draft = saved_pair
    result = runner.invoke(app, ["run", "--target", target, "--draft", draft, "--dataset", str(prompts_file),
                                 "--max-new-tokens", "8", "--decoder", "hf", "--semantics", "hf",
                                 "--min-draft-len", "0", "--device", "cpu", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "not priced on HF's own costs" in result.output and "run fewer (--limit)" in result.output
    (folder,) = tmp_path.iterdir()
    assert (folder / "samples.parquet").is_file() and not (folder / "priced.json").exists()


def test_llama_bench_passes_are_scaled_to_the_servers_plain_step_only_where_theirs_is_slower():
    """llama-bench ran a one-token target pass slower than llama-server's whole plain step: every
    pass is priced on the server's scale; a plain step slower than the pass scales nothing."""
    from dspark_bench.engines.llamacpp_prices import scaled, server_scale

    passes = CostModel(0.2e-3, [3.66e-3, 7.24e-3, 8.05e-3], 140)

    def runs(per_token):
        rows = pd.DataFrame({"baseline_s": [per_token * 100, per_token * 120], "baseline_new_tokens": [100, 120]})
        return [(None, rows)]

    scale = server_scale(passes, runs(3.18e-3))
    assert abs(scale - 3.18 / 3.46) < 1e-9
    model = scaled(passes, scale)
    assert abs(model.t_verify[0] - model.t_draft - 3.18e-3) < 1e-12  # a one-token target pass: the server's step
    assert model.t_verify[2] / model.t_verify[1] == passes.t_verify[2] / passes.t_verify[1]  # the curve's shape kept
    assert server_scale(passes, runs(4.0e-3)) == 1.0


def bad_prices(tmp_path: Path, case: str) -> str:
    """A --prices value of each kind a user can get wrong; files written into tmp_path."""
    path = tmp_path / f"{case}.json"
    data = engine_file().to_dict()
    if case == "missing":
        return str(tmp_path / "nowhere.json")
    if case == "not an engine":
        return "tensorrt"
    if case == "an engine we do not measure":
        return "vllm"
    if case == "cut":
        path.write_text(json.dumps(data)[:100])
    elif case == "not a cost model":
        path.write_text(json.dumps({"batch_sizes": {}}))
    elif case == "negative":
        data["batch_sizes"]["1"]["t_draft"] = -0.1
        path.write_text(json.dumps(data))
    elif case == "NaN":
        data["batch_sizes"]["1"]["t_verify"][2] = float("nan")
        path.write_text(json.dumps(data))
    elif case == "another format version":
        data["format_version"] = 9
        path.write_text(json.dumps(data))
    else:  # "other models": a good file, measured for other fingerprints
        path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("case, message", [
    ("missing", "choose ours, llamacpp, hf or a cost-model file's path"),
    ("not an engine", "--prices 'tensorrt': choose ours, llamacpp"),
    ("an engine we do not measure", "does not measure vLLM's costs itself"),
    ("cut", "is not JSON"),
    ("not a cost model", "is not a dspark-bench cost model"),
    ("negative", "t_draft is -0.1"),
    ("NaN", r"t_verify\[2\] is nan"),
    ("another format version", "has format_version 9"),
    ("other models", "was measured for another target"),
])
def test_a_bad_prices_argument_ends_the_sweep_before_any_work(saved_pair, prompts_file, tmp_path, case, message):
    """Refused in one line before a record or a cost model is timed, with nothing written."""
    import re
    import time

    from cli_helpers import one_error_line

    out = tmp_path / "out"
    started = time.perf_counter()
    result = runner.invoke(app, base_args(saved_pair, prompts_file, out) + ["--prices", bad_prices(tmp_path, case)])
    assert result.exit_code == 1 and re.search(message, one_error_line(result)), result.output
    assert time.perf_counter() - started < 5
    assert not out.exists() or not any(out.iterdir())


def test_resume_of_a_folder_that_is_no_real_sweep_says_so(tmp_path):
    from cli_helpers import one_error_line

    for kind, extra in (("run", {}), ("sweep", {"evaluation": "replay"})):
        folder = tmp_path / kind
        folder.mkdir()
        (folder / "run.json").write_text(json.dumps({"kind": kind, "run_id": kind, **extra}))
        result = runner.invoke(app, ["sweep", "--resume", str(folder)])
        assert result.exit_code == 1 and "not a resumable sweep" in one_error_line(result)


def test_a_precision_budget_of_nothing_is_refused(saved_pair, prompts_file, tmp_path):
    from cli_helpers import one_error_line

    result = runner.invoke(app, base_args(saved_pair, prompts_file, tmp_path) + ["--precision", "0.03",
                                                                                  "--precision-budget", "0"])
    said = one_error_line(result)
    assert result.exit_code == 1 and "precision_budget_s (--precision-budget) must be above 0 (got 0)" in said


def test_the_sweeps_table_fits_100_columns_with_its_labels_on_one_line(saved_pair, prompts_file, tmp_path):
    from rich.console import Console

    from dspark_bench.cli.console import narrow_table, read_summary

    result = runner.invoke(app, base_args(saved_pair, prompts_file, tmp_path) + [
        "--confirm-top", "3", "--drafter", "model", "--drafter", "lookup"])
    assert result.exit_code == 0, result.output
    folder = only_folder(tmp_path)
    table = pd.read_parquet(folder / "trials.parquet")
    table["config_label"] = table["config_label"] + " · B=8"  # a batched sweep's labels, as long as they get
    screen = Console(width=100, record=True, file=open(os.devnull, "w"))
    screen.print(narrow_table(table, "a title long enough to wrap " * 5, read_summary(folder)))
    lines = screen.export_text().splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 100
    for label in table["config_label"].head(10):
        assert any(label in line for line in lines), label  # whole, on one line
    assert sum("[" in line and "]" in line for line in lines) >= 3  # measured, with its interval, on the line
    said = " ".join(result.output.split())  # the title wraps at the table's width
    assert "predicted on our decoder's prices" in said and "measured [95 % CI]" in said

"""Calibration: per-domain policies differ where the draft's confidence means different things;
the file round-trips into the decoder's configs; bad files and existing outputs are refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from cli_helpers import folder_digest, one_error_line, runner  # noqa: E402

from dspark_bench.cli import app
from dspark_bench.config import METRICS, DecodeConfig
from dspark_bench.errors import DsparkError
from dspark_bench.replay.simulate import CostModel, Record, simulate_grid
from dspark_bench.tasks.prompts import Prompt
from dspark_bench.tuning import calibrate as lib

N, G = 60, 8
THRESHOLDS = [round(0.1 * i, 1) for i in range(1, 10)]
COST = CostModel(t_draft=0.1, t_verify=[1.0 + 0.05 * k for k in range(G + 1)], context_tokens=0)


def synthetic_record(cut: float, prompts: int = 6, seed: int = 0) -> Record:
    """A domain where the draft proposes the target's token exactly when its top1 confidence
    exceeds `cut` (and a wrong one otherwise); no EOS, every continuation full length."""
    rng = np.random.default_rng(seed)
    continuation = np.tile(np.arange(N) % 50 + 2, (prompts, 1))
    confidence = rng.uniform(0.0, 1.0, size=(prompts, N, G)).astype(np.float32)
    ahead = np.full((prompts, N, G), -1)
    for k in range(G):
        ahead[:, : N - k, k] = continuation[:, k:]
    rollout = np.where(confidence > cut, ahead, 0)  # token 0 never occurs in the continuation
    confidences = {m: confidence for m in METRICS}
    info = {"max_new_tokens": N, "gamma_record": G, "topk": 5}
    return Record(continuation, np.full(prompts, N), rollout, confidences, (), info)


def space(**overrides) -> list[DecodeConfig]:
    return [DecodeConfig.of(threshold=t, gamma_max=g, min_draft_len=0, max_new_tokens=N, **overrides)
            for t in THRESHOLDS for g in (4, G)]


def test_domains_whose_confidence_means_different_things_get_different_thresholds():
    records = {"easy": synthetic_record(0.3), "hard": synthetic_record(0.7, seed=1)}
    configs = space()
    choice = lib.choose_from_records(records, configs, COST, "speedup")
    # Right exactly above the cut: stopping there keeps every right token and drafts no wrong one.
    assert choice.best("easy").stopping.threshold == 0.3
    assert choice.best("hard").stopping.threshold == 0.7
    assert choice.best("easy").stopping.gamma_max == G  # long runs of right tokens: the larger cap wins
    # The global policy maximises the objective over both domains' prompts together; the domains'
    # totals summed equal one simulation of all prompts at once.
    together = Record(*(np.concatenate([records["easy"].__dict__[f], records["hard"].__dict__[f]])
                        for f in ("continuation", "lengths", "rollout")),
                      {m: np.concatenate([records["easy"].confidences[m], records["hard"].confidences[m]])
                       for m in METRICS}, (), records["easy"].info)
    union = simulate_grid(together, configs, COST)
    assert np.allclose(choice.global_table["predicted_speedup"], union["predicted_speedup"])
    assert np.array_equal(choice.global_table["rounds"], union["rounds"])
    assert np.allclose(choice.global_table["tokens_per_round"], union["tokens_per_round"])
    best_union = configs[int(union["predicted_speedup"].idxmax())]
    assert choice.best() == best_union
    assert choice.best() != choice.best("hard")  # one threshold for all is wrong for the hard domain
    # Each domain's own policy beats (or ties) the global one on that domain, by construction.
    global_id = choice.best_id()
    for domain in records:
        assert choice.value(choice.best_id(domain), domain) >= choice.value(global_id, domain)
    assert choice.value(choice.best_id("hard"), "hard") > choice.value(global_id, "hard") or \
        choice.value(choice.best_id("easy"), "easy") > choice.value(global_id, "easy")


def test_other_objectives_and_the_shift_summary():
    records = {"easy": synthetic_record(0.3), "hard": synthetic_record(0.7, seed=1)}
    choice = lib.choose_from_records(records, space(), COST, "acceptance_rate")
    assert choice.column == "acceptance_rate"
    # Acceptance only rises with the threshold: the top of the grid wins for both.
    assert choice.best("easy").stopping.threshold >= 0.3 and choice.best("hard").stopping.threshold >= 0.7
    forwards = lib.choose_from_records(records, space(), COST, "draft_forwards_per_token")
    easy = forwards.tables["easy"]  # minimised, not maximised
    assert forwards.value(forwards.best_id("easy"), "easy") == easy["draft_forwards_per_token"].min()
    quantiles = lib.confidence_quantiles(records["easy"])
    assert list(quantiles) == ["p10", "p25", "p50", "p75", "p90"]
    assert quantiles["p50"] == pytest.approx(0.5, abs=0.05)
    curves = lib.threshold_curves(lib.choose_from_records(records, space(), COST))
    assert set(curves["domain"]) == {"easy", "hard"}
    assert curves.groupby("domain")["best"].sum().tolist() == [1, 1]
    assert curves[curves["best"]].set_index("domain")["threshold"].to_dict() == {"easy": 0.3, "hard": 0.7}


# --- the calibration file ---------------------------------------------------------------------


def valid_data() -> dict:
    policy = DecodeConfig.of(threshold=0.4, gamma_max=4, max_new_tokens=12).to_dict()
    return {"schema_version": lib.SCHEMA_VERSION, "created": "2024-01-01T00:00:00", "objective": "speedup",
            "models": {"target": "t", "draft": "d", "target_fingerprint": "aaa", "draft_fingerprint": "bbb"},
            "global": {"policy": policy},
            "domains": {"code": {"policy": {"metric": "top1", "schedule": "threshold", "threshold": 0.2,
                                            "gamma_max": 6, "min_draft_len": 1, "topk": 5}, "gain": 1.1}}}


def write(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_policy_for_and_configs_for(tmp_path):
    calibration = lib.load_calibration(write(tmp_path / "c.yaml", valid_data()))
    assert (calibration.policy_for("code").stopping.threshold == 0.2
            and calibration.policy_for("code").stopping.gamma_max == 6)
    assert calibration.policy_for("poetry") == calibration.global_policy
    assert calibration.global_policy.stopping.threshold == 0.4
    # verification settings: the global policy's
    assert calibration.policy_for("code").verification.max_new_tokens == 12
    with pytest.raises(DsparkError, match="no domain 'poetry'"):
        calibration.policy_for("poetry", strict=True)
    base = DecodeConfig.of(max_new_tokens=99, temperature=0.7, seed=3)
    tuned = calibration.policy_for("code", base=base)
    assert (tuned.stopping.threshold, tuned.stopping.gamma_max, tuned.verification.max_new_tokens,
            tuned.verification.temperature) == (0.2, 6, 99, 0.7)
    prompts = [Prompt("1", "x", "code"), Prompt("2", "y", "prose"), Prompt("3", "z", "code")]
    configs = calibration.configs_for(prompts)
    assert [c.stopping.threshold for c in configs] == [0.2, 0.4, 0.2]
    assert [(c.stopping.threshold, [p.id for p in ps]) for c, ps in calibration.groups(prompts)] == [(0.2, ["1", "3"]),
                                                                                           (0.4, ["2"])]
    calibration.check_models({"target_fingerprint": "aaa", "draft_fingerprint": "bbb"})
    with pytest.raises(DsparkError, match="another draft model"):
        calibration.check_models({"target_fingerprint": "aaa", "draft_fingerprint": "zzz"})


def broken_files() -> dict:
    unknown = valid_data() | {"code": {"policy": {"threshold": 0.3}}}
    bad_threshold = valid_data()
    bad_threshold["domains"]["code"]["policy"]["threshold"] = 1.5
    bad_lengths = valid_data()
    bad_lengths["global"]["policy"].update(min_draft_len=5, gamma_max=3)
    unknown_field = valid_data()
    unknown_field["domains"]["code"]["policy"]["thresh"] = 0.3
    return {
        "unknown top-level key": (unknown, "unknown top-level key\\(s\\) code"),
        "threshold 1.5": (bad_threshold,
                          "domain 'code': invalid policy: threshold must be in \\[0, 1\\] \\(got 1.5\\)"),
        "min_draft_len > gamma_max": (bad_lengths, "global: invalid policy: min_draft_len \\(5\\) must not exceed"),
        "unknown policy field": (unknown_field, "unknown decode setting\\(s\\) thresh"),
        "wrong schema": (valid_data() | {"schema_version": 99}, "schema_version 99 is not supported"),
        "corrupt": ("schema_version: 1\nglobal: {policy: [\n", "not valid YAML"),
        "not a mapping": ("- 1\n- 2\n", "must be a mapping"),
    }


@pytest.mark.parametrize("case", list(broken_files()))
def test_bad_calibration_files_are_one_clear_error(tmp_path, case):
    data, message = broken_files()[case]
    path = write(tmp_path / "c.yaml", data)
    with pytest.raises(DsparkError, match=message) as err:
        lib.load_calibration(path)
    assert "\n" not in str(err.value)


def test_missing_calibration_file(tmp_path):
    with pytest.raises(DsparkError, match="does not exist"):
        lib.load_calibration(tmp_path / "nope.yaml")


# --- end to end through the CLI, with tiny models -----------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    rows = [{"prompt": "def add(a, b):", "kind": "code"}, {"prompt": "The quick brown fox", "kind": "prose"},
            {"prompt": "for i in range(", "kind": "code"}, {"prompt": "The lazy dog jumps", "kind": "prose"},
            {"prompt": "print(i)", "kind": "code"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("spec") / "spec.yaml", {
        "task": "code", "limit": 2, "max_new_tokens": 12, "repeats": 1,
        "space": {"metric": ["top1", "margin"], "threshold": [0.1, 0.3, 0.5, 0.7, 0.9], "gamma_max": [2, 4],
                  "min_draft_len": [0, 1]}})


@pytest.fixture(scope="module")
def calibrated(saved_pair, dataset, spec_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("calibration") / "calibration.yaml"
    target, draft = saved_pair
    result = runner.invoke(app, ["calibrate", "--dataset", str(dataset), "--category-field", "kind",
                                 "--spec", str(spec_file), "--target", target, "--draft", draft, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result


def test_calibrate_cli_writes_a_file_the_decoder_loads(calibrated):
    out, result = calibrated
    assert str(out) in result.stdout.replace("\n", "") and "gain" in result.stdout
    data = yaml.safe_load(out.read_text())
    assert list(data["domains"]) == ["code", "prose"]
    assert data["models"]["target_fingerprint"] and data["objective"] == "speedup" and data["evaluation"] == "replay"
    calibration = lib.load_calibration(out)
    for domain, entry in data["domains"].items():
        policy = calibration.policy_for(domain)
        assert policy.stopping.threshold == entry["policy"]["threshold"] and policy.verification.max_new_tokens == 12
        assert entry["prompts"] == 2  # --limit 2 per category, from the spec
        assert 1.0 <= entry["tokens_per_round"] <= 5 and 0 <= entry["acceptance_rate"] <= 1
        assert entry["speedup_low"] <= entry["speedup"] <= entry["speedup_high"]
        assert entry["gain"] == pytest.approx(entry["speedup"] / entry["global_speedup"], abs=1e-3)
        assert entry["identical_to_baseline"] == 1.0
        quantiles = entry["shift"]["confidence_top1"]
        assert 0 <= quantiles["p10"] <= quantiles["p50"] <= quantiles["p90"] <= 1
        assert entry["shift"]["global_threshold"] == data["global"]["policy"]["threshold"]
        assert entry["predicted_speedup"] >= entry["global_predicted_speedup"]  # its own best, by replay
    assert calibration.policy_for("unknown") == calibration.global_policy
    assert (out.parent / data["figure"]).is_file() and data["figure"] == "calibration.png"


def test_a_replay_calibration_writes_each_domain_s_acceptance_profile(calibrated):
    """Beside the file, each domain's chosen policy replayed on its own record, and the global policy on
    every domain's: greedy replay is exact, so a domain's mean acceptance length is the tokens per round
    its timed confirmation measured."""
    out, result = calibrated
    data = yaml.safe_load(out.read_text())
    folder = out.parent / data["profiles"]
    assert data["profiles"] == "calibration-profiles" and f"acceptance profiles: {folder}" in result.stdout
    mapping = json.loads((folder / "domains.json").read_text())
    assert mapping == {"code": "domains/code", "prose": "domains/prose"}
    for domain, entry in data["domains"].items():
        profile = json.loads((folder / mapping[domain] / "speculation_profile.json").read_text())
        assert profile["measurement_conditions"]["policy"] == entry["label"]
        assert profile["measurement_conditions"]["domain"] == domain
        assert profile["mean_accept_length"] == pytest.approx(entry["tokens_per_round"], abs=1e-3)
        rates = json.loads((folder / mapping[domain] / "vllm_speculative_config.json").read_text())
        assert rates["synthetic_acceptance_rates"] == profile["marginal_accept_rates"]
        assert all((folder / mapping[domain] / name).is_file() for name in ("sglang.env", "dynamo_args.txt"))
    whole = json.loads((folder / "global" / "speculation_profile.json").read_text())
    assert whole["measurement_conditions"]["policy"] == data["global"]["label"]
    assert sorted(whole["per_category"]) == ["code", "prose"]
    assert sum(c["rounds"] for c in whole["per_category"].values()) == whole["measurement_conditions"]["rounds"]
    assert whole["mean_accept_length"] == pytest.approx(data["global"]["measured"]["tokens_per_round"], abs=1e-3)


def test_domain_folders_are_distinct_where_their_names_would_meet():
    from dspark_bench.engines.profiles import folder_names

    assert folder_names(["code", "a/b", "a b", "A-B", "..", "prose"]) == {
        "code": "code", "a/b": "a-b", "a b": "a-b-2", "A-B": "A-B-3", "..": "domain", "prose": "prose"}


@pytest.mark.parametrize("evaluation", ["replay", "real"])
def test_calibrate_cli_with_sampling_replays_sampled_records_or_times_every_policy(evaluation, saved_pair, dataset,
                                                                                     tmp_path):
    target, draft = saved_pair
    out = tmp_path / "sampled.yaml"
    result = runner.invoke(app, ["calibrate", "--dataset", str(dataset), "--category-field", "kind", "--limit", "1",
                                 "--temperature", "0.7", "--threshold", "0.2", "--threshold", "0.6", "--gamma-max", "3",
                                 "--max-new-tokens", "10", "--repeats", "1", "--target", target, "--draft", draft,
                                 "--out", str(out), "--evaluation", evaluation])
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(out.read_text())
    assert data["evaluation"] == evaluation and (data["cost_model"] is None) == (evaluation == "real")
    assert data["sampling"] == {"temperature": 0.7, "top_p": 1.0}
    assert lib.load_calibration(out).policy_for("code").verification.temperature == 0.7
    for entry in data["domains"].values():
        assert entry["speedup_low"] <= entry["speedup"] <= entry["speedup_high"]
        assert entry["search_speedup" if evaluation == "real" else "predicted_speedup"] > 0
        assert entry["policy"]["threshold"] in (0.2, 0.6)
    profiles = tmp_path / "sampled-profiles"  # a sampled record's paths profile at its temperature; a real run has none
    assert data["profiles"] == (profiles.name if evaluation == "replay" else None)
    assert profiles.is_dir() == (evaluation == "replay")
    if evaluation == "replay":
        written = json.loads((profiles / "domains" / "code" / "speculation_profile.json").read_text())
        assert written["measurement_conditions"]["temperature"] == 0.7


def test_calibrate_cli_refuses_to_overwrite(calibrated, saved_pair, dataset, spec_file):
    out, _ = calibrated
    before = folder_digest(out.parent)
    target, draft = saved_pair
    args = ["calibrate", "--dataset", str(dataset), "--category-field", "kind", "--spec", str(spec_file),
            "--target", target, "--draft", draft, "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert "already exists" in one_error_line(result) and "--force" in result.stderr
    assert folder_digest(out.parent) == before


def test_calibrate_cli_bad_input_is_one_line(tmp_path, spec_file):
    result = runner.invoke(app, ["calibrate", "--tasks", "code,nosuchtask", "--spec", str(spec_file),
                                 "--out", str(tmp_path / "c.yaml")])
    assert result.exit_code == 1 and "unknown task 'nosuchtask'" in one_error_line(result)
    result = runner.invoke(app, ["calibrate", "--tasks", "code", "--dataset", "x.jsonl",
                                 "--out", str(tmp_path / "c.yaml")])
    assert result.exit_code == 1 and "not both" in one_error_line(result)
    assert list(tmp_path.iterdir()) == []


def test_help_has_an_example():
    result = runner.invoke(app, ["calibrate", "--help"])
    assert result.exit_code == 0 and "Example:" in result.stdout


def test_outputs_are_never_overwritten_without_force(tmp_path):
    from dspark_bench.engines.profiles import write_calibration_profiles

    out = tmp_path / "calibration.yaml"
    (tmp_path / "calibration.png").write_bytes(b"an earlier figure")
    with pytest.raises(DsparkError, match="calibration.png' already exists; pass --force"):
        lib.check_output(out, force=False)
    (tmp_path / "calibration-profiles").mkdir()
    (tmp_path / "calibration.png").unlink()
    with pytest.raises(DsparkError, match="calibration-profiles' already exists; pass --force"):
        lib.check_output(out, force=False)
    # A calibration with no record to profile (a real one) takes a stale profiles folder away under --force.
    assert write_calibration_profiles(out, None, None, {}, force=True) == (None, None)
    assert not (tmp_path / "calibration-profiles").exists()
    (tmp_path / "calibration.png").write_bytes(b"an earlier figure")
    assert lib.check_output(out, force=True) == (out, tmp_path / "calibration.png")
    bad = valid_data()
    bad["global"]["policy"]["threshold"] = 1.5
    # The loader would refuse it: never written.
    with pytest.raises(DsparkError, match=r"threshold must be in \[0, 1\] \(got 1.5\)"):
        lib.write_calibration(bad, None, out, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calibration.png"]
    lib.write_calibration(valid_data(), None, out, force=True)
    assert lib.load_calibration(out).policy_for("code").stopping.threshold == 0.2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calibration.png", "calibration.yaml"]


def run_routed(data: dict, part: dict, saved_pair, dataset, tmp_path, *flags: str):
    """`run --calibration` on `data` with `part`'s two domain policies made to differ (code 0.15,
    prose 0.85): the calibration file written, and the run's samples."""
    part["domains"]["code"]["policy"]["threshold"] = 0.15
    part["domains"]["prose"]["policy"]["threshold"] = 0.85
    routed = tmp_path / "routed.yaml"
    routed.write_text(yaml.safe_dump(data))
    target, draft = saved_pair
    result = runner.invoke(app, ["run", "--target", target, "--draft", draft, "--dataset", str(dataset),
                                 "--category-field", "kind", "--calibration", str(routed), "--max-new-tokens", "8",
                                 *flags, "--out", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "runs").iterdir()
    return routed, pd.read_parquet(folder / "samples.parquet")


def test_run_with_calibration_routes_each_prompt_to_its_domain_policy(calibrated, saved_pair, dataset, tmp_path):
    out, _ = calibrated
    data = yaml.safe_load(out.read_text())
    routed, samples = run_routed(data, data, saved_pair, dataset, tmp_path, "--repeats", "1")
    target, draft = saved_pair
    assert len(samples) == 5  # each prompt once, with its own domain's policy
    assert dict(zip(samples["category"], samples["threshold"])) == {"code": 0.15, "prose": 0.85}
    clash = runner.invoke(app, ["run", "--target", target, "--draft", draft, "--dataset", str(dataset),
                                "--calibration", str(routed), "--threshold", "0.5", "--out", str(tmp_path / "x")])
    assert clash.exit_code == 1 and "--calibration chooses the policy" in clash.stderr


# --- per batch size -------------------------------------------------------------------------------


def test_what_a_step_costs_at_batch_size_b_changes_the_chosen_policy():
    from dspark_bench.replay.cost import CostSurface

    # At B = 8 a verified token costs ten times what it costs alone: long, unconfident drafts
    # lose there, so the chosen policy drafts less (a higher threshold or a smaller gamma_max).
    surface = CostSurface({1: COST, 8: CostModel(0.15, [1.5 + 0.5 * k for k in range(G + 1)], 0, 8)})
    records = {"code": synthetic_record(0.3), "prose": synthetic_record(0.6, seed=1)}
    alone = lib.choose_from_records(records, space(), surface.at(1))
    batched = lib.choose_from_records(records, space(batch_size=8), surface)
    for domain in (None, "code", "prose"):
        one, eight = alone.best(domain), batched.best(domain)
        assert eight.batching.batch_size == 8 and one.batching.batch_size == 1
        assert ((eight.stopping.threshold, -eight.stopping.gamma_max)
                > (one.stopping.threshold, -one.stopping.gamma_max)), domain
    row = batched.global_table.set_index("config_id").loc[batched.best_id()]
    assert row["predicted_speedup"] == pytest.approx(row["predicted_baseline_time"] / row["predicted_time"])


@pytest.fixture(scope="module")
def calibrated_by_batch(saved_pair, dataset, spec_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("calibration") / "batched.yaml"
    target, draft = saved_pair
    result = runner.invoke(app, ["calibrate", "--dataset", str(dataset), "--category-field", "kind",
                                 "--spec", str(spec_file), "--batch-size", "1", "--batch-size", "3",
                                 "--target", target, "--draft", draft, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result


def test_calibrate_writes_a_policy_per_domain_and_batch_size(calibrated_by_batch):
    out, result = calibrated_by_batch
    data = yaml.safe_load(out.read_text())
    assert "batch size 3" in result.stdout
    assert data["global"]["policy"]["batch_size"] == 1 and list(data["by_batch_size"]) == [3]
    part = data["by_batch_size"][3]
    assert part["global"]["policy"]["batch_size"] == 3 and part["cost_model"]["batch_size"] == 3
    for entry in part["domains"].values():
        assert (entry["speedup_low"] <= entry["speedup"] <= entry["speedup_high"]
                and entry["identical_to_baseline"] == 1.0)
    calibration = lib.load_calibration(out)
    assert calibration.for_batch_size(3).global_policy.batching.batch_size == 3
    assert calibration.for_batch_size(2).global_policy.batching.batch_size == 1  # nearest, the smaller on a tie
    assert calibration.for_batch_size(64).global_policy.batching.batch_size == 3


def test_run_with_calibration_picks_the_run_s_batch_size(calibrated_by_batch, saved_pair, dataset, tmp_path):
    out, _ = calibrated_by_batch
    data = yaml.safe_load(out.read_text())
    _, samples = run_routed(data, data["by_batch_size"][3], saved_pair, dataset, tmp_path, "--batch-size", "3")
    assert len(samples) == 5 and set(samples["batch_size"]) == {3} and set(samples["layout"]) == {"padded"}
    assert dict(zip(samples["category"], samples["threshold"])) == {"code": 0.15, "prose": 0.85}
    assert samples["identical_to_baseline"].all()

"""One workload, one search space: a run and a sweep share their fields, every command expands
policies through config.expand, and the old spellings of renamed words still work, said so."""

from __future__ import annotations

import dataclasses

import pytest
from cli_helpers import invoke

from dspark_bench.config import DEFAULTS, DecodeConfig, expand
from dspark_bench.errors import DsparkError
from dspark_bench.harness.run import RunConfig, from_config_dict
from dspark_bench.harness.workload import WORKLOAD_FIELDS, Workload
from dspark_bench.tuning.spec import SweepSpec, old_keys, parse_spec, points
from dspark_bench.tuning.spec_files import load_spec


def test_a_run_and_a_sweep_share_the_workload_field_for_field():
    run_fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    spec_fields = {f.name: f for f in dataclasses.fields(SweepSpec)}
    for name in WORKLOAD_FIELDS:
        assert run_fields[name].type == spec_fields[name].type, name
    assert issubclass(RunConfig, Workload) and issubclass(SweepSpec, Workload)
    # The one default that differs, on purpose: a sweep decodes its prompts once per trial.
    differing = [n for n in WORKLOAD_FIELDS if run_fields[n].default != spec_fields[n].default]
    assert differing == ["limit"]


def test_run_defaults_are_the_policy_defaults():
    config = RunConfig(task="code")
    (policy,) = config.decode_configs()
    assert policy.replace(max_new_tokens=DEFAULTS.verification.max_new_tokens) == DEFAULTS


def test_expand_crosses_the_space_in_its_own_order_without_duplicates():
    space = {"gamma_max": [2, 4], "threshold": [0.3, 0.5, 0.3]}
    got = [(c.stopping.gamma_max, c.stopping.threshold) for c in expand(space)]
    assert got == [(2, 0.3), (2, 0.5), (4, 0.3), (4, 0.5)]


def test_expand_resets_knobs_a_policy_does_not_read():
    space = {"drafter": ["model", "lookup"], "ngram_max": [2, 4]}
    got = [(c.drafting.drafter, c.drafting.ngram_max) for c in expand(space, DEFAULTS.replace(ngram_min=2))]
    assert got == [("model", DEFAULTS.drafting.ngram_max), ("lookup", 2), ("lookup", 4)]
    goodput = DEFAULTS.replace(goodput_model="fit.json")
    got = expand({"schedule": ["goodput", "threshold"], "threshold": [0.2, 0.7], "semantics": ["hf"]}, goodput)
    assert [(c.stopping.schedule, c.stopping.threshold, c.stopping.semantics, c.stopping.goodput_model)
            for c in got] == [
        ("goodput", 0.2, "dspark", "fit.json"), ("threshold", 0.2, "hf", ""), ("threshold", 0.7, "hf", "")]


def test_expand_strict_refuses_what_a_search_space_leaves_out():
    space = {"min_draft_len": [0, 3], "gamma_max": [2, 4]}
    assert [(c.stopping.min_draft_len, c.stopping.gamma_max) for c in expand(space, strict=False)] == [
        (0, 2), (0, 4), (3, 4)]
    with pytest.raises(DsparkError, match="must not exceed"):
        expand(space)
    with pytest.raises(DsparkError, match=r"search space: threshold must be in \[0, 1\] \(got 1.5\)"):
        expand({"threshold": [1.5]}, strict=False)


def test_a_sweep_spec_and_a_run_expand_alike():
    spec = load_spec(None, {"task": "code", "space": {"metric": ["top1", "margin"], "gamma_max": [3, 5]}})
    run = RunConfig(task="code", grid={"metric": ("top1", "margin"), "gamma_max": (3, 5)})
    base = DecodeConfig.of(max_new_tokens=64)
    assert points(spec, base) == [c for c in run.decode_configs(64)]


def test_a_run_json_from_before_the_grid_reads_into_the_same_policies():
    """run.json kept each knob as a field of its own (lists, batch_sizes, single values) before the
    grid held them: it reads back into the grid, and decodes the same policies in the same order."""
    old = {"task": "code", "metric": ["top1", "margin"], "schedule": ["threshold"], "threshold": [0.3, 0.6],
           "gamma_max": [4], "min_draft_len": [1], "semantics": ["dspark"], "draft_mode": ["early-stop"],
           "drafter": ["model", "lookup"], "batch_sizes": [1], "goodput_model": "", "budget_layout": "padded",
           "signal_model": "", "threshold_start": 0.3, "threshold_end": 0.8, "ngram_min": 2, "ngram_max": 3,
           "compiled": False}
    config = from_config_dict(old)
    assert config.grid["batch_size"] == (1,) and config.grid["ngram_min"] == (2,) and config.batch_sizes == (1,)
    labels = [c.label() for c in config.decode_configs(32)]
    assert labels == ["top1 threshold 0.3 γ≤4 min1", "lookup n2-3 · top1 threshold 0.3 γ≤4 min1",
                      "top1 threshold 0.6 γ≤4 min1", "lookup n2-3 · top1 threshold 0.6 γ≤4 min1",
                      "margin threshold 0.3 γ≤4 min1", "lookup n2-3 · margin threshold 0.3 γ≤4 min1",
                      "margin threshold 0.6 γ≤4 min1", "lookup n2-3 · margin threshold 0.6 γ≤4 min1"]
    assert from_config_dict(config.to_dict()) == config  # today's run.json reads back equal
    with pytest.raises(DsparkError, match="unknown decode setting.s. thresh"):
        RunConfig(task="code", grid={"thresh": (0.3,)})


def test_old_names_are_refused_where_typed_and_migrated_where_stored(tmp_path):
    """Pre-1.0, no aliases: an old flag or spec key is an error; an old run folder still reads."""
    # A run.json written before the rename: read silently.
    assert from_config_dict({"task": "code", "engine": "hf", "semantics": ["hf"], "min_draft_len": [0]}).decoder == "hf"
    # A spec file with the old key, or an old flag: one line, exit 1.
    old = tmp_path / "old.yaml"
    old.write_text("task: code\nengine: real\n")
    with pytest.raises(DsparkError, match="unknown key.s. engine"):
        load_spec(old, {})
    for command, flag in (("run", "--engine"), ("sweep", "--engine"), ("calibrate", "--engine"), ("run", "--prompts"),
                          ("continuations write", "--engine")):  # our own decoder is no engine: --decoder ours
        result = invoke(*command.split(), flag, "x", "--out", tmp_path / "out")
        assert result.exit_code == 2 and "No such option" in result.output + result.stderr
    # A sweep folder's stored spec from before the two seeds had two names: `seed` alone seeded the sampler.
    stored = {**SweepSpec(task="code").to_dict(), "seed": 3}
    del stored["sampler_seed"]
    assert parse_spec(old_keys(stored)).sampler_seed == 3
    new = load_spec(None, {"task": "code", "seed": 5})  # today's meaning: the decodes' seed
    assert (new.sampler_seed, new.seed) == (0, 5)


def test_a_sweep_refuses_workload_settings_it_cannot_honour():
    with pytest.raises(DsparkError, match="a sweep decodes first turns"):
        load_spec(None, {"task": "code", "turns": "all"})
    with pytest.raises(DsparkError, match="unknown --batching 'sometimes'; choose one of refill, drain"):
        load_spec(None, {"task": "code", "batching": "sometimes"})
    with pytest.raises(DsparkError, match="sweep: threads must be at least 1 .got 0."):  # the declared bound, once
        load_spec(None, {"task": "code", "threads": 0})
    with pytest.raises(DsparkError, match="sweep: limit must be at least 1 .got 0."):  # a sweep's limit: the workload's
        load_spec(None, {"task": "code", "limit": 0})
    with pytest.raises(DsparkError, match="threads must be at least 1"):
        RunConfig(task="code", threads=0)


def test_the_config_is_one_frozen_config_per_concern_stored_flat():
    from dspark_bench.config import FIELDS, PARTS, Batching, Drafting, StoppingPolicy, Verification, from_dict

    assert len(dataclasses.fields(DecodeConfig)) <= 10
    assert PARTS == {"stopping": StoppingPolicy, "drafting": Drafting, "verification": Verification,
                     "batching": Batching}
    config = DecodeConfig.of(threshold=0.3, drafter="lookup", ngram_max=4, temperature=0.5, batch_size=1)
    assert (config.stopping.threshold, config.drafting, config.verification.temperature) == (
        0.3, Drafting("lookup", 1, 4), 0.5)
    # Stored flat, every knob once, in the shape run.json and result tables always had; read back equal.
    flat = config.to_dict()
    assert list(flat) == list(FIELDS) and len(flat) == 35 and from_dict(flat) == config
    assert (config.replace(gamma_max=3).stopping.gamma_max == 3
            and config.replace(gamma_max=3).drafting == config.drafting)
    # The drafter's identity is its part: one replay record per Drafting, whatever the policy.
    assert config.replace(threshold=0.9, gamma_max=2).drafting == config.drafting
    # Each part refuses its own bad knobs; DecodeConfig what crosses them; unknown knobs are errors.
    for knobs, message in ((dict(gamma_max=0), "gamma_max must be at least 1"), (dict(top_p=0.0), "top_p"),
                           (dict(ngram_min=3, ngram_max=2), "ngram_min <= ngram_max"),
                           (dict(batch_size=0), "batch_size must be at least 1"),
                           (dict(drafter="lookup", batch_size=2), "batch size 1 only"),
                           (dict(compiled="yes"), "compiled must be true or false"),
                           (dict(gamm_max=3), "unknown decode setting")):
        with pytest.raises(DsparkError, match=message):
            DecodeConfig.of(**knobs)


def test_a_calibration_file_is_checked_before_anything_is_read(tmp_path):
    """A missing or broken --calibration ends when the run is configured, before its prompts
    are read or its models load."""
    with pytest.raises(DsparkError, match="calibration file '/nonexistent/c.yaml' does not exist"):
        RunConfig(task="code", calibration="/nonexistent/c.yaml")
    broken = tmp_path / "c.yaml"
    broken.write_text("domains: [unclosed\n")
    with pytest.raises(DsparkError, match="c.yaml"):
        RunConfig(task="code", calibration=str(broken))


# A flag out of its declared bounds -> the one line that refuses it.
OUT_OF_BOUNDS = {
    "--temperature -1": "temperature must be at least 0 (got -1)",
    "--top-p 0": "top_p must be in (0, 1] (got 0)",
    "--top-p 1.5": "top_p must be in (0, 1] (got 1.5)",
    "--precision 1": "precision must be in [0, 1) (got 1)",
    "--precision-budget 0": "precision_budget_s (--precision-budget) must be above 0 (got 0)",
}


@pytest.mark.parametrize("command", ["run", "sweep"])
@pytest.mark.parametrize("given", OUT_OF_BOUNDS)
def test_a_knobs_bounds_are_checked_before_any_model_loads(command, given, monkeypatch, tmp_path):
    """A bound is its knob's declaration (knobs.knob), checked with the workload before any work:
    one line and exit 1, no model loaded, nothing written."""
    import transformers

    flags, message = given.split(), OUT_OF_BOUNDS[given]

    def load(*args, **kwargs):
        raise AssertionError(f"{command} {given} loaded a model before refusing the flag")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", load)
    result = invoke(command, "--task", "code", *flags, "--out", tmp_path / "out")
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (tmp_path / "out").exists()


def test_a_bound_of_every_kind_is_said_as_declared():
    from dspark_bench.config import Verification

    with pytest.raises(DsparkError, match=r"temperature must be at least 0 \(got -0.5\)"):
        Verification(temperature=-0.5)
    for top_p in (0.0, -1.0, 1.01):
        with pytest.raises(DsparkError, match=r"top_p must be in \(0, 1\]"):
            Verification(top_p=top_p)
    assert Verification(temperature=0.0, top_p=1.0).greedy  # the bounds themselves are allowed where closed


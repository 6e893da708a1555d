"""A knob that would do nothing says so: every declared knob that depends on another (its
declaration's `needs`, knobs.Needs) is refused in one line, before any work, where nothing it
needs is given, and accepted where it is."""

from __future__ import annotations

import dataclasses

import pytest
from cli_helpers import invoke, one_error_line

from dspark_bench.config import KNOBS, DecodeConfig
from dspark_bench.harness.run import RunConfig
from dspark_bench.harness.workload import Workload
from dspark_bench.knobs import flag_of
from dspark_bench.tuning.spec import SweepSpec
from dspark_bench.tuning.spec_files import resolve_spec

LOAD = ["--arrival-rate", "1", "--batch-size", "1", "--batch-size", "4"]
# The knobs whose need the defaults meet: the default schedule reads a threshold; a sweep replays.
DEFAULTS_GIVE = {"threshold", "confirm_top", "analyze", "prices", "isolated_prices"}
SWEEP_FOLDER = "sweep-folder"  # a goodput model's or learned signal's folder: only named, never read here
# knob -> (command, flags that set it where it does nothing; a workload's and a policy's settings that
# give it what it needs)
CASES = {
    "threshold": ("run", ["--schedule", "fixed", "--threshold", "0.3"], {}, {"schedule": "cumulative"}),
    "threshold_start": ("run", ["--threshold-start", "0.2"], {}, {"schedule": "ramp"}),
    "threshold_end": ("run", ["--schedule", "cumulative", "--threshold-end", "0.9"], {}, {"schedule": "ramp"}),
    "depth_policy": ("run", ["--depth-policy", "0.3/4,0.2/6"], {}, {"schedule": "depth", "depth_policy": "0.3/4"}),
    "topk": ("run", ["--topk", "3"], {}, {"metric": "topk_mass"}),
    "candidate_steps": ("run", ["--candidate-steps", "1,2"], {}, {"schedule": "sglang-adaptive"}),
    "ema_alpha": ("run", ["--ema-alpha", "0.5"], {}, {"schedule": "sglang-adaptive"}),
    "update_interval": ("run", ["--update-interval", "2"], {}, {"schedule": "sglang-adaptive"}),
    "warmup_batches": ("run", ["--schedule", "fixed", "--warmup-batches", "0"], {}, {"schedule": "sglang-adaptive"}),
    "up_hysteresis": ("run", ["--up-hysteresis", "0.2"], {}, {"schedule": "sglang-adaptive"}),
    "down_hysteresis": ("run", ["--down-hysteresis", "0"], {}, {"schedule": "sglang-adaptive"}),
    "ceiling_coeff": ("run", ["--ceiling-coeff", "1.5"], {}, {"schedule": "sglang-adaptive"}),
    "draft_len_schedule": ("run", ["--draft-len-schedule", "1:4,8:2"], {}, {"schedule": "trtllm-schedule"}),
    "acceptance_rate_window_size": ("run", ["--schedule", "sglang-adaptive", "--acceptance-rate-window-size", "16"], {},
                                    {"schedule": "trtllm-schedule"}),
    "acceptance_rate_threshold": ("run", ["--schedule", "trtllm-schedule", "--acceptance-rate-threshold", "0.4"], {},
                                  {"schedule": "trtllm-schedule", "acceptance_rate_window_size": 16}),
    "num_speculative_tokens_per_batch_size": ("run", ["--num-speculative-tokens-per-batch-size", "1-8:3"], {},
                                              {"schedule": "vllm-adaptive", "goodput_model": SWEEP_FOLDER}),
    "batch_quorum": ("run", ["--batch-quorum", "0.5"], {}, {"batch_size": 4}),
    "goodput_model": ("run", ["--goodput-model", SWEEP_FOLDER], {},
                      {"schedule": "goodput", "goodput_model": SWEEP_FOLDER}),
    "budget_layout": ("run", ["--budget-layout", "packed"], {},
                      {"schedule": "budget", "batch_size": 4, "goodput_model": SWEEP_FOLDER}),
    "signal_model": ("run", ["--signal-model", SWEEP_FOLDER], {}, {"metric": "learned", "signal_model": SWEEP_FOLDER}),
    "ngram_min": ("run", ["--ngram-min", "2"], {}, {"drafter": "lookup"}),
    "ngram_max": ("run", ["--ngram-max", "4"], {}, {"drafter": "lookup"}),
    "top_p": ("run", ["--top-p", "0.9"], {}, {"temperature": 0.7}),
    "split": ("run", ["--split", "test"], {"dataset": "prompts.jsonl"}, {}),
    "prompt_field": ("run", ["--prompt-field", "question"], {"dataset": "prompts.jsonl"}, {}),
    "category_field": ("run", ["--category-field", "kind"], {"dataset": "prompts.jsonl"}, {}),
    "batching": ("run", ["--batching", "drain"], {}, {"batch_size": 4}),
    "precision_budget_s": ("run", ["--precision-budget", "100"], {"precision": 0.05}, {}),
    "method": ("sweep", ["--method", "optuna"], {"evaluation": "real"}, {}),
    "trials": ("sweep", ["--trials", "5"], {"method": "optuna", "evaluation": "real"}, {}),
    "confirm_top": ("sweep", ["--evaluation", "real", "--confirm-top", "2"], {"evaluation": "replay"}, {}),
    "paths": ("sweep", ["--paths", "16"], {"temperature": 0.7}, {"temperature": 0.7}),
    "analyze": ("sweep", ["--evaluation", "real", "--analyze"], {"evaluation": "auto"}, {}),
    "prices": ("sweep", ["--evaluation", "real", "--prices", "llamacpp"], {"evaluation": "replay"}, {}),
    "isolated_prices": ("sweep", ["--evaluation", "real", "--isolated-prices"], {"evaluation": "replay"}, {}),
    "requests": ("sweep", ["--requests", "50"], {"arrival_rates": (1.0,)}, {}),
    "max_batch": ("sweep", ["--batch-size", "1", "--batch-size", "4", "--max-batch", "2"],
                  {"arrival_trace": "trace.txt"}, {}),
    "load_objective": ("sweep", ["--load-objective", "throughput"], {"arrival_rates": (1.0,)}, {}),
    "tpot_limit": ("sweep", ["--tpot-limit", "0.05"], {"arrival_rates": (0.5, 2.0)}, {}),
}


def declaration(name: str):
    """The field that declares a knob: a policy's, the workload's or a sweep's own."""
    return next(f for f in [*KNOBS.values(), *dataclasses.fields(SweepSpec)] if f.name == name)


def test_every_knob_that_needs_another_is_covered():
    """A knob declared with `needs` and left out of CASES fails here: each one is tried below."""
    declared = [*KNOBS.values(), *dataclasses.fields(Workload), *dataclasses.fields(SweepSpec)]
    assert set(CASES) == {f.name for f in declared if f.metadata.get("needs") is not None}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_knob_that_would_do_nothing_is_refused_before_any_work(name, tmp_path, monkeypatch):
    command, flags, _, _ = CASES[name]
    monkeypatch.chdir(tmp_path)
    result = invoke(command, "--task", "code", *flags, "--out", tmp_path / "out")
    assert result.exit_code == 1, result.output
    assert f"{flag_of(declaration(name))} has no effect here: it needs " in one_error_line(result)
    assert not (tmp_path / "out").exists()  # refused before any work: nothing written


@pytest.mark.parametrize("name", sorted(CASES))
def test_given_what_it_needs_the_knob_counts(name):
    """Its declaration's `needs` holds for a workload and policy that give it what it needs, and not
    for the defaults where it needs more than they give."""
    _, _, workload, policy = CASES[name]
    needs = declaration(name).metadata["needs"]
    given = SweepSpec(**{"task": None if "dataset" in workload else "code", **workload})
    assert needs.holds(given, DecodeConfig.of(**policy))
    assert needs.holds(SweepSpec(task="code"), DecodeConfig()) == (name in DEFAULTS_GIVE)


def test_run_decodes_the_depth_policy_its_flags_name():
    """`run --schedule depth --depth-policy …` (docs/depth.md): the depth policy reaches the policy the
    run decodes (set in the grid's base, the default schedule dropped it before the schedule was set)."""
    config = RunConfig(task="code", grid={"schedule": ("depth",), "depth_policy": ("0.3/4,0.2/6",)})
    assert [c.label() for c in config.decode_configs()] == ["top1 depth 0.3/4·0.2/6 min1"]


def test_decode_refuses_a_knob_its_one_policy_would_not_read(tmp_path):
    """`decode` runs one policy: a knob it would not read is refused as `run` refuses it."""
    result = invoke("decode", "def f():", "--ngram-max", "4")
    assert result.exit_code == 1
    assert "--ngram-max has no effect here: it needs the lookup drafter" in one_error_line(result)


@pytest.mark.parametrize("spec,overrides", [
    (None, {"task": "edit", "evaluation": "real"}),  # edit.yaml's confirm_top: the file's, not typed
    (None, {"task": "edit", "space.drafter": ["model"]}),  # edit.yaml's n-gram space: the file's
    ("sweeps/code.yaml", {"space.schedule": ["fixed"]}),  # the file's thresholds under a fixed schedule
])
def test_a_spec_file_s_own_knobs_are_not_the_command_s(spec, overrides):
    """Only what the command typed is refused: a task's spec sets knobs for its own space, and a flag
    that changes the space may leave some unread (these ran before knobs said what they need)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    resolve_spec(root / spec if spec else None, overrides)  # no DsparkError

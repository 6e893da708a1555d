"""Records from an engine's continuations: the file, its checks, the batched rollouts, resume and shards."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import invoke, one_error_line
from transformers import DynamicCache

from dspark_bench.config import Drafting
from dspark_bench.decoding import confidence
from dspark_bench.engines.continuations import write_continuations
from dspark_bench.errors import DsparkError
from dspark_bench.harness.workload import Workload
from dspark_bench.measure import record_parts
from dspark_bench.measure.recording import draft_rollouts, record
from dspark_bench.replay.simulate import simulate, spanning_policies
from dspark_bench.tuning.preparation import prepare
from dspark_bench.tuning.records import load_or_record
from dspark_bench.tuning.replay_sweep import record_plan
from dspark_bench.tuning.spec import parse_spec

MAX_NEW = 12


def alone(draft, sequence, prompt_len, positions, steps, topk):
    """Each position's rollout decoded by itself, step by step: what the batched rollouts must equal."""
    tokens = np.zeros((positions, steps), dtype=np.int64)
    scores = {m: np.zeros((positions, steps), dtype=np.float32) for m in confidence.SIGNALS}
    for j in range(positions):
        cache, ids = DynamicCache(), torch.tensor([sequence[: prompt_len + j]])
        for k in range(steps):
            logits = draft(input_ids=ids, cache=cache, use_cache=True).logits[0, -1]
            tokens[j, k] = int(logits.argmax())
            for name, values in confidence.all_metrics(torch.softmax(logits.float(), -1)[None], topk).items():
                scores[name][j, k] = float(values[0])
            ids = logits.argmax()[None, None]
    return tokens, scores


@pytest.mark.parametrize("rows", [128, 3])  # one pass over every position, and several
def test_batched_rollouts_equal_each_position_decoded_alone(llama_pair, rows):
    _, draft = llama_pair
    sequence = torch.randint(0, draft.config.vocab_size, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        tokens, scores = draft_rollouts(draft, sequence, 9, 21, 5, 5, rows=rows)
        expected, expected_scores = alone(draft, sequence, 9, 21, 5, 5)
    assert np.array_equal(tokens, expected)
    # The same numbers up to float32 kernel noise: a batch of padded rows and a row alone run
    # different attention kernels (seen up to 1.2e-5 on an Intel Xeon with torch 2.13), while a
    # wrong position or step would be off by far more than 1e-4.
    for name in scores:
        assert np.allclose(scores[name], expected_scores[name], atol=1e-4), name


class MaskBlind(torch.nn.Module):
    """A model that drops a custom attention mask, as some remote-code models do."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None):
        return self.model(input_ids=input_ids, position_ids=position_ids, cache=cache, use_cache=use_cache)


def test_a_model_that_ignores_the_tree_mask_is_refused(llama_pair):
    _, draft = llama_pair
    sequence = list(range(5, 40))
    with pytest.raises(DsparkError, match="does not honour a custom 4D attention mask"):
        draft_rollouts(MaskBlind(draft), sequence, 10, 25, 4, 5)


# --- a file, a sweep's record from it ------------------------------------------------------------


@pytest.fixture(scope="module")
def workload(saved_pair, prompts_file):
    target, draft = saved_pair
    return Workload(dataset=str(prompts_file), target=str(target), draft=str(draft), device="cpu",
                    max_new_tokens=MAX_NEW)


@pytest.fixture(scope="module")
def ours_file(workload, tmp_path_factory):
    return write_continuations(workload, "ours", tmp_path_factory.mktemp("c") / "ours.jsonl")


def sweep_spec(workload: Workload, continuations: Path | None, **more) -> object:
    fields = {k: v for k, v in dataclasses.asdict(workload).items() if v is not None and k in (
        "dataset", "target", "draft", "device", "max_new_tokens")}
    return parse_spec({**fields, "evaluation": "replay", "space": {"gamma_max": [2, 4], "threshold": [0.3, 0.6]},
                       **({"continuations": str(continuations)} if continuations else {}), **more})


def assert_same_record(a, b):
    for name in ("continuation", "lengths", "rollout", "available"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert set(a.confidences) == set(b.confidences)
    for name in a.confidences:
        assert np.array_equal(a.confidences[name], b.confidences[name]), name


def test_a_record_from_our_decoders_continuations_equals_todays_record(workload, ours_file, tmp_path):
    spec = sweep_spec(workload, ours_file)
    prepared = prepare(spec)
    _, gamma, dirs, ids = record_plan(spec, prepared, tmp_path / "records")
    (record_dir,) = dirs.values()
    assert f"-c{prepared.continuations.fingerprint}" in record_dir.name  # not the cache of a record decoded here
    from_file = load_or_record(spec, prepared, gamma, ids, record_dir)
    here = record(prepared.pair, ids, MAX_NEW, gamma, spec.topk, eos_ids=spec.runner_settings().eos_ids(prepared.pair))
    assert_same_record(from_file, here)
    for policy in spanning_policies(gamma, MAX_NEW):  # and so, round for round
        assert simulate(from_file, policy) == simulate(here, policy)
    info = json.loads((record_dir / "record.json").read_text())
    assert info["continuations"]["engine"]["decoder"] == "ours" and len(info["continuations"]["sha256"]) == 64
    assert not record_dir.with_name(record_dir.name + ".parts").exists()  # the record holds its parts now


def test_recording_resumes_after_a_kill_and_shards_merge(workload, ours_file, tmp_path, monkeypatch):
    spec = sweep_spec(workload, ours_file)
    prepared = prepare(spec)
    _, gamma, _, ids = record_plan(spec, prepared, tmp_path)
    source, eos = prepared.continuations, spec.runner_settings().eos_ids(prepared.pair)
    drafter = Drafting()

    def continuation(p):
        return source.continuation(prepared.prompts[p].id)

    def make(parts, shard=(1, 1), progress=None):
        return record_parts.record_parts(prepared.pair, drafter, ids, continuation, parts, gamma, spec.topk, shard,
                                         progress)

    def assemble(parts):
        return record_parts.assemble_parts(parts, ids, MAX_NEW, gamma, spec.topk, eos, drafter)

    whole = assemble_after(make, tmp_path / "whole", assemble)
    done = []

    def killed_after_two():
        done.append(1)
        if len(done) == 2:
            raise KeyboardInterrupt  # a kill between two prompts

    with pytest.raises(KeyboardInterrupt):
        make(tmp_path / "killed", progress=killed_after_two)
    assert len(list((tmp_path / "killed").glob("*.npz"))) == 2
    with pytest.raises(DsparkError, match="1 of 3 prompts are not recorded"):
        assemble(tmp_path / "killed")
    assert make(tmp_path / "killed") == 1  # only the prompt the kill left
    assert_same_record(assemble(tmp_path / "killed"), whole)

    assert make(tmp_path / "shards", (1, 2)) == 2 and make(tmp_path / "shards", (2, 2)) == 1
    assert_same_record(assemble(tmp_path / "shards"), whole)


def assemble_after(make, parts, assemble):
    assert make(parts) == 3
    return assemble(parts)


# --- bad files: one line, exit 1, nothing written --------------------------------------------------


def rewrite(source: Path, target: Path, edit) -> Path:
    lines = [json.loads(line) for line in source.read_text().splitlines()]
    target.write_text("".join(json.dumps(line) + "\n" for line in edit(lines)))
    return target


def first_prompt(change):
    def edit(lines):
        change(lines[1])
        return lines
    return edit


BAD = {
    "other prompts": (lambda ls: [ls[0]] + [{**ln, "id": "other-" + ln["id"]} for ln in ls[1:]],
                      "holds no continuation for 3 of the 3 prompts"),
    "another tokenizer": (first_prompt(lambda ln: ln.update(prompt_token_ids=[t + 1 for t in ln["prompt_token_ids"]])),
                          "was tokenized differently there"),
    "ids outside the vocabulary": (first_prompt(lambda ln: ln.update(token_ids=[10**6] + ln["token_ids"][1:])),
                                   "outside this tokenizer's vocabulary"),
    "truncated continuation": (first_prompt(lambda ln: ln.update(token_ids=ln["token_ids"][:3],
                                                                 finish_reason="length")),
                               "is truncated: 3 of 12 tokens"),
    "sampled": (lambda ls: [{**ls[0], "sampling": {"temperature": 0.7}}] + ls[1:], "was not decoded greedily"),
    "missing prompts": (lambda ls: ls[:-1], "holds no continuation for 1 of the 3 prompts"),
    "too short": (lambda ls: [{**ls[0], "max_new_tokens": 8}] + ls[1:], "generated with max_new_tokens 8"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_file_ends_in_one_line_and_writes_nothing(workload, ours_file, tmp_path, case):
    edit, message = BAD[case]
    bad = rewrite(ours_file, tmp_path / "bad.jsonl", edit)
    result = invoke("sweep", "--dataset", workload.dataset, "--target", workload.target, "--draft", workload.draft,
                    "--device", "cpu", "--max-new-tokens", MAX_NEW, "--continuations", bad, "--out", tmp_path / "out")
    assert result.exit_code == 1
    assert message in one_error_line(result)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*"))


def test_a_file_cut_mid_line_or_of_another_kind_is_refused(workload, ours_file, tmp_path):
    cut = tmp_path / "cut.jsonl"
    cut.write_text(ours_file.read_text()[:-40])
    with pytest.raises(DsparkError, match=r"line 4 is not JSON \(a file cut short\?\)"):
        prepare(sweep_spec(workload, cut))
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"format": "something else"}) + "\n")
    with pytest.raises(DsparkError, match="is not a continuations file"):
        prepare(sweep_spec(workload, other))
    with pytest.raises(DsparkError, match="does not exist"):
        prepare(sweep_spec(workload, tmp_path / "none.jsonl"))


def test_calibrate_records_each_domain_from_its_continuations(workload, ours_file, saved_pair):
    from dspark_bench.harness.models import load_pair
    from dspark_bench.tuning.calibrate import domain_continuations, domain_prompts, record_domains
    from dspark_bench.tuning.spec import base_config

    spec = sweep_spec(workload, ours_file)
    pair = load_pair(workload.target, workload.draft, "cpu")
    domains, base = domain_prompts(spec), base_config(spec, None)
    source = domain_continuations(spec, pair, domains, base)
    from_file, _ = record_domains(pair, domains, base, 4, source=source)
    here, _ = record_domains(pair, domains, base, 4)
    assert set(from_file) == set(here) == {"code", "prose"}
    for domain in here:
        assert_same_record(from_file[domain], here[domain])
        assert from_file[domain].info["continuations"]["sha256"] == source.sha256


def test_llama_server_writes_continuations_a_sweep_records_from(tmp_path, monkeypatch):
    """`continuations write --decoder llamacpp`: llama.cpp's own greedy outputs, EOS included where it
    stopped, become the record's continuations (its tokens, not ours)."""
    from test_engines import llama_server_or_skip

    binary = llama_server_or_skip()
    monkeypatch.setenv("DSPARK_GGUF_HOME", str(tmp_path / "gguf"))
    path = tmp_path / "llamacpp.jsonl"
    result = invoke("continuations", "write", "--task", "code", "--limit", 3, "--max-new-tokens", 16, "--device", "cpu",
                    "--decoder", "llamacpp", "--llama-server", binary, "--out", path)
    assert result.exit_code == 0, result.output
    head, *lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert head["engine"]["name"] == "llama.cpp" and head["engine"]["version"].startswith("b")
    assert head["sampling"]["temperature"] == 0 and head["max_new_tokens"] == 16 and len(lines) == 3
    spec = parse_spec({"task": "code", "limit": 3, "max_new_tokens": 16, "device": "cpu", "evaluation": "replay",
                       "space": {"gamma_max": [3]}, "continuations": str(path)})
    prepared = prepare(spec)
    eos = spec.runner_settings().eos_ids(prepared.pair)
    for line in lines:
        stopped = bool(line["token_ids"]) and line["token_ids"][-1] in eos
        assert line["finish_reason"] == ("stop" if stopped else "length")
        assert stopped or len(line["token_ids"]) == 16
    _, gamma, dirs, ids = record_plan(spec, prepared, tmp_path / "records")
    rec = load_or_record(spec, prepared, gamma, ids, next(iter(dirs.values())))
    for p, line in enumerate(lines):
        assert ids[p] == line["prompt_token_ids"]
        assert rec.continuation[p, : rec.lengths[p]].tolist() == line["token_ids"]


def test_shards_on_the_command_line_leave_parts_the_sweep_assembles_without_recording(workload, ours_file, tmp_path,
                                                                                     monkeypatch):
    common = ["sweep", "--dataset", workload.dataset, "--target", workload.target, "--draft", workload.draft,
              "--device", "cpu", "--max-new-tokens", MAX_NEW, "--evaluation", "replay", "--gamma-max", 2,
              "--gamma-max", 4, "--threshold", 0.3, "--threshold", 0.6, "--out", tmp_path / "out"]
    alone = invoke(*common, "--shard", "1/2")
    assert alone.exit_code == 1 and "--shard splits recording from an engine's continuations" in one_error_line(alone)
    assert invoke(*common, "--continuations", ours_file, "--shard", "0/2").exit_code == 1
    for shard in ("1/2", "2/2"):
        result = invoke(*common, "--continuations", ours_file, "--shard", shard)
        assert result.exit_code == 0, result.output
    (parts,) = (tmp_path / "out" / "records").glob("*.parts")
    assert len(list(parts.glob("*.npz"))) == 3
    assert not list((tmp_path / "out").glob("*sweep*"))  # a shard writes no sweep folder

    spec = sweep_spec(workload, ours_file)
    prepared = prepare(spec)
    _, gamma, dirs, ids = record_plan(spec, prepared, tmp_path / "out" / "records")
    (record_dir,) = dirs.values()
    assert parts.name == record_dir.name + ".parts"  # the very folder the sweep reads
    monkeypatch.setattr(record_parts, "record_prompt", lambda *a: pytest.fail("a prompt was recorded again"))
    assembled = load_or_record(spec, prepared, gamma, ids, record_dir)
    monkeypatch.undo()
    here = record(prepared.pair, ids, MAX_NEW, gamma, spec.topk, eos_ids=spec.runner_settings().eos_ids(prepared.pair))
    assert_same_record(assembled, here)


def test_a_sweep_from_a_continuations_file_runs_end_to_end_and_says_so(workload, ours_file, tmp_path):
    result = invoke("sweep", "--dataset", workload.dataset, "--target", workload.target, "--draft", workload.draft,
                    "--device", "cpu", "--max-new-tokens", MAX_NEW, "--gamma-max", 2, "--gamma-max", 4,
                    "--threshold", 0.3, "--confirm-top", 1, "--continuations", ours_file, "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert ("the target's continuations: dspark-bench" in result.output
            and "from the continuations file" in result.output)
    (folder,) = tmp_path.glob("*-sweep-*")
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["continuations"]["files"] == [str(ours_file)] and summary["confirmed"]
    record_info = json.loads((Path(summary["record"]) / "record.json").read_text())
    assert record_info["continuations"]["sha256"] == summary["continuations"]["sha256"]


def test_a_damaged_part_and_a_failed_write_end_in_one_line_and_leave_nothing(tmp_path):
    from dspark_bench.replay.continuations import header, line, write

    part = tmp_path / "0000000.npz"
    part.write_bytes(b"PK\x03\x04 cut short")  # a part copied half-way
    with pytest.raises(DsparkError, match="is unreadable"):
        record_parts.load_part(part)

    def lines():
        yield line("a", [1, 2], [3, 4], "length")
        raise DsparkError("llama-server stopped prompt 'b' after 3 tokens: its context is full")

    out = tmp_path / "c.jsonl"
    with pytest.raises(DsparkError, match="context is full"):
        write(out, header({"name": "test"}, "m", 2, False), lines())
    assert list(tmp_path.glob("c.jsonl*")) == []


def test_a_missing_or_foreign_file_is_refused_before_prompts_or_models_load(workload, tmp_path, monkeypatch):
    """What can be checked of a continuations file without the prompts or the models (that it is
    there, a greedy continuations file) is checked first: nothing is read or loaded before."""
    from dspark_bench.tuning import preparation

    def loaded(*args, **kwargs):
        raise AssertionError("prompts or models were loaded before the file was checked")

    monkeypatch.setattr(preparation, "load_prompts", loaded)
    monkeypatch.setattr(preparation, "load_pair", loaded)
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"format": "something else"}) + "\n")
    for path, message in ((tmp_path / "none.jsonl", "does not exist"), (other, "is not a continuations file")):
        with pytest.raises(DsparkError, match=message):
            prepare(sweep_spec(workload, path))

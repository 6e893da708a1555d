"""Drafters other than a draft model: multi-token heads on the target and prompt lookup.

Each is lossless (greedy output is the target's own, token for token; sampling passes the
chi-square test), replay equals the engine round for round, and the heads train and resume.
"""

import numpy as np
import pytest
import tiny
import torch
from test_speculative import SMALL_VOCAB, chi_square_p, exact_first_two, sampled_first_two

from dspark_bench.config import DecodeConfig, Drafting
from dspark_bench.decoding import heads as heads_mod
from dspark_bench.decoding import lookup
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.proposal import Proposal
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.errors import DsparkError
from dspark_bench.measure.recording import record
from dspark_bench.replay.simulate import simulate, simulate_grid, spanning_policies

PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [7], [5, 6, 7, 5, 6, 7, 5, 6], [9, 3]]


def random_heads(target, count: int = 3, seed: int = 0, scale: float = 0.3) -> heads_mod.Heads:
    """Heads that guess differently from the target (an untrained head repeats its next token)."""
    hidden = target.get_output_embeddings().weight.shape[1]
    heads = heads_mod.Heads(hidden, count).attach(target)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in heads.blocks:
            block.weight.copy_(torch.randn(block.weight.shape, generator=generator) * scale)
    return heads.eval()


def drafter_of(name: str, target, heads):
    return heads if name == "heads" else None


# --- lossless ---------------------------------------------------------------------------------


GREEDY_POLICIES = [
    dict(schedule="fixed", gamma_max=4, min_draft_len=0),
    dict(metric="top1", threshold=0.3, gamma_max=5),
    dict(metric="margin", schedule="cumulative", threshold=0.2, gamma_max=6, min_draft_len=0),
    dict(metric="entropy", threshold=0.5, gamma_max=3, semantics="hf", min_draft_len=0),
    dict(metric="top1", threshold=0.4, gamma_max=4, min_draft_len=2, semantics="llamacpp"),
]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("drafter,mode", [("heads", "early-stop"), ("heads", "verify-side"), ("lookup", "early-stop")])
def test_greedy_output_equals_target_greedy(arch, drafter, mode):
    target = tiny.llama() if arch == "llama" else tiny.gpt2()
    heads = random_heads(target)
    for fields in GREEDY_POLICIES:
        config = DecodeConfig.of(drafter=drafter, draft_mode=mode, max_new_tokens=30, ngram_min=1, ngram_max=2,
                                 **fields)
        for prompt in PROMPTS:
            spec = speculative_decode(target, drafter_of(drafter, target, heads), prompt, config, frozenset({0}))
            base = autoregressive_decode(target, prompt, config, frozenset({0}))
            assert spec.tokens == base.tokens, (config.label(), prompt)
            assert sum(r.emitted for r in spec.rounds) == len(spec.tokens)
            # The heads run one pass a round that may draft, over a hidden state the target computed; lookup none.
            assert spec.draft_forwards == (sum(r.drafted > 0 or r.stop_reason == "threshold" for r in spec.rounds)
                                           if drafter == "heads" else 0)


def sampling_setup(drafter: str):
    target = tiny.llama(vocab=SMALL_VOCAB, seed=3)
    heads = random_heads(target, count=3, seed=5, scale=1.0)
    config = DecodeConfig.of(drafter=drafter, temperature=1.0, top_p=0.9, threshold=0.0, gamma_max=3, max_new_tokens=3,
                          ngram_min=1, ngram_max=2)
    prompt = [2, 4, 2]  # lookup finds "2" and proposes what followed it
    return target, heads, prompt, config, exact_first_two(target, prompt, config)


@pytest.mark.parametrize("drafter", ["heads", "lookup"])
def test_sampling_matches_target_distribution(drafter):
    target, heads, prompt, config, exact = sampling_setup(drafter)
    first = speculative_decode(target, drafter_of(drafter, target, heads), prompt, config)
    assert first.rounds[0].drafted >= 2  # the first two tokens are drafted, so verification decides them
    counts = sampled_first_two(target, drafter_of(drafter, target, heads), prompt, config)
    assert chi_square_p(counts, exact) > 0.001


def test_sampling_test_catches_heads_drawn_from_another_distribution(monkeypatch):
    """The heads drafter must hand the verifier the q its tokens were drawn from."""
    import dspark_bench.decoding.drafters as drafters

    target, heads, prompt, config, exact = sampling_setup("heads")
    # Each head's most likely token, verified as if drawn from q: accepted too often.
    monkeypatch.setattr(drafters, "pick", lambda logits, q, c, g: logits.argmax(-1))
    counts = sampled_first_two(target, heads, prompt, config, samples=1000)
    assert chi_square_p(counts, exact) < 1e-4


# --- replay -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded_drafters():
    from types import SimpleNamespace

    target = tiny.llama()
    heads = random_heads(target)
    pair = SimpleNamespace(target=target, draft=None, heads=heads, eos_ids=frozenset({0}))
    records = {name: record(pair, PROMPTS, 30, 6, drafter=Drafting(drafter=name, ngram_min=1, ngram_max=2))
               for name in ("heads", "lookup")}
    return target, heads, records


@pytest.mark.parametrize("drafter", ["heads", "lookup"])
def test_simulated_rounds_equal_our_decoder(recorded_drafters, drafter):
    target, heads, records = recorded_drafters
    rec = records[drafter]
    configs = [c.replace(drafter=drafter, ngram_min=1, ngram_max=2) for c in spanning_policies(6, 30)]
    reasons = set()
    for config in configs:
        for p, rounds in enumerate(simulate(rec, config)):
            real = speculative_decode(target, drafter_of(drafter, target, heads), PROMPTS[p], config, frozenset({0}))
            assert len(rounds) == len(real.rounds), config.label()
            for mine, theirs in zip(rounds, real.rounds):
                assert (mine.drafted, mine.accepted, mine.emitted, mine.stop_reason, mine.draft_tokens,
                        mine.target_token, mine.draft_forwards) == (
                    theirs.drafted, theirs.accepted, theirs.emitted, theirs.stop_reason, theirs.draft_tokens,
                    theirs.target_token, theirs.draft_forwards), config.label()
                assert mine.confidences == pytest.approx(theirs.confidences, abs=1e-5)
                reasons.add(mine.stop_reason)
    assert "exhausted" in reasons  # the drafter running out is replayed too
    table = simulate_grid(rec, configs)
    for row, config in zip(table.itertuples(), configs):
        rounds = [r for prompt in simulate(rec, config) for r in prompt]
        assert (row.rounds, row.drafted_total, row.accepted_total, row.full_blocks, row.draft_forwards) == (
            len(rounds), sum(r.drafted for r in rounds), sum(r.accepted for r in rounds),
            sum(r.accepted == r.drafted for r in rounds), sum(r.draft_forwards for r in rounds)), config.label()


def test_replay_refuses_another_drafters_record(recorded_drafters):
    _, _, records = recorded_drafters
    with pytest.raises(DsparkError, match="lookup drafter's proposals"):
        simulate(records["lookup"], DecodeConfig.of(drafter="heads", max_new_tokens=30))
    with pytest.raises(DsparkError, match="n-grams of 1-2"):
        simulate(records["lookup"], DecodeConfig.of(drafter="lookup", ngram_min=2, ngram_max=3, max_new_tokens=30))
    with pytest.raises(DsparkError, match="heads drafter's"):
        simulate(records["heads"], DecodeConfig.of(max_new_tokens=30))


# --- prompt lookup ----------------------------------------------------------------------------


def test_lookup_follows_the_longest_earlier_ngram():
    # "7 8" occurred before, followed by 9 1; the 1-gram "8" also occurred, followed by 5.
    seq = [8, 5, 0, 7, 8, 9, 1, 3, 7, 8]
    tokens, votes = lookup.continuation(seq, 1, 2, 5)
    assert tokens[:2] == [9, 1]
    assert votes[0][2] == 2  # matched on the 2-gram
    tokens, _ = lookup.continuation(seq, 1, 1, 1)
    assert tokens == [9]  # the 1-gram "8": two occurrences vote 5 and 9; the latest one breaks the tie


def test_lookup_confidence_rises_with_agreement_and_match_length():
    vocab = 50
    one_of_1gram = lookup.scores([(np.array([4]), np.array([1]), 1)], vocab, 5)["top1"]
    one_of_3gram = lookup.scores([(np.array([4]), np.array([1]), 3)], vocab, 5)["top1"]
    four_agree = lookup.scores([(np.array([4]), np.array([4]), 3)], vocab, 5)["top1"]
    split = lookup.scores([(np.array([4, 6]), np.array([2, 2]), 3)], vocab, 5)
    assert one_of_1gram.item() == pytest.approx(0.5)
    assert one_of_3gram.item() == pytest.approx(0.75)
    assert four_agree.item() == pytest.approx(4 / (4 + 1 / 3))
    assert split["margin"].item() == pytest.approx(0.0, abs=1e-6)
    q = lookup.vote_distribution(np.array([4, 6]), np.array([3, 1]), 2, vocab)
    assert q.sum().item() == pytest.approx(1.0, abs=1e-5)


def test_lookup_runs_on_into_a_repeating_pattern_and_stops_without_a_match():
    tokens, _ = lookup.continuation([1, 2, 3, 1, 2, 3, 1], 1, 3, 6)
    assert tokens == [2, 3, 1, 2, 3, 1]  # the occurrence runs on into the tokens drafted this round
    assert lookup.continuation([1, 2, 3, 4], 1, 3, 5) == ([], [])
    assert lookup.continuation([5], 1, 3, 5) == ([], [])


def test_exhausted_drafter_ends_the_draft_and_respects_llamacpp_discard():
    config = DecodeConfig.of(gamma_max=5)
    proposal = Proposal.start(config, 10)
    proposal.cap(2)
    assert (proposal.limit, proposal.stop_reason, proposal.done) == (2, "exhausted", False)
    proposal = Proposal.start(DecodeConfig.of(gamma_max=5, min_draft_len=3, semantics="llamacpp"), 10)
    proposal.cap(2)  # shorter than llama.cpp's --draft-min: nothing is drafted
    assert (proposal.limit, proposal.done) == (0, True)
    proposal = Proposal.start(config, 10)
    proposal.cap(7)  # more than the limit: nothing changes
    assert (proposal.limit, proposal.stop_reason) == (5, "gamma_max")


@pytest.mark.parametrize("changes,message", [
    (dict(drafter="medusa"), "unknown drafter"),
    (dict(drafter="lookup", ngram_min=3, ngram_max=2), "ngram_min <= ngram_max"),
    (dict(drafter="lookup", ngram_min=0), "ngram_min <= ngram_max"),
    (dict(drafter="lookup", draft_mode="verify-side"), "lookup drafter proposes on the host"),
    (dict(drafter="heads", batch_size=4), "batch size 1 only"),
    (dict(drafter="heads", compiled=True), "model drafter only"),
])
def test_config_refuses_bad_drafter_settings(changes, message):
    with pytest.raises(DsparkError, match=message):
        DecodeConfig.of(**changes)


# --- heads: training, files ---------------------------------------------------------------------


def test_heads_learn_resume_and_round_trip(tmp_path):
    from dspark_bench.harness import train_heads as heads_train

    target = tiny.llama(vocab=64, hidden=32)
    for param in target.parameters():
        param.requires_grad_(False)
    # A token stream where token t+2 follows from token t: what a head can learn and the target cannot know.
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, 6000)
    tokens[2::2] = (tokens[:-2:2] * 7 + 3) % 64
    ids = torch.from_numpy(tokens[:129].astype(np.int64))[None]
    before = heads_train.heads_loss(heads_mod.Heads(32, 2).attach(target), heads_mod.target_hidden(target, ids), ids)
    heads, state = heads_train.train_heads(target, tokens, tmp_path, budget_s=600, count=2, max_steps=10)
    assert state["step"] == 10 and (tmp_path / "heads_ckpt.pt").is_file()
    heads, state = heads_train.train_heads(target, tokens, tmp_path, budget_s=600, count=2, max_steps=40)
    assert state["step"] == 40  # resumed from step 10, not restarted
    with torch.no_grad():
        after = heads_train.heads_loss(heads, heads_mod.target_hidden(target, ids), ids)
    assert after < before - 0.5
    heads_mod.save(heads, tmp_path / "out", {"target": heads_mod.target_identity(target)})
    loaded = heads_mod.load(tmp_path / "out", target)
    hidden = torch.randn(3, 32)
    assert torch.allclose(loaded(hidden), heads(hidden), atol=0.05)  # fp16 on disk
    assert heads_mod.load(tmp_path / "out", target.to(torch.bfloat16)).blocks[0].weight.dtype == torch.bfloat16
    with pytest.raises(DsparkError, match="trained on another target"):
        heads_mod.load(tmp_path / "out", tiny.llama(vocab=64, hidden=32, seed=7))
    with pytest.raises(DsparkError, match="holds no heads"):
        heads_mod.load(tmp_path / "missing", target)
    (tmp_path / "out" / heads_mod.WEIGHTS).write_bytes(b"not safetensors")
    with pytest.raises(DsparkError, match="unreadable"):
        heads_mod.load(tmp_path / "out", target)


# --- the command line: run, sweep and report with every drafter ---------------------------------


@pytest.fixture(scope="module")
def saved_heads(saved_pair, tmp_path_factory):
    """Heads for the saved tiny target, as `models build --heads` writes them."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(saved_pair[0])
    folder = tmp_path_factory.mktemp("heads")
    heads_mod.save(random_heads(target, count=3, scale=0.1), folder, {"target": heads_mod.target_identity(target)})
    return folder


def test_replay_sweep_compares_every_drafter_side_by_side(saved_pair, saved_heads, prompts_file, tmp_path):
    import json

    import pandas as pd
    from cli_helpers import invoke

    from dspark_bench.reporting.report import build_report

    target, draft = saved_pair
    result = invoke("sweep", "--target", target, "--draft", draft, "--heads", saved_heads, "--dataset", prompts_file,
                    "--out", tmp_path, "--max-new-tokens", "12", "--threshold", "0.3", "--gamma-max", "3",
                    "--drafter", "model", "--drafter", "heads", "--drafter", "lookup", "--confirm-top", "1",
                    "--set", "space.ngram_max=[2, 3]")
    assert result.exit_code == 0, result.output
    records = sorted(p.name for p in (tmp_path / "records").iterdir())
    assert len(records) == 4 and sum("lookup-1-" in name for name in records) == 2  # model, heads, 2 lookups
    (folder,) = [p for p in tmp_path.iterdir() if p.name != "records" and not p.name.startswith(".")]
    table = pd.read_parquet(folder / "trials.parquet")
    assert set(table["drafter"]) == {"model", "heads", "lookup"}
    assert set(table.loc[table["drafter"] == "lookup", "ngram_max"]) == {2, 3}
    assert (table.loc[table["drafter"] != "lookup", "ngram_max"] == 3).all()  # one point each, not one per n
    confirmed = table[table["source"] == "confirmed"]
    assert set(confirmed["drafter"]) == {"model", "heads", "lookup"}
    assert (confirmed["identical_to_baseline"] == 1.0).all()
    # Lookup runs no draft forward; the heads one pass a round, but for a round with no room to draft
    # (at most each of the 3 prompts' last).
    heads_rows = table[table["drafter"] == "heads"]
    assert (heads_rows["draft_forwards"] <= heads_rows["rounds"]).all()
    assert (heads_rows["draft_forwards"] >= heads_rows["rounds"] - 3).all()
    assert (table.loc[table["drafter"] == "lookup", "draft_forwards"] == 0).all()
    summary = json.loads((folder / "summary.json").read_text())
    assert {row["drafter"] for row in summary["by_drafter"]} == {"model", "heads", "lookup"}
    assert json.loads((folder / "cost_model.json").read_text())["t_heads"] > 0
    report = build_report(folder).read_text()
    assert "## Drafters side by side" in report and "Pick the " in report


def test_run_records_the_drafter_and_refuses_what_cannot_run(saved_pair, saved_heads, prompts_file, tmp_path):
    import json

    from cli_helpers import invoke, one_error_line

    target, draft = saved_pair
    common = ["--target", target, "--draft", draft, "--dataset", prompts_file, "--max-new-tokens", "8"]
    result = invoke("run", *common, "--heads", saved_heads, "--drafter", "heads", "--drafter", "lookup",
                    "--ngram-max", "2", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    (folder,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    configs = json.loads((folder / "run.json").read_text())["configs"]
    assert [(c["drafter"], c["ngram_max"]) for c in configs] == [("heads", 3), ("lookup", 2)]
    for args, message in [
        (["--drafter", "heads"], "needs heads trained on this target"),
        (["--drafter", "medusa"], "unknown drafter 'medusa'"),
        (["--drafter", "heads", "--heads", tmp_path / "nowhere"], "holds no heads"),
        (["--drafter", "lookup", "--batch-size", "2"], "batch size 1 only"),
        (["--drafter", "lookup", "--decoder", "hf"], "--decoder hf runs HF's assisted generation"),
    ]:
        result = invoke("run", *common, *args, "--out", tmp_path / "refused")
        assert result.exit_code != 0
        assert message in one_error_line(result)

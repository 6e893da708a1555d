"""Replay from llama.cpp's own continuations against llama.cpp measured: acceptance per policy.

A benchmark, not a test. Given a `run --decoder llamacpp` folder and a continuations file that
`dspark-bench continuations write --decoder llamacpp` wrote for the same prompts, flags and
GGUF target, it records from the file (llama.cpp's target tokens, the draft's rollouts here)
and replays each policy the run measured, under llama.cpp's rule. It prints, per policy,
llama.cpp's measured acceptance (accepted / drafted over every prompt), replay's from the
file's record, and replay's from the record of our decoder's continuations (what the run
itself printed), with each one's difference from llama.cpp's. It also prints how many prompts
llama.cpp's output differs from ours on, and checks that the file's record holds
llama.cpp's output (its plain server's), not ours.

    python benchmarks/continuations_acceptance.py RUN_FOLDER CONTINUATIONS_FILE
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from dspark_bench.config import from_dict
from dspark_bench.harness.models import load_pair
from dspark_bench.measure.recording import record
from dspark_bench.prompts import encode
from dspark_bench.replay.continuations import open_for
from dspark_bench.replay.simulate import simulate
from dspark_bench.tasks import load_prompts


def main() -> None:
    first, _, rest = __doc__.strip().partition("\n\n")
    parser = argparse.ArgumentParser(description=first, epilog=rest,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a `run --decoder llamacpp` folder (llamacpp.json inside)")
    parser.add_argument("file", type=Path, help="llama.cpp's continuations of the same prompts")
    args = parser.parse_args()
    info = json.loads((args.run / "run.json").read_text())
    rows = pd.read_parquet(args.run / "llamacpp.parquet")
    summary = {row["policy"]: row for row in json.loads((args.run / "llamacpp.json").read_text())["summary"]}
    configs = [from_dict(c) for c in info["configs"]]
    settings, source = info["settings"], info["prompts"]
    prompts = load_prompts(source.get("task"), source.get("dataset"), limit=source.get("count"))[0]
    pair = load_pair(None, None, "cpu", "float32")
    ids = [encode(pair.tokenizer, p.text, settings.get("chat_template", "auto")) for p in prompts]
    max_new = configs[0].verification.max_new_tokens
    vocab = pair.target.get_output_embeddings().weight.shape[0]
    continuations = open_for(args.file, prompts, ids, max_new, pair.eos_ids, vocab)
    given = [continuations.continuation(p.id) for p in prompts]
    rec = record(pair, ids, max_new, max(c.stopping.gamma_max for c in configs), eos_ids=pair.eos_ids,
                 continuations=given)

    first_policy = rows[rows["config_id"] == 0].reset_index(drop=True)
    llama_outputs = [list(t) for t in first_policy["plain_tokens"]]
    holds_llama = all(rec.continuation[p, : rec.lengths[p]].tolist() == llama_outputs[p] for p in range(len(prompts)))
    differ = int((~first_policy["plain_identical_to_target"]).sum())
    print(f"{len(prompts)} prompts × {max_new} tokens; llama.cpp's output differs from ours on {differ}; "
          f"the file's record holds llama.cpp's output on every prompt: {holds_llama}")
    print(f"{'policy':40s} {'llama.cpp':>10s} {'replay, its tokens':>19s} {'diff':>7s} "
          f"{'replay, ours':>13s} {'diff':>7s}")
    for i, config in enumerate(configs):
        mine = rows[rows["config_id"] == i]
        measured = mine["accepted_total"].sum() / mine["drafted_total"].sum()
        rounds = [r for prompt in simulate(rec, config) for r in prompt]
        replayed = sum(r.accepted for r in rounds) / sum(r.drafted for r in rounds)
        ours = summary[config.label()]["replay_acceptance_rate"]
        print(f"{config.label():40s} {measured:10.4f} {replayed:19.4f} {replayed - measured:+7.4f} {ours:13.4f} "
              f"{ours - measured:+7.4f}")


if __name__ == "__main__":
    main()

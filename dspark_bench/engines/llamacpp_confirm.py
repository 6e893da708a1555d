"""A sweep priced on llama.cpp, confirmed in llama.cpp (`sweep --prices llamacpp`).

Replay ranks every policy on llama.cpp's prices, but only llama-server can say what llama.cpp
does with one. So the sweep takes the best policies llama.cpp can run (fixed γ, and top-1
thresholds under llama.cpp's rule: the export's candidates, replayed on the sweep's record and
ranked on those prices), and llama.cpp's own defaults (b11434's `common.h`: `--spec-draft-n-max 3`,
n-min 0, p-min 0, i.e. fixed γ = 3), and runs each in llama-server, request by request in turns
with a plain server on the same prompts (engines/llama_server.py `served`). Its verdict is the
deployment's: the best of them against plain decoding and against the defaults, paired on the same
prompts, and, where nothing beats plain decoding, that sentence first, with the acceptance a
fixed γ would need to break even on these prices.
"""

from __future__ import annotations

import pandas as pd

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.engines.export import break_even, candidates
from dspark_bench.engines.files import llamacpp_flags
from dspark_bench.engines.llama_server import LlamaServer, served
from dspark_bench.engines.llamacpp_run import found_build, generation_speedup, gguf_files
from dspark_bench.harness.runner import stage_steps
from dspark_bench.metrics import bootstrap_ratio
from dspark_bench.replay.simulate import simulate_grid
from dspark_bench.results import write_json
from dspark_bench.tasks.prompts import encode

FILE = "llamacpp_confirm.json"
DEFAULTS_GAMMA = 3  # llama.cpp's own default draft: --spec-draft-n-max 3, n-min 0, p-min 0


def defaults(base: DecodeConfig) -> DecodeConfig:
    """llama.cpp's default speculative policy, as our config says it."""
    return base.replace(schedule=schedules.BASELINE, gamma_max=DEFAULTS_GAMMA, min_draft_len=0, semantics="llamacpp",
                        batch_quorum=0.0, goodput_model="")


def picks(rec, base: DecodeConfig, prices, gamma: int, count: int) -> tuple[list[DecodeConfig], list[float | None]]:
    """The `count` policies llama.cpp can run that replay ranks best on its prices, then its
    defaults; and each one's predicted speedup on those prices (None for the defaults where they
    draft deeper than the sweep's record: run, not replayed)."""
    pool = [c for c in candidates("llamacpp", base, list(range(1, gamma + 1)))  # the defaults come last, once
            if not (schedules.of(c).baseline and c.stopping.gamma_max == DEFAULTS_GAMMA)]
    table = simulate_grid(rec, pool, prices.surface.at(1)).assign(config_id=range(len(pool)))
    ranked = table.sort_values("predicted_speedup", ascending=False, kind="stable").head(count)
    chosen = [pool[i] for i in ranked["config_id"]] + [defaults(base)]
    predicted = [float(v) for v in ranked["predicted_speedup"]]
    deep_enough = DEFAULTS_GAMMA <= min(rec.gamma_record, len(prices.surface.at(1).t_verify) - 1)
    predicted.append(float(simulate_grid(rec, chosen[-1:], prices.surface.at(1))["predicted_speedup"].iloc[0])
                     if deep_enough else None)
    return chosen, predicted


def confirm_in_llamacpp(spec, prepared, rec, prices, gamma: int, folder, say=None, progress=None) -> dict:
    """The sweep's best llama.cpp policies and its defaults measured in llama-server against plain
    decoding; their rows, the verdict and its sentence (also FILE in the sweep's folder)."""
    binary, build, version = found_build()
    pair, label = prepared.pair, prices.label
    chosen, predicted = picks(rec, prepared.base, prices, gamma, max(spec.confirm_top, 1))
    ids = [encode(pair.tokenizer, p.text, spec.chat_template) for p in prepared.prompts]
    target_file, draft_file, _ = gguf_files(spec, pair, "f32", build, binary, say)
    if say:
        say(f"confirming in {label}: {len(chosen)} policies llama.cpp can run "
            f"({', '.join(c.label() for c in chosen)}), each against a plain llama-server on the {len(ids)} prompts, "
            "in turns")
    max_new = prepared.base.verification.max_new_tokens
    context = max(len(i) for i in ids) + max_new + max(c.stopping.gamma_max for c in chosen) + 8
    measured, steps = [], stage_steps(progress, f"confirming in {label}", len(ids) * len(chosen))
    with LlamaServer(binary, target_file, [], spec.threads or None, context, None, "llama-server (plain)") as plain:
        for policy in chosen:
            flags = llamacpp_flags(policy, str(draft_file), version)
            with LlamaServer(binary, target_file, flags, spec.threads or None, context, None,
                             "llama-server (speculative)") as server:
                measured.append(served(plain, server, prepared.prompts, ids, policy, spec.repeats, steps))
    rows = [row(policy, rows, guess) for policy, rows, guess in zip(chosen, measured, predicted)]
    verdict = judge(rows, measured, chosen, prepared.base, prices, label)
    write_json(folder / FILE, {"engine": label, "build": build, "verdict": verdict, "rows": rows,
                               "prompts": [p.id for p in prepared.prompts]})
    return verdict


def row(policy: DecodeConfig, rows: pd.DataFrame, predicted: float) -> dict:
    """One policy as llama.cpp ran it: its speedup over plain decoding (generation phase, paired
    over prompts, 95 % interval) beside replay's prediction on llama.cpp's prices."""
    speed = generation_speedup(rows, policy.label())
    return {"policy": policy.label(), "config": policy.to_dict(), "predicted": predicted,
            **{key: float(speed[column]) for key, column in (
                ("measured", "speedup"), ("measured_low", "speedup_low"), ("measured_high", "speedup_high"),
                ("acceptance_rate", "acceptance_rate"), ("tokens_per_round", "tokens_per_round"),
                ("avg_draft_len", "avg_draft_len"))}}


def judge(rows: list[dict], measured: list[pd.DataFrame], chosen: list[DecodeConfig], base, prices, label: str) -> dict:
    """The deployment's verdict: the best measured policy against plain decoding and against
    llama.cpp's defaults (the same prompts, in the same plain server's turns)."""
    best = max(range(len(rows)), key=lambda i: rows[i]["measured"])
    top, default = rows[best], chosen.index(defaults(base))
    per_token = [m["spec_gen_s"].to_numpy() / m["new_tokens"].to_numpy() for m in measured]
    # > 1: the best is faster than the defaults (their seconds per token over the best's)
    over_defaults = bootstrap_ratio(per_token[default], per_token[best]) if best != default else (1.0, 1.0, 1.0)
    shown = f"{top['measured']:.2f}× [{top['measured_low']:.2f}, {top['measured_high']:.2f}]"
    alpha, gamma = break_even(prices.surface.at(1))
    even = (f"; speculation breaks even on these prices only where each drafted token is accepted with "
            f"probability {alpha:.2f} or more (fixed γ={gamma})" if alpha < 1 else
            "; on these prices no acceptance rate lets speculation break even")
    if top["measured_high"] < 1:
        sentence = f"in {label} here, plain decoding wins: the best policy measured {shown} ({top['policy']}){even}"
        wins = "plain"
    elif top["measured_low"] > 1:
        sentence = f"in {label} here, {top['policy']} is faster than plain decoding: {shown}"
        wins = "speculative"
    else:
        sentence = (f"in {label} here, no policy is faster than plain decoding beyond noise: the best measured "
                    f"{shown} ({top['policy']}){even}")
        wins = "neither"
    if best != default:
        sentence += (f"; against llama.cpp's defaults (fixed γ={DEFAULTS_GAMMA}): {over_defaults[0]:.2f}× "
                     f"[{over_defaults[1]:.2f}, {over_defaults[2]:.2f}]")
    return {"engine": label, "wins": wins, "best": top, "over_defaults": list(map(float, over_defaults)),
            "break_even_acceptance": alpha, "break_even_gamma": gamma, "sentence": sentence, "rows": rows,
            "measured_in": "llama-server's generation phase, in turns with a plain server on the same prompts"}

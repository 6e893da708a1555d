"""The GPU run's table (benchmarks/gpu): one markdown page from stages.json, every stage's
numbers or why it has none."""

from __future__ import annotations

import math
from pathlib import Path


def table(state: dict, args) -> str:
    parts = [f"# GPU run · {args.size} priced · {args.task} record {args.limit} × {args.max_new_tokens}\n"]
    for stage, write in (("machine", machine), ("correctness", correctness), ("syncs", syncs), ("prices", prices),
                         ("captured", captured),
                         ("compiled", compiled), ("replay", replay), ("timed", timed), ("batches", batches),
                         ("speed", speed)):
        if stage not in state:
            continue
        result = state[stage]
        if not result.get("done"):
            why = result.get("error") or result.get("skipped") or "not finished"
            parts.append(f"## {stage}\n\nnot done: {why}\n")
            continue
        parts.append(write(result))
    return "\n".join(parts)


def section(title: str, header: list[str], rows: list[list]) -> str:
    """A markdown section: its title, then one table."""
    lines = [f"## {title}\n", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def ms(seconds) -> str:
    return "—" if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)) else f"{seconds * 1e3:.3f}"


def machine(r: dict) -> str:
    gpu = r["machine"].get("gpu") or {}
    return (f"## machine\n\n{gpu.get('name') or r['machine'].get('cpu')} · torch {r['torch']} · transformers "
            f"{r['transformers']} · CUDA {r['cuda']} · device-to-device copy "
            f"{r['copy_bandwidth_bytes_per_s'] / 1e12:.3f} TB/s (bytes read + written, {r['copy_megabytes']} MiB)\n")


def correctness(r: dict) -> str:
    g, s = r["greedy"], r["sampling"]
    lines = ["## correctness\n",
             f"- greedy, fp32, shipped pair: {g['decodes']} decodes ({g['policies']} policies: every metric × "
             f"schedule; early-stop and verify-side at B = 1, batched at B = {g['batch_size']}; {g['prompts']} "
             f"prompts): **{'identical' if g['identical'] else 'DIFFERENT'}** to the target's own "
             f"({g['accepted_tokens']} tokens accepted, {g['rejected_rounds']} rounds with a rejection)"
             + (f"; differ: {'; '.join(g['differ'])}" if g["differ"] else ""),
             f"- greedy, fp32, captured (compiled passes, a CUDA graph per length on CUDA; batch 1, both draft "
             f"modes, and batched at B = {g['batch_size']}, {g['captured'].get('batched_decodes', 0)} of them): "
             f"{g['captured']['decodes']} decodes "
             f"**{'identical' if g['captured']['identical'] else 'DIFFERENT'}** to the captured baseline, which is "
             f"{'' if g['captured']['baseline_equals_eager'] else 'NOT '}the eager one's"
             + (f"; differ: {'; '.join(g['captured']['differ'])}" if g["captured"]["differ"] else ""),
             f"- sampling (T = 1, top-p 0.9, first two tokens, {s['samples']} samples): chi-square p = "
             f"{s['p_value']:.3f}; a broken rule (resampling from p) p = {s['broken_rule_p_value']:.2g}: "
             f"**{'lossless' if s['lossless'] else 'NOT SHOWN LOSSLESS'}**",
             f"- bf16, shipped pair, {r['bf16']['prompts']} prompts (the run's own report):"]
    for row in r["bf16"]["rows"]:
        first = row["first_divergence_min"]
        parted = "none parted" if first is None or first != first else f"the earliest parted at token {first}"
        lines.append(f"  - {row['policy']}: {row['identical_to_baseline']:.2f} of outputs identical ({parted}), "
                     f"{row['identical_share']:.3f} of positions equal")
    return "\n".join(lines) + "\n"


def syncs(r: dict) -> str:
    rows = [[row["policy"], row["draft_mode"], row["rounds"], f"{row['drafted_per_round']:.2f}",
             f"{row['fetches_per_round']:.2f}",
             "—" if row["cuda_syncs_per_round"] is None else f"{row['cuda_syncs_per_round']:.2f}"] for row in r["rows"]]
    return section("host syncs per round (shipped pair, fp32)", ["policy", "draft mode", "rounds", "drafted/round",
                   "host.fetch reads/round", "CUDA-observed syncs/round"], rows)


def prices(r: dict) -> str:
    batch = r["surface"]["batch_sizes"]
    sizes = sorted(batch, key=int)
    gamma = len(batch["1"]["t_verify"]) - 1
    lines = [f"## prices: {r['size']} ({r['dtype']}, random weights, context {r['context_tokens']})\n",
             f"- plain step, eager: {ms(r['eager_step']['seconds'])} ms; bandwidth bound "
             f"{ms(r['bandwidth_bound_s'])} ms ({r['bytes'] / 1e9:.2f} GB read: weights {r['weight_bytes'] / 1e9:.2f}, "
             f"KV {r['kv_bytes'] / 1e6:.1f} MB): "
             f"**{r['eager_step']['seconds'] / r['bandwidth_bound_s']:.2f}×** the bound",
             f"- round overhead t_round (B = 1, the median over γ, never below 0): "
             f"{ms(r['rounds']['t_round'])} ms; per γ: "
             + ", ".join(f"γ={g} {ms(v['overhead_s'])} ms" for g, v in r["rounds"]["per_gamma"].items()),
             f"- the surface's 1-token pass against the plain step: "
             f"{ms(r['surface']['batch_sizes']['1']['t_verify'][0])} against {ms(r['eager_step']['seconds'])} ms: "
             + ("agree" if r.get("surface_agrees_with_step") else "**DISAGREE**: these prices do not price our step"),
             f"- files: {', '.join(r['files'])}\n",
             "t_verify(k), ms (one target pass over k + 1 new positions), and the draft step:\n",
             "| B | t_draft | " + " | ".join(f"k={k}" for k in range(gamma + 1)) + " | spread |",
             "|---|---|" + "---|" * (gamma + 1) + "---|"]
    for b in sizes:
        m = batch[b]
        lines.append(f"| {b} | {ms(m['t_draft'])} | " + " | ".join(ms(t) for t in m["t_verify"])
                     + f" | {m.get('spread', 0):.3f} |")
    return "\n".join(lines) + "\n"


def captured(c: dict) -> str:
    """Batch 1 as a decode runs it on CUDA by default: captured passes alone, and inside decodes."""
    alone, inside, detail = c["alone"], c["in_decode"], c["in_decode_detail"]
    gamma = len(alone["t_verify"]) - 1
    lines = ["## captured passes at B = 1 (compiled; one CUDA graph per length on CUDA)\n",
             f"- target step {ms(alone['t_verify'][0])} ms = **{c['target_step_over_bound']:.2f}×** its bound "
             f"({ms(c['target_bound_s'])} ms); draft step {ms(alone['t_draft'])} ms = "
             f"**{c['draft_step_over_bound']:.2f}×** its bound ({ms(c['draft_bound_s'])} ms)",
             f"- verify({c['verify_tokens']}) / verify(1) (tokens fed): **{c['verify_8_over_1']:.2f}**",
             f"- inside running decodes (CUDA events, no sync between passes; {detail['rounds']} rounds, "
             f"{detail['plain_steps']} plain steps): a round's time past its passes (never below 0: a round "
             f"holds its passes), **{ms(inside['t_round'])} ms** a round, its first draft pass's excess over the "
             f"later ones {ms(detail.get('first_draft_excess', 0.0))} ms (t_first_draft) + "
             f"**{ms(detail['per_step_overhead'])} ms** a draft step (median round "
             f"{ms(detail['median_round_overhead'])} ms); t_draft = the draft pass (a later one's where the first "
             f"is dearer) {ms(detail['draft_pass'])} ms + that step's host work; plain step "
             f"{ms(inside['t_plain'])} ms whole, its pass "
             f"{ms(detail['plain_pass'])} ms; a catch-up draft pass of 2 tokens {ms(detail['catch_up_draft'])} ms; "
             f"unfed lengths scaled by {detail['verify_scaled_by']:.3f}",
             f"- files: {', '.join(Path(f).name for f in c['files'].values())}\n",
             "| timed | t_draft | " + " | ".join(f"k={k}" for k in range(gamma + 1)) + " |",
             "|---|---|" + "---|" * (gamma + 1)]
    for name, m in (("alone, between syncs", alone), ("inside decodes", inside)):
        lines.append(f"| {name} | {ms(m['t_draft'])} | " + " | ".join(ms(t) for t in m["t_verify"]) + " |")
    return "\n".join(lines) + "\n"


def compiled(r: dict) -> str:
    c, e = r["compiled_step"], r["eager_step"]
    return (f"## plain step against the bandwidth bound\n\n| step | ms | × bound |\n|---|---|---|\n"
            f"| bound | {ms(r['bandwidth_bound_s'])} | 1.00 |\n"
            f"| eager | {ms(e['seconds'])} | {r['ratio_eager']:.2f} |\n"
            f"| compiled (CUDA graphs on CUDA; compile and capture {c['warm_s']:.0f} s) | {ms(c['seconds'])} | "
            f"**{r['ratio_compiled']:.2f}** |\n" + (profile(r["profile"]) if r.get("profile") else ""))


def profile(p: dict) -> str:
    rows = [[e["name"][:80], e["calls"] // p["steps"], f"{e['self_device_ms']:.3f}", f"{e['self_cpu_ms']:.3f}"]
            for e in p["top_per_step"]]
    return "\n" + section(f"the compiled step profiled ({p['steps']} steps, by {p['sorted_by']}; the whole table in "
                          f"{p['table']})", ["op", "calls a step", "device ms a step", "CPU ms a step"], rows)


def replay(r: dict) -> str:
    rows = [[p["prices"], p["pick"], p["policy"], f"{p['predicted_speedup']:.3f}", f"{p['tokens_per_round']:.2f}"]
            for p in r["picks"]]
    return section(f"the shipped pair's record replayed on each device's prices ({r['prompts']} prompts × "
                   f"{r['max_new_tokens']}, {r['policies']:,} policies)",
                   ["prices", "pick", "policy", "predicted speedup", "tokens/round"], rows)


def timed(r: dict) -> str:
    inside = "predicted_in_decode" in r["rows"][0]
    rows = [[t["policy"], t["rounds"], f"{t['predicted_speedup']:.3f}",
             f"{t['measured_speedup']:.3f} [{t['low']:.3f}, {t['high']:.3f}]", f"{t['error']:+.1%}"]
            + ([f"{t['predicted_in_decode']:.3f}", f"{t['error_in_decode']:+.1%}"] if inside else [])
            for t in r["rows"]]
    within = f"{r['within_10pct']} of {len(r['rows'])} within ±10 %"
    if inside:
        within += f" on prices alone, {r['within_10pct_in_decode']} on prices in decode"
    return section(f"timed replay: the shipped pair's rounds on the priced pair's captured passes ({r['prompts']} "
                   f"prompts × {r['max_new_tokens']}; {within})",
                   ["policy", "rounds", "predicted speedup", "measured speedup [min, max over repeats]",
                    "predicted / measured − 1"] + (["predicted (in decode)", "− 1"] if inside else []), rows)


def batches(r: dict) -> str:
    rows = []
    for b, m in sorted(r["captured"].items(), key=lambda item: int(item[0])):
        for how, entry in (("captured", m), ("eager", r["eager"].get(b))):
            if entry:
                rows.append([b, how, ms(entry["t_draft"])] + [ms(t) for t in entry["t_verify"]])
    gamma = len(next(iter(r["captured"].values()))["t_verify"]) - 1
    return section(f"verify(k) and the draft step captured per (B, k) ({r['size']}, context {r['context_tokens']}; "
                   "ms, k + 1 tokens a row)", ["B", "passes", "t_draft", *(f"k={k}" for k in range(gamma + 1))], rows)


def speed(r: dict) -> str:
    rows = []
    for row in r["rows"]:
        interval = f" [{row['low']:.3f}, {row['high']:.3f}]" if row.get("low") is not None else ""
        speedup = "—" if row.get("speedup") is None else f"{row['speedup']:.3f}"
        tps = "—" if row.get("tokens_per_s") is None else f"{row['tokens_per_s']:.1f}"
        rows.append([row["batch_size"], row["decoder"], row["policy"], tps, speedup + interval,
                     row.get("tokens_per_round", "—"), row.get("identical", "—")])
    return section("speed: the shipped pair's decoders",
                   ["B", "decoder", "policy", "tokens/s", "speedup [95 % CI]", "tokens/round", "identical"], rows)

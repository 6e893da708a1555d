"""The report's words: the one-screen summary (best against classic and autoregressive, the
cost model's accuracy, the environment) as blocks, and blocks rendered as Markdown or HTML."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from dspark_bench import objectives
from dspark_bench.reporting import plots
from dspark_bench.reporting.depth_tables import depth_blocks
from dspark_bench.reporting.report_inputs import SUMMARY_METRICS, Inputs, best_and_classic, section_blocks
from dspark_bench.results import describe_machine, evaluation_of
from dspark_bench.sections.base import AFTER_DRAFTERS, SUMMARY_HEAD
from dspark_bench.sections.sampling import Sampling

# --- the summary -------------------------------------------------------------------------------


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)) or value is pd.NA:
        return "—"
    if isinstance(value, (float, np.floating)):
        return f"{value:.{digits}f}"
    return str(value)


def _speedup_cell(row: pd.Series) -> str:
    if pd.notna(row.get("speedup")):
        low, high = row.get("speedup_low"), row.get("speedup_high")
        interval = f" [{low:.2f}, {high:.2f}]" if pd.notna(low) and pd.notna(high) else ""
        return f"{row['speedup']:.2f}×{interval}"
    return "—"


def _policy_line(role: str, row: pd.Series | None, several: bool) -> list[str]:
    if row is None:
        return [role, "none measured"] + ["—"] * (3 + len(SUMMARY_METRICS))
    label = str(row["config_label"]) + (f" ({plots.short_run(row['run_id'])})" if several else "")
    predicted = row.get("predicted_speedup")
    return [role, label, _speedup_cell(row), _fmt(predicted, 2) if predicted is not None else "—",
            _fmt(row.get("spec_tokens_per_s"), 1)] + [_fmt(row.get(m)) for m in SUMMARY_METRICS]


def health_blocks(inputs: Inputs) -> list[tuple]:
    """Each run's timing health (harness.health), said first when a run's timings are not ok."""
    rows = []
    for run_id, summary in inputs.summaries.items():
        health = summary.get("timing_health")
        if health:
            rows.append([plots.short_run(run_id), health["verdict"],
                         "; ".join(f"{c['name']} {c['verdict']}" for c in health["checks"]), health["headline"]])
    if not rows:
        return []
    worst = [r for r in rows if r[1] != "ok"]
    lead = ("Timing health: NOT OK. " + " ".join(f"{r[0]}: {r[3]}." for r in worst)) if worst else \
        "Timing health: ok in every run (the checks below found the machine quiet enough to trust the timings)."
    return [("p", lead), ("table", ["run", "verdict", "checks", "headline"], rows)]


def summary_blocks(inputs: Inputs) -> list[tuple]:
    """The one-screen summary: best vs classic vs autoregressive, cost model, environment."""
    policies, objective = inputs.policies, inputs.column
    best, classic = best_and_classic(inputs)
    several = policies["run_id"].nunique() > 1
    header = ["", "configuration", "speedup [95% CI]", "predicted_speedup", "tokens/s"] + list(SUMMARY_METRICS)
    rows = [_policy_line("best", best, several), _policy_line("classic (best fixed γ)", classic, several),
            ["autoregressive", "target alone", "1.00×", "1.00", _fmt(_baseline_rate(best), 1), "1.000", "—", "0.000",
             "—", "0.000"]]
    blocks: list[tuple] = [("h2", "Summary"), *section_blocks(inputs, SUMMARY_HEAD), ("table", header, rows)]
    ranked = {"speedup": "measured speedup", "predicted_speedup": "predicted_speedup (cost model)",
              "tokens_per_round": "tokens_per_round (no timing)"}.get(objective, objective)
    text = f"Configurations ranked by {ranked} over {len(plots.complete(policies))} configurations or trials."
    if best is not None and classic is not None and pd.notna(best.get(objective)) and pd.notna(classic.get(objective)):
        text += (f" The best confidence-scheduled policy reaches {best[objective]:.2f}× against "
                 f"{classic[objective]:.2f}× for the best fixed gamma ({best[objective] / classic[objective]:.2f}× "
                 "relative).")
    elif classic is None:
        text += " No fixed-gamma (classic) configuration is among the runs: add `--schedule fixed` to compare."
    text += _outputs_text(inputs, best)
    text += (" Speedup is the baseline's seconds per generated token over the speculative decoder's, on the same "
             "prompts in the same process, with a 95 % bootstrap interval over prompts.")
    if inputs.batch_size is not None:
        text += (f" This summary and the figures but the last are at batch size {inputs.batch_size}; the batch-size "
                 "section below compares every batch size the sweep searched.")
    if any(_settings_of(info).get("ignore_eos") for info in inputs.infos.values()):
        text += " Timed with EOS ignored: every sequence is exactly max_new_tokens long on both sides."
    blocks.append(("p", text))
    blocks += health_blocks(inputs)
    if several:
        per_run = []
        for run_id, part in policies.groupby("run_id", sort=False):
            b, c = best_and_classic(inputs, part)
            per_run.append([plots.short_run(run_id), _fmt(part["task"].iloc[0]),
                            b["config_label"] if b is not None else "—",
                            _fmt(b.get(objective), 2) if b is not None else "—",
                            c["config_label"] if c is not None else "—",
                            _fmt(c.get(objective), 2) if c is not None else "—"])
        blocks += [("h3", "Per run"), ("table", ["run", "task", "best", objective, "classic", objective], per_run)]
    blocks += depth_blocks(inputs)
    blocks += drafter_blocks(inputs)
    blocks += section_blocks(inputs, AFTER_DRAFTERS)
    blocks += literature_blocks(inputs)
    blocks += cost_model_blocks(inputs)
    blocks += environment_blocks(inputs)
    return blocks


def _outputs_text(inputs: Inputs, best: pd.Series | None) -> str:
    """How the outputs compare with the target's own: identical (greedy; why not, where some are
    not) or, sampled, each side's mean length and speed."""
    policies, text = inputs.policies, ""
    identical = policies.get("identical_to_baseline")
    if identical is not None and identical.notna().any():
        text += f" Outputs identical to the target's own: {identical.mean():.0%} of measured samples."
        share = policies.get("identical_share")
        dtypes = {(info.get("models") or {}).get("dtype") for info in inputs.infos.values()}
        if identical.mean() < 1 and dtypes <= {"float32"}:
            text += (" In fp32 every greedy output must be the target's own: a sample that differs is a bug, "
                     "please report it.")
        elif identical.mean() < 1 and share is not None and share.notna().any():
            text += (f" In {', '.join(sorted(d for d in dtypes if d))} a verify pass and a plain step can round a "
                     "near-tie differently, and the outputs part from there (see README); "
                     f"{share.mean():.1%} of tokens still match position for position.")
    elif best is not None and pd.notna(best.get("spec_mean_new_tokens")):
        text += (f" Sampled outputs differ by design; for the best configuration the mean sample length is "
                 f"{best['baseline_mean_new_tokens']:.1f} tokens (baseline) against {best['spec_mean_new_tokens']:.1f} "
                 f"(speculative), at {_fmt(best.get('baseline_tokens_per_s'), 1)} against "
                 f"{_fmt(best.get('spec_tokens_per_s'), 1)} tokens/s.")
    return text


def drafter_blocks(inputs: Inputs) -> list[tuple]:
    """Drafters side by side (runs or sweeps with several): each one's best policy, scheduled or
    fixed γ, by the runs' objective, and which to pick."""
    policies, objective = inputs.policies, inputs.column
    if "drafter" not in policies or policies["drafter"].nunique() < 2:
        return []
    best = {}
    for drafter, part in policies.groupby("drafter", sort=False):
        row = objectives.best(plots.complete(part), inputs.objective, objective)  # scheduled or fixed γ
        if row is not None:
            best[drafter] = row
    order = list(objectives.rank(pd.DataFrame(best.values()), inputs.objective, objective)["drafter"]) if best else []
    header = ["drafter", "best policy", "speedup [95% CI]", "predicted_speedup", "tokens_per_round",
              "acceptance_rate", "avg_draft_len", "identical"]
    rows = [[d, best[d]["config_label"], _speedup_cell(best[d]), _fmt(best[d].get("predicted_speedup"), 2),
             _fmt(best[d].get("tokens_per_round")), _fmt(best[d].get("acceptance_rate")),
             _fmt(best[d].get("avg_draft_len")), _fmt(best[d].get("identical_to_baseline"))] for d in order]
    return [("h2", "Drafters side by side"), ("table", header, rows), ("p", pick_drafter(best, order, objective))]


LITERATURE = Path(__file__).with_name("literature.yaml")


def literature_blocks(inputs: Inputs) -> list[tuple]:
    """For runs on a published benchmark (--task humaneval, mt-bench): what others report on it,
    marked as theirs."""
    tasks = {name for info in inputs.infos.values()
             for name in ((info.get("prompts") or {}).get("task") or "").split(",")}
    rows = [r for r in yaml.safe_load(LITERATURE.read_text()) if r["task"] in tasks]
    if not rows:
        return []
    text = ("Published results on these benchmarks, for orientation only: other people's models, hardware and "
            "software, not measured here; a CPU run of a small pair is not comparable to them. Sources in "
            "dspark_bench/reporting/literature.yaml.")
    header = ["benchmark", "method", "models", "hardware", "reported speedup", "source"]
    body = [[r["benchmark"], r["method"], r["models"], r["hardware"], r["speedup"], r["source"]] for r in rows]
    return [("h2", "What others report on these benchmarks"), ("p", text), ("table", header, body)]


def pick_drafter(best: dict, order: list[str], objective: str) -> str:
    """Which drafter to use, said with the uncertainty the measurements have."""
    if not order:
        return "No drafter has a measured result to compare."
    first = best[order[0]]
    text = f"Pick the {order[0]} drafter: its best policy reaches {first[objective]:.2f}× ({objective})"
    if len(order) < 2:
        return text + "."
    second = best[order[1]]
    text += f", against {second[objective]:.2f}× for {order[1]}"
    low, high = first.get("speedup_low"), second.get("speedup_high")
    if objective == "speedup" and pd.notna(low) and pd.notna(high) and low <= high:
        text += (f"; their intervals overlap ({first['speedup_low']:.2f}–{first['speedup_high']:.2f} against "
                 f"{second['speedup_low']:.2f}–{second['speedup_high']:.2f}), so on these prompts the two are within "
                 "noise: measure more prompts before choosing on speed alone")
    return text + ". The heads drafter needs no second model in memory; lookup needs no model at all."


def _settings_of(info: dict) -> dict:
    """The runner settings of a run (a sweep keeps them in its spec)."""
    return info.get("settings") or info.get("spec") or {}


def _baseline_rate(best: pd.Series | None):
    return best.get("baseline_tokens_per_s") if best is not None else None


def cost_model_blocks(inputs: Inputs) -> list[tuple]:
    blocks = []
    for run_id, summary in inputs.summaries.items():
        if evaluation_of(summary) != "replay":
            continue
        policies = inputs.policies
        if "source" not in policies:
            continue
        rows = policies[(policies["run_id"] == run_id) & (policies["source"] == "confirmed")]
        # Priced on an engine's costs (sweep --prices): our decoder confirmed, so it is judged on its own.
        column = ("predicted_speedup_ours"
                  if "predicted_speedup_ours" in rows and rows["predicted_speedup_ours"].notna().any()
                  else "predicted_speedup")
        lines = [[r["config_label"], _fmt(r["predicted_speedup"], 2), _fmt(r[column], 2), _speedup_cell(r),
                  _fmt(r["speedup"] / r[column], 2)] for _, r in rows.iterrows()]
        accuracy = summary.get("cost_model_accuracy") or {}
        cost = summary.get("cost_model") or {}
        sampling = Sampling.from_json(summary)
        sampled = "" if sampling is None else sampling.described()
        confirmed = (f"the best {len(rows)} confirmed by timed runs. Measured / predicted speedup, median "
                     f"{_fmt(accuracy.get('measured_over_predicted_median'), 2)}; mean absolute error "
                     f"{_fmt(accuracy.get('mean_abs_error'), 3)}." if len(rows)
                     else "nothing timed (--confirm-top 0): every speedup here is predicted, none measured.")
        simulated = summary.get("policies_simulated", len(rows))
        text = f"{simulated} policies simulated from one record{sampled}; {confirmed}"
        if sampling is not None and sampling.precision:
            text += " " + sampling.precision["sentence"]
        prices = (summary.get("prices") or {}).get("label", "our decoder")
        text += f" predicted_speedup is priced on {prices}'s costs" + (
            "; measured on our decoder, so judged against predicted_speedup_ours (our decoder's costs)."
            if column != "predicted_speedup" else ".")
        if cost:
            verify = ", ".join(f"{t * 1e3:.2f}" for t in cost.get("t_verify", []))
            first = cost.get("t_first_draft") or 0.0
            text += (f" Cost model: t_draft {cost['t_draft'] * 1e3:.2f} ms"
                     + (f" (a round's first draft step {first * 1e3:.2f} ms more)" if first else "")
                     + f", t_verify(k = 0..) {verify} ms")
            empty = cost.get("t_round_empty")
            per_token = cost.get("t_round_token") or 0.0
            text += (f", t_round {cost['t_round'] * 1e3:.2f} ms"
                     + (f" + {per_token * 1e3:.2f} ms a drafted token" if per_token else "")
                     + (f" ({empty * 1e3:.2f} ms where the draft came back empty)" if empty is not None else "")
                     + f", plain step {cost['t_plain'] * 1e3:.2f} ms." if cost.get("t_plain") else ".")
        where = f" ({plots.short_run(run_id)})" if len(inputs.summaries) > 1 else ""
        blocks += [("h3", f"Cost model accuracy{where}"), ("p", text)]
        if lines:
            blocks.append(("table", ["configuration", "predicted_speedup", "predicted on our decoder",
                                     "speedup [95% CI]", "measured / predicted"], lines))
    return blocks


def environment_blocks(inputs: Inputs) -> list[tuple]:
    rows = []
    for run_id, info in inputs.infos.items():
        env, models, prompts = info.get("environment") or {}, info.get("models") or {}, info.get("prompts") or {}
        kind = info.get("kind", "run") + (f" ({evaluation_of(info)})" if info.get("kind") == "sweep" else "")
        device = models.get("device", "—") + (f" · {env['cuda_device']}" if env.get("cuda_device") else "")
        versions = " ".join(f"{k} {env[k]}" for k in ("dspark_bench", "torch", "transformers", "optuna", "python")
                            if env.get(k))
        rows.append([plots.short_run(run_id), kind, f"{device} · {models.get('dtype', '—')}",
                     str(models.get("target", "—")), str(models.get("draft", "—")),
                     f"{prompts.get('task') or prompts.get('dataset') or '—'} ({prompts.get('count', '?')} prompts)",
                     describe_machine(env), versions, str(env.get("git_commit") or "—")])
    return [("h3", "Environment"),
            ("table", ["run", "kind", "device", "target", "draft", "task", "machine", "versions", "git"], rows)]


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: list[tuple]) -> str:
    out = []
    for block in blocks:
        kind = block[0]
        if kind in ("h1", "h2", "h3"):
            out.append("#" * int(kind[1]) + " " + block[1])
        elif kind == "p":
            out.append(block[1])
        elif kind == "table":
            header, rows = block[1], block[2]
            lines = ["| " + " | ".join(map(_md_cell, header)) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in rows]
            out.append("\n".join(lines))
        elif kind == "figure":
            _, title, path, _, caption = block
            out.append(f"![{title}]({path})\n\n{caption}")
        elif kind == "ul":
            out.append("\n".join(f"- {item}" for item in block[1]))
    return "\n\n".join(out) + "\n"


def _html_inline(text: str) -> str:
    # `code` spans are the only inline markup the report's paragraphs use.
    parts = html.escape(str(text)).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def to_html(blocks: list[tuple], title: str) -> str:
    body = []
    for block in blocks:
        kind = block[0]
        if kind in ("h1", "h2", "h3"):
            body.append(f"<{kind}>{_html_inline(block[1])}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{_html_inline(block[1])}</p>")
        elif kind == "table":
            # Headers are metric names: let them break after an underscore, never inside a word.
            head = "".join(f"<th>{_html_inline(h).replace('_', '_<wbr>')}</th>" for h in block[1])
            rows = "".join("<tr>" + "".join(f"<td>{_html_inline(c)}</td>" for c in row) + "</tr>" for row in block[2])
            # Each table in its own box: long cells wrap, and what still does not fit scrolls inside it.
            body.append(f'<div class="table-box"><table><thead><tr>{head}</tr></thead>'
                        f"<tbody>{rows}</tbody></table></div>")
        elif kind == "figure":
            _, fig_title, _, uri, caption = block
            body.append(f'<figure><img alt="{html.escape(fig_title)}" src="{uri}">'
                        f"<figcaption>{_html_inline(caption)}</figcaption></figure>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{_html_inline(i)}</li>" for i in block[1]) + "</ul>")
    style = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
             ".table-box{max-width:100%;overflow-x:auto;margin:0.5em 0}"
             "table{border-collapse:collapse;font-size:0.85em;max-width:100%}td,th{border:1px solid #ccc;"
             "padding:3px 6px;text-align:left;overflow-wrap:anywhere}th{background:#f3f3f3;overflow-wrap:normal}"
             "img{max-width:100%;height:auto}"
             "figure{margin:1em 0}figcaption{font-size:0.9em;color:#555}code{background:#f3f3f3;padding:0 3px}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")

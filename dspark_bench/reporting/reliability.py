"""The report's signal-reliability data: drafted tokens with their confidence and verdict (from a
replay record, with the learned signal held out by prompt, or from a trace), and the tables of
how well each signal predicts acceptance. ("Calibration" in this tool is the per-domain choice of
a policy, tuning/calibrate.py; how well a confidence reads as a probability is its reliability.)"""

from __future__ import annotations

import pandas as pd

from dspark_bench.analysis.signal_quality import held_out
from dspark_bench.config import LEARNED
from dspark_bench.decoding.goodput import load
from dspark_bench.errors import DsparkError
from dspark_bench.replay import learned, sampled
from dspark_bench.replay.record import resolve_record
from dspark_bench.replay.rounds import match_lengths
from dspark_bench.reporting import plots
from dspark_bench.reporting.report_inputs import Inputs, Skip


def acceptance_fit(inputs: Inputs):
    """The acceptance fit of a replay sweep among the runs (its goodput_model.json), or None."""
    for run_id in inputs.summaries:
        path = inputs.folder_of[run_id] / "goodput_model.json"
        if path.is_file():
            return load(str(path)).acceptance
    return None


def reliability_data(inputs: Inputs) -> tuple[pd.DataFrame, str] | None:
    """(drafted tokens with metric, confidence, accepted; where they come from), or None where
    the runs have neither a replay record nor a trace."""
    for run_id, summary in inputs.summaries.items():
        if summary.get("record"):
            folder = resolve_record(inputs.folder_of[run_id], summary["record"])
            if folder is not None:
                rec = sampled.load(folder)
                if rec.info.get("sampling"):  # every replicate's rounds; no learned signal (it reads drafted tokens)
                    rec = sampled.as_one(rec)
                    table = plots.confidences_from_record(rec.confidences, match_lengths(rec), rec.lengths)
                    return table, (f"sampled replay record of {plots.short_run(run_id)}: all metrics at every "
                                   f"rollout step of its replicates ({len(rec.lengths)} paths × coin draws)")
                table = plots.confidences_from_record(rec.confidences, match_lengths(rec), rec.lengths)
                table = pd.concat([table, learned_tokens(rec)], ignore_index=True)
                return table, (f"replay record of {plots.short_run(run_id)}: all metrics at every rollout step\n"
                               f"of {len(rec.lengths)} prompts, and the learned signal held out by prompt")
    if not inputs.rounds.empty and "confidences" in inputs.rounds:
        table = plots.confidences_from_rounds(inputs.rounds)
        return table, ("per-round trace: each configuration's own metric; tokens the schedule kept, so low "
                       "confidences are rare")
    return None


def learned_tokens(rec) -> pd.DataFrame:
    """The learned signal's held-out probability at every drafted token (analysis/signal_quality.py), as
    rows of the reliability table; none where the record cannot be held out (one prompt)."""
    try:
        tokens = learned.drafted(rec)
        probability = held_out(tokens)[LEARNED]
    except DsparkError:
        return pd.DataFrame()
    return pd.DataFrame({"metric": LEARNED, "confidence": probability, "accepted": tokens.accepted})


def signals_table(inputs) -> str:
    """The replay sweeps' held-out signal quality (analysis.json `signals`) as Markdown."""
    rows = [r for summary in inputs.summaries.values() for r in summary.get("signals") or []]
    if not rows:
        return ""
    lines = ["| signal | tokens | AUC | Brier | ECE |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['signal']} | {r['tokens']:,} | {r['auc']:.3f} | {r['brier']:.4f} | {r['ece']:.4f} |" for r in rows]
    return ("\n\nHeld out by prompt (GroupKFold, up to 5 folds): each raw metric made a probability by an isotonic "
            "fit on the other prompts, and `learned`, a logistic regression on every signal and the draft position "
            "(analysis/signal_quality.py):\n\n" + "\n".join(lines))


def fit_table(fit) -> str:
    rows = ["| metric | tokens | acceptance | Brier (fit) | Brier (raw) | ECE (fit) | ECE (raw) |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for metric, q in fit.quality.items():
        rows.append(f"| {metric} | {q['tokens']:,} | {q['mean_acceptance']:.3f} | {q['brier']:.4f} | "
                    f"{q['raw_brier']:.4f} | {q['ece']:.4f} | {q['raw_ece']:.4f} |")
    return "\n".join(rows)


def reliability_figure(inputs: Inputs):
    """Figure 4 and its caption: confidence against acceptance, each signal's fit and quality."""
    found = reliability_data(inputs)
    if found is None:
        raise Skip("no replay record (a replay sweep's) and no per-round trace (run --trace)")
    table, source = found
    if table.empty:
        raise Skip("no drafted tokens in the record or trace")
    fit = acceptance_fit(inputs)
    caption = (f"Source: {source}. A drafted token counts when every token before it in its round was accepted; "
               "y = share of those accepted, x = mean confidence of the bin. AUC: how well the metric alone "
               "separates accepted from rejected tokens (0.5 = chance).")
    if fit is not None:
        caption += (" Solid lines: the isotonic fit of acceptance the goodput schedule decides with (acceptance.py); "
                    "its Brier score and ECE are held out (fitted on half the prompts, scored on the other), beside "
                    "the raw confidence read as a probability.\n\n" + fit_table(fit))
    caption += signals_table(inputs)
    return plots.reliability(table, source=source, fit=fit), caption

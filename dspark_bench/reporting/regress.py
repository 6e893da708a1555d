"""Compare a run against a stored baseline, with tolerances: the CI regression verdict.

A baseline is a copy of a run folder's run.json, summary.json and samples.parquet (usually
`results/baselines/<name>/`). Two runs are compared only when they measured the same thing:
same model weights, prompts, policies and generation settings, dtype and device type;
otherwise the comparison is refused, never made quietly.

What is compared, per configuration:
- the policy metrics (avg_draft_len, acceptance_rate, block_acceptance_rate, tokens_per_round,
  identical_to_baseline): deterministic for a fixed pair, prompts and config, so they must
  match within a tight relative tolerance;
- the generated ids (their fingerprint), exactly, where outputs are deterministic (greedy
  verification in float32);
- the speedup, as a ratio current / baseline with a wide tolerance: wall-clock time is noisy,
  so a slower run is flagged rather than failed unless asked (`strict_speed`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from dspark_bench.config import with_defaults
from dspark_bench.errors import DsparkError
from dspark_bench.paired import compare_speedups
from dspark_bench.reporting.stored_runs import (
    BASELINE_FILES,
    DETERMINISTIC_METRICS,
    NotComparable,
    RunRecord,
    at_batch_sizes,
    baseline_folder,
    comparable,
    load_baseline,
    load_record,
    outputs_fingerprint,
    plan_rerun,
    rerun,
    summary_path,
    update_baseline,
    write_report,
)
from dspark_bench.results import check_writable, describe_machine

__all__ = ["BASELINE_FILES", "DETERMINISTIC_METRICS", "NotComparable", "RunRecord", "baseline_folder", "comparable",
           "compare", "load_baseline", "load_record", "outputs_fingerprint", "plan_rerun", "rerun", "summary_path",
           "update_baseline", "write_report"]

DEFAULT_TOLERANCE = 1e-6
DEFAULT_SPEED_TOLERANCE = 0.25


# ---------------------------------------------------------------------------------------------
# Comparison


@dataclass(frozen=True)
class Row:
    config: str  # the config's label
    metric: str
    baseline: float | str | None
    current: float | str | None
    change: str
    verdict: str  # "pass" | "fail" | "flag"


@dataclass
class Comparison:
    rows: list[Row]
    baseline: str = ""  # how the two runs are named in the report
    current: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(row.verdict == "fail" for row in self.rows)

    @property
    def flagged(self) -> bool:
        return any(row.verdict == "flag" for row in self.rows)

    def verdict(self) -> str:
        counts = {v: sum(row.verdict == v for row in self.rows) for v in ("pass", "fail", "flag")}  # "n/a" aside
        word = "FAIL" if self.failed else "PASS"
        detail = f"{counts['pass']} passed, {counts['fail']} failed, {counts['flag']} flagged"
        if self.failed:
            return f"**Verdict: {word}** — a deterministic metric or output changed ({detail})."
        if self.flagged:
            return f"**Verdict: {word}** — metrics unchanged; speed flagged for a look ({detail})."
        return f"**Verdict: {word}** — metrics unchanged ({detail})."

    def markdown(self) -> str:
        lines = ["## dspark-bench regression check", ""]
        if self.baseline or self.current:
            lines += [f"Baseline {self.baseline} · current {self.current}", ""]
        lines += ["| config | metric | baseline | current | change | verdict |", "|---|---|---:|---:|---:|---|"]
        for row in self.rows:
            cells = [row.config, f"`{row.metric}`", _cell(row.baseline), _cell(row.current), row.change, row.verdict]
            lines.append("| " + " | ".join(cells) + " |")
        lines += [""] + [f"- {note}" for note in self.notes] + ([""] if self.notes else []) + [self.verdict()]
        return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)


def _number(value) -> float:
    return float("nan") if value is None else float(value)


def metric_row(label: str, metric: str, old, new, tolerance: float) -> Row:
    """A deterministic metric: equal within a relative tolerance (NaN equals NaN: nothing drafted)."""
    old, new = _number(old), _number(new)
    if math.isnan(old) or math.isnan(new):
        same = math.isnan(old) and math.isnan(new)
        return Row(label, metric, old, new, "" if same else "changed", "pass" if same else "fail")
    same = math.isclose(new, old, rel_tol=tolerance, abs_tol=tolerance * 1e-6)
    change = f"{(new - old) / abs(old):+.2%}" if old else f"{new - old:+.6g}"
    return Row(label, metric, old, new, change, "pass" if same else "fail")


def speed_row(label: str, old, new, speed_tolerance: float, strict_speed: bool, paired_change=None) -> Row:
    """Speedup as a ratio current / baseline — paired on the prompts both runs timed where their
    samples are at hand (`paired_change`, a paired.Verdict), else of the two summaries; too slow
    is flagged (failed when strict)."""
    old, new = _number(old), _number(new)
    ratio = new / old if old and not math.isnan(old) else float("nan")
    change = f"×{ratio:.3f}"
    if paired_change is not None:
        ratio = paired_change.ratio
        change = (f"×{ratio:.3f} [{paired_change.low:.3f}, {paired_change.high:.3f}] paired over "
                  f"{paired_change.prompts} prompts")
    slow = not ratio >= 1.0 - speed_tolerance  # NaN counts as slow: nothing sound to compare
    verdict = ("fail" if strict_speed else "flag") if slow else "pass"
    return Row(label, "speedup", old, new, change, verdict)


def paired_speed(baseline: RunRecord, current: RunRecord, config_id: int, new_id: int):
    """The current speedup over the baseline's, paired per prompt (None without both runs' samples)."""
    if baseline.samples is None or current.samples is None:
        return None
    old = baseline.samples[baseline.samples["config_id"] == config_id]
    new = current.samples[current.samples["config_id"] == new_id]
    if old.empty or new.empty or "spec_time_s" not in old or "spec_time_s" not in new:
        return None
    try:
        return compare_speedups(new, old)
    except DsparkError:  # no prompt in common: the summaries' ratio
        return None


def fingerprint_row(label: str, old: str | None, new: str | None) -> Row:
    same = old is not None and old == new
    return Row(label, "outputs_fingerprint", old, new, "same" if same else "differs", "pass" if same else "fail")


def outputs_deterministic(run: dict, config: dict) -> bool:
    # Greedy in float32 gives the same ids on any machine; bf16/fp16 rounding may not.
    return float(config.get("temperature", 0.0)) == 0.0 and run["models"]["dtype"] == "float32"


def compare(
    baseline: RunRecord,
    current: RunRecord,
    tolerance: float = DEFAULT_TOLERANCE,
    speed_tolerance: float = DEFAULT_SPEED_TOLERANCE,
    strict_speed: bool = False,
) -> Comparison:
    """Every check of `current` against `baseline`, per configuration (runs must be comparable).

    A current run made at other batch sizes (`regress --batch-size`) holds each baseline policy
    once per batch size, in that order: its policy metrics and outputs must still match (a row's
    rounds do not depend on the batch under greedy verification, nor its samples on the batch
    under sampling), while its speedup, measured against another batch size's baseline, is not
    compared."""
    rows = []
    old_rows, new_rows = baseline.configs, current.configs
    old_configs, new_configs = baseline.run["configs"], current.run["configs"]
    for new_id in range(max(len(new_configs), len(old_configs))):
        config_id = new_id % len(old_configs)
        old, new = old_rows.get(config_id), new_rows.get(new_id)
        label = (new or old or {}).get("config_label", f"config {new_id}")
        if old is None or new is None:
            side = "baseline" if old is None else "current run"
            rows.append(Row(label, "summary", None, None, f"missing in {side}", "fail"))
            continue
        sizes = [with_defaults(c)["batch_size"] for c in (old_configs[config_id], new_configs[new_id])]
        if sizes[0] != sizes[1] and with_defaults(new_configs[new_id])["batch_quorum"] > 0:
            # The quorum rule makes a row's rounds depend on its batch: nothing to compare them with.
            rows.append(Row(label, "policy metrics", None, None,
                            f"batch_quorum at B={sizes[1]} against B={sizes[0]}: not compared", "n/a"))
        else:
            for metric in DETERMINISTIC_METRICS:
                rows.append(metric_row(label, metric, old[metric], new[metric], tolerance))
        # Lossless decoding: the share of outputs equal to the target's own must not move.
        if old.get("identical_to_baseline") is not None or new.get("identical_to_baseline") is not None:
            rows.append(metric_row(label, "identical_to_baseline", old.get("identical_to_baseline"),
                                   new.get("identical_to_baseline"), tolerance))
        if outputs_deterministic(baseline.run, old_configs[config_id]):
            rows.append(fingerprint_row(label, baseline.outputs.get(config_id), current.outputs.get(new_id)))
        if sizes[0] == sizes[1]:
            rows.append(speed_row(label, old["speedup"], new["speedup"], speed_tolerance, strict_speed,
                                  paired_speed(baseline, current, config_id, new_id)))
        else:
            rows.append(Row(label, "speedup", old["speedup"], new["speedup"],
                            f"B={sizes[1]} against B={sizes[0]}: not compared", "n/a"))
    notes = [f"tolerance {tolerance:g} (relative) on policy metrics; speedup (seconds per token, baseline over "
             f"speculative) below {1 - speed_tolerance:.2f}× the baseline's is "
             f"{'a failure' if strict_speed else 'flagged'}"]
    speed_moved = any(row.metric == "speedup" and row.verdict != "pass" for row in rows)
    suspect = machine_note(baseline.run, current.run, speed_moved)
    if suspect:
        notes.insert(0, suspect)
    noise = noise_note(current.summary, speed_moved)
    if noise:
        notes.insert(0, noise)  # before the code and before the machine: the run's own timings failed
    if current.run["settings"].get("ignore_eos"):
        notes.append("timed with EOS ignored: every sequence is exactly max_new_tokens long")
    return Comparison(rows, baseline.describe(), current.describe(), notes)


def noise_note(summary: dict, speed_moved: bool) -> str | None:
    """The current run's timing health, named as the first suspect when it was not ok."""
    health = summary.get("timing_health")
    if not health or health["verdict"] == "ok":
        return None
    lead = "first suspect: noise, not the code" if speed_moved else "speed compared, but"
    return f"{lead} — the current run's {health['headline']}"


# What a different machine changes: the speed, never the policy metrics.
MACHINE_KEYS = ("cpu", "cpu_cores", "torch_threads", "blas", "gpu")


def machine_note(baseline_run: dict, current_run: dict, speed_moved: bool) -> str | None:
    """Name a machine change as the first suspect when speed moved (and say when machines differ)."""
    old = (baseline_run.get("environment") or {}).get("machine")
    new = (current_run.get("environment") or {}).get("machine")
    if old is None:
        return ("speed moved, and the baseline does not record its machine (made before dspark-bench kept one): "
                "suspect a different machine first" if speed_moved else None)
    changed = [key for key in MACHINE_KEYS if old.get(key) != (new or {}).get(key)]
    if not changed:
        return "same machine as the baseline: a speed change is the code's, or noise" if speed_moved else None
    where = (f"baseline {describe_machine(baseline_run['environment'])}; "
             f"current {describe_machine(current_run.get('environment') or {})}")
    if speed_moved:
        return f"first suspect: the machine changed ({', '.join(changed)}: {where})"
    return f"the machine changed ({', '.join(changed)}: {where}); speed compared anyway"


# ---------------------------------------------------------------------------------------------
# The whole check, as `dspark-bench regress` runs it


def check_tolerances(tolerance: float, speed_tolerance: float) -> None:
    if tolerance < 0:
        raise DsparkError(f"--tolerance must be >= 0 (got {tolerance:g})")
    if not 0 <= speed_tolerance < 1:
        raise DsparkError(f"--speed-tolerance must be in [0, 1) (got {speed_tolerance:g})")


def check(baseline: Path, current: Path | None = None, out: Path = Path("results"),
          tolerance: float = DEFAULT_TOLERANCE, speed_tolerance: float = DEFAULT_SPEED_TOLERANCE,
          strict_speed: bool = False, report: Path | None = None, progress=None,
          batch_sizes: list[int] | None = None) -> tuple[Comparison, str]:
    """Compare `current` (a run folder), or a fresh re-run of the baseline's own benchmark, with
    the baseline; write the Markdown table to `report` (default: regress.md in the current run).
    With `batch_sizes` the re-run decodes every baseline policy at each of them instead.
    Returns the comparison and the report's text as written."""
    check_tolerances(tolerance, speed_tolerance)
    old = load_baseline(baseline)
    if current is None:
        check_writable(out)
        current = rerun(old.folder, out, progress, at_batch_sizes(plan_rerun(old), batch_sizes))
    new = load_record(current, "current run")
    reasons = comparable(old.run, new.run, batch_sizes)
    if reasons:
        raise NotComparable(reasons)
    comparison = compare(old, new, tolerance, speed_tolerance, strict_speed)
    path = write_report(report or new.folder / "regress.md", comparison.markdown())
    return comparison, path.read_text()


def update(baseline: Path, current: Path | None = None, out: Path = Path("results"), progress=None,
           force: bool = False) -> str:
    """Replace the baseline by `current`, or by a fresh re-run of the baseline's own benchmark;
    refused (unless `force`) when that run's timings were unreliable: a baseline's speed is what
    every later run is measured against."""
    target = baseline_folder(baseline)
    if current is None:
        if not summary_path(baseline).is_file():
            raise DsparkError(f"baseline {str(baseline)!r} does not exist yet; pass --current RUN to create it")
        check_writable(out)
        current = rerun(load_baseline(baseline).folder, out, progress)
    summary = load_record(current, "current run").summary
    if (summary.get("timing_health") or {}).get("verdict") == "unreliable" and not force:
        raise DsparkError(f"run {current}'s timings are unreliable ({summary['timing_health']['headline']}); "
                          "not making it the baseline — re-run on an idle machine, or pass --force")
    update_baseline(current, target, replace=True)
    return f"baseline {target} updated from run {current}"

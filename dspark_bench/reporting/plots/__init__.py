"""DataFrame -> matplotlib Figure. Nothing here reads or writes files; saving is the caller's.

Figures are built on the Agg canvas without pyplot, so they never pile up in pyplot's registry
and work the same in a script, a test or a notebook (where `display(fig)` shows them). Axis
labels are the metric names of docs/policy-and-metrics.md (`avg_draft_len`, `tokens_per_round`, `speedup`...).

Inputs are the tables of `dspark_bench.results`: `policies` = one row per configuration, trial
or simulated policy (`results.load`), `samples` = one row per prompt × configuration, `rounds` =
the per-round trace.

By module: what every figure shares (`base`), figures over policies (`policies`), over samples
and rounds (`samples`), of searches and calibration (`study`), against batch size (`batch`),
against context depth (`depth`), and each decoder's step costs (`prices`).
"""

# A record's drafted tokens with their verdicts: the acceptance fit's own extraction.
from dspark_bench.replay.acceptance import drafted_tokens as confidences_from_record
from dspark_bench.reporting.plots.base import (
                                     COLORS,
                                     CURVE_METRICS,
                                     THRESHOLD_SCHEDULES,
                                     best_row,
                                     complete,
                                     names_of,
                                     short_run,
)
from dspark_bench.reporting.plots.batch import batch_sizes, paired_ratios, signal_headroom
from dspark_bench.reporting.plots.depth import depth_axis
from dspark_bench.reporting.plots.policies import heatmap_value, speedup_heatmap, temperature_axis, threshold_curves
from dspark_bench.reporting.plots.prices import verify_curves
from dspark_bench.reporting.plots.samples import (
                                     confidences_from_rounds,
                                     draft_lengths_from_positions,
                                     position_acceptance,
                                     reliability,
                                     reliability_table,
                                     roc_auc,
                                     round_trace,
                                     speedup_by_group,
                                     stop_reasons,
)
from dspark_bench.reporting.plots.study import (
                                     domain_threshold_curves,
                                     optimization_history,
                                     param_importances,
                                     pareto_front,
)

__all__ = [
    "COLORS", "CURVE_METRICS", "THRESHOLD_SCHEDULES", "batch_sizes", "best_row", "complete",
    "confidences_from_record", "confidences_from_rounds", "depth_axis", "domain_threshold_curves",
    "draft_lengths_from_positions",
    "heatmap_value",
    "names_of", "optimization_history", "paired_ratios", "param_importances", "pareto_front", "position_acceptance",
    "reliability", "reliability_table", "roc_auc",
    "round_trace", "short_run", "signal_headroom", "speedup_by_group", "speedup_heatmap", "stop_reasons",
    "temperature_axis", "threshold_curves", "verify_curves",
]

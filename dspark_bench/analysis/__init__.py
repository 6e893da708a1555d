"""Analysis: studies of a finished replay record, not choices of a policy.

The oracle headroom, the most any stopping rule could win over the best fixed γ (`oracle`); how
good a signal the rules would need to take it (`signal_headroom`); how well each signal predicts
acceptance on prompts it never saw (`signal_quality`); and the three run on a sweep folder
(`analyze`: `dspark-bench analyze SWEEP`, `sweep --analyze`), written to its analysis.json, which
the report reads. A sweep answers "which policy, how sure"; these answer "why, and what more
could this pair give".

May import: `replay`, `decoding` and the core modules; never `harness`, `tuning`, `reporting`,
`engines` or `cli`.
"""

from dspark_bench.analysis.analyze import analyze, analyze_folder

__all__ = ["analyze", "analyze_folder"]

"""dspark-bench: confidence-scheduled speculative decoding, measured and tuned.

The core, beneath every layer: the words and knobs (`config`: DecodeConfig and its parts, each
knob declared once), the stopping rules, one object each (`schedules`), the metrics (`metrics`),
objectives and the one ranking (`objectives`), prompts (`prompts`), run folders and provenance
(`results`), the one error users see (`errors`), whether the hub is reachable (`hub`), context
depth and its buckets (`depth`), and the
paired comparison of two policies above them (`paired`). The layers, bottom up: `reference`,
`tasks`, `decoding`, `replay`, `analysis`, `harness`, `engines`, `tuning` and `reporting`, `cli`
(docs/architecture.md).
"""

__version__ = "0.1.0"

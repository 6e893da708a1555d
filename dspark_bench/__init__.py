"""dspark-bench: confidence-scheduled speculative decoding, measured and tuned.

The core, beneath every layer: the words (`config`: DecodeConfig and its parts), a knob declared
once with what it needs to have any effect (`knobs`), the stopping rules, one object each
(`schedules`), the metrics (`metrics`), objectives and the one ranking (`objectives`), run folders
and provenance (`results`), the one error users see (`errors`), context depth and its buckets
(`depth`), and the paired comparison of two policies above them (`paired`). The layers, bottom up:
`reference`, `tasks`, `decoding`, `replay`, `analysis`, `measure`, `harness`, `engines`, `sections`,
`tuning` and `reporting`, `cli` (docs/architecture.md).
"""

__version__ = "0.1.0"

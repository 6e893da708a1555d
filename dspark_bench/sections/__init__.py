"""Sections: a sweep's optional results, each one module with a typed result (a frozen dataclass)
that knows its JSON, its console rows and its report blocks, and the computation that makes it.

The depth search (`depth`), replay under load (`under_load`), the deployment engine's verdict
(`engine_verdict`), sampling precision (`sampling`), the analyses (`analyses`), the engines' own
controllers beside fixed γ and our best (`controllers`), and a run's
(`run --arrival-rate`) measured under load beside replay (`served`); what every
section shares (`base`) and the one list that registers them (`registry`), through which the sweep
composes summary.json, the console shows them and the report places them.

Below `tuning`, `reporting` and `cli`, which all import it; may import `engines`, `harness`,
`analysis`, `replay`, `decoding` and the core modules. This `__init__` imports nothing, so that the
command line's modules can read `base` without loading the sections' libraries.
"""

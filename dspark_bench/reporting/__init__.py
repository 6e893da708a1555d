"""Reporting: run folders turned into figures, a report and a CI verdict.

The report (`report`, its words in `text`, what it reads in `report_inputs`, its batch-size view in
`batch_sizes`, its depth view in `depth_tables`, its signal-reliability data and figure in `reliability`,
its temperature view in `temperatures`, its figure under load in `under_load`, the engines' controllers'
figure in `controllers`, published results in
`literature.yaml`), the figures (`plots`), and the regression benchmark (`regress`) against stored
baseline runs (`stored_runs`). A sweep's sections (`sections`) bring their own report blocks, which
the report places.

Beside `tuning`, not above it: neither imports the other. May import `sections`, `engines`, `harness`
(regress re-runs a stored run), `analysis`, `replay`, `decoding`, `tasks`, `reference` and the
core modules; never `tuning` or `cli`.
"""

"""Judging outputs: `parity` (the one output comparison), `tasks` (the task kinds and their
metrics), `gates` (verify's and release's thresholds), `equivalence` (a stage rebuilt on another
platform class), `training_quality` (a checkpoint by held-out quality), `conversion_check`
(deploy's parity of a conversion), `verify_report` (verify's outputs as deploy reads them)."""

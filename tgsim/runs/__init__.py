"""A user's runs, to look at and compare: read run directories (`read`), draw them (`plot`: `tgsim plot`)
and run a grid of configs into one directory (`sweep`: `tgsim sweep`, runs.csv)."""

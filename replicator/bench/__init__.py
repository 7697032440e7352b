"""The benchmark suite behind `make bench` (`python jobs/bench.py`).

One module per measurement (`serve`, `drain`, `initial_load`, `plain_append`, `steady_state`,
`memory`, `rollback`), each returning a frozen result; `suite` runs them in order for a preset,
`goals` judges the results and `report` formats them (a table on stdout, JSON on disk).
Benchmarks are measurements, not tests: nothing here asserts a speed.
"""

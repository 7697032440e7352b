"""Measurement: candidate Delta layouts of the mirror table, side by side in one Spark session.

Four layouts of the same rows (`DATA_SCHEMA`, deletion vectors and change data feed on, as the
real mirror; `--no-change-data-feed` measures the same without the feed, whose pre-images make a
MERGE read every file it touches):

- `vbucket`: partitioned by `vbucket` (one partition per vbucket);
- `groups16`: partitioned by the generated `vbucket_group = vbucket DIV 64` (16 at 1024);
- `unpartitioned`: no partitions, rows written sorted by vbucket;
- `clustered`: liquid clustering by `vbucket`, clustered by OPTIMIZE.

Each candidate is built from rows generated in Spark (appended in vbucket order), then takes
three MERGE batches shaped as the replicator's (80% updates, 10% inserts, 10% deletes over every
vbucket), a compaction, and a one-vbucket "rollback" MERGE. A scaling run then merges into
`groups16` and `unpartitioned` tables of growing size. Every measurement records the wall clock,
Delta's operationMetrics, the table's files and `os.getloadavg()` at its start and end.

    python -m replicator.bench.layouts --docs 200000 --work-dir DIR --output FILE.json

The candidates and the rows they are built from and changed with are in workload; building,
merging, compacting and the two runs (`measure_candidate`, `measure_scaling`) in runs; the
results, their printed tables and the JSON in report; the command line in __main__.

Benchmarks are measurements, not tests: nothing here asserts a speed.
"""

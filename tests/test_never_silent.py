"""A producer that misbehaves gets a loud, bounded answer, never a quiet stop (issue 27).

Against the embedded producer's fault modes: streams ended with OK although they were
open-ended, a source that lost changes under the same vbucket uuids, a source without
GET_ALL_VB_SEQNOS. Each run reopens, resyncs or fails with one line; the mirror ends equal to
the producer or the run ends with the error. (A frame refused on every connection is in
tests/dcp/test_client_sim.py: it fails at the client's reconnect deadline.)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from replicator.config import ReplicatorConfig
from replicator.dcp.protocol.events import StreamEndReason
from replicator.dcp.protocol.opcodes import Opcode
from replicator.errors import ReplicatorError, UnsupportedCommandError
from replicator.pipeline.replication import LOST_HISTORY_REASON
from replicator.pipeline.runner import run_replication
from replicator.sim.bucket import SimBucket, Upsert
from replicator.sim.cluster import SimCluster
from tests.mirror_check import assert_mirror_equals_bucket
from tests.replication_runs import BackgroundReplication, replicator_settings

pytestmark = pytest.mark.spark

VBUCKETS = 4


def settings(cluster: SimCluster, tmp_path: Path, **overrides: Any) -> ReplicatorConfig:
    values: dict[str, Any] = {
        "staging_dir": str(tmp_path / "staging"),
        "until_caught_up": False,
        "commit_interval_s": 0.5,
    }
    values.update(overrides)
    return replicator_settings(cluster, tmp_path / "mirror", **values)


def loaded_bucket(seed: int, docs: int = 120) -> SimBucket:
    bucket = SimBucket("fleet", num_vbuckets=VBUCKETS, seed=seed)
    bucket.apply_batch([Upsert(f"doc-{n}", {"n": n, "seed": seed}) for n in range(docs)])
    return bucket


def warnings_with(caplog: pytest.LogCaptureFixture, fragment: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records
        if r.levelno >= logging.WARNING and fragment in r.getMessage()
    ]


def test_unasked_stream_ends_are_reopened_and_lost_privileges_fail_the_run_loudly(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a producer without GET_ALL_VB_SEQNOS (a continuous run mirrors anyway and says the
    lag is unknown), every open-ended stream is ended with OK, twice, with changes between and
    after: without a reopen they would never reach the mirror. Then one stream ends because the
    user lost its privileges: the run fails with one line saying what to do."""
    caplog.set_level(logging.INFO, logger="replicator")
    bucket = loaded_bucket(seed=41)
    with SimCluster(bucket, nodes=2) as cluster:
        cluster.refuse_commands(Opcode.GET_ALL_VB_SEQNOS)
        config = settings(cluster, tmp_path)
        with BackgroundReplication(spark, config) as run:
            run.wait_for(lambda: dict(run.progress.committed) == bucket.high_seqnos(),
                         "the initial documents to be committed")
            for round_ in range(2):
                cluster.end_streams(StreamEndReason.OK)
                if round_ == 0:  # one warning line per 10 s: the second round's may not come
                    run.wait_for(lambda: bool(warnings_with(caplog, "did not ask to end")),
                                 "the unasked ends to be reported")
                bucket.apply_batch(
                    [Upsert(f"after-{round_}-{n}", {"n": n}) for n in range(40)]
                )
            run.wait_for(lambda: dict(run.progress.committed) == bucket.high_seqnos(),
                         "the changes made after the unasked ends to be committed")
            assert_mirror_equals_bucket(spark, config.target, bucket)

            cluster.end_streams(StreamEndReason.LOST_PRIVILEGES, [1])
            assert run.background.wait(60.0), "the run must end, not go on without vbucket 1"
            with pytest.raises(ReplicatorError) as failure:
                run.background.result()
    text = str(failure.value)
    assert text.startswith("vbucket 1: ") and "Data DCP Reader" in text and "\n" not in text
    lag_unknown = warnings_with(caplog, "lag is unknown")
    assert len(lag_unknown) == 1 and "GET_ALL_VB_SEQNOS" in lag_unknown[0], lag_unknown


def test_a_source_that_lost_changes_under_the_same_uuid_is_resynced_not_caught_up(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The producer comes back with less (and other) data in one vbucket and the same uuid:
    its high seqno is below the mirror's. The run must not call that caught up: it resyncs the
    vbucket from 0, records why, and the mirror ends equal to the producer."""
    bucket = loaded_bucket(seed=42)
    lossy = 2
    with SimCluster(bucket, nodes=1) as cluster:
        config = settings(cluster, tmp_path, until_caught_up=True)
        run_replication(config, spark=spark)
        uuid_before = bucket.failover_log(lossy).newest.vbucket_uuid
        committed = bucket.high_seqnos()[lossy]
        cluster.lose_history(lossy, lose_last=10)
        other = bucket.keys_in_vbucket(lossy, 4, prefix="other")
        bucket.apply_batch([Upsert(key, {"other": True}) for key in other])
        assert bucket.high_seqnos()[lossy] < committed
        assert bucket.failover_log(lossy).newest.vbucket_uuid == uuid_before

        summary = run_replication(config, spark=spark)

    assert summary.caught_up and summary.full_resyncs == 1
    assert warnings_with(caplog, "lost changes without a failover")
    assert_mirror_equals_bucket(spark, config.target, bucket)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{config.target}`").collect()
    reasons = [str(row["userMetadata"]) for row in history if row["userMetadata"]]
    assert any(LOST_HISTORY_REASON in reason for reason in reasons), reasons


def test_until_caught_up_without_get_all_vb_seqnos_fails_before_spark_with_one_line(
    spark: Any, tmp_path: Path
) -> None:
    bucket = loaded_bucket(seed=43, docs=20)
    with SimCluster(bucket, nodes=2) as cluster:
        cluster.refuse_commands(Opcode.GET_ALL_VB_SEQNOS)
        config = settings(cluster, tmp_path, until_caught_up=True)
        with pytest.raises(UnsupportedCommandError) as failure:
            run_replication(config, spark=spark)
    text = str(failure.value)
    assert "\n" not in text
    assert text.startswith("127.0.0.1:"), text
    assert "GET_ALL_VB_SEQNOS" in text and "UNKNOWN_COMMAND" in text
    assert "run without it" in text
    # Refused in the source check: no table, no claim, no staging directory were made.
    assert not Path(config.target).exists()
    assert not (tmp_path / "staging").exists()

"""The demo (`make demo`) runs to completion, in a small size: mirror, live workload with a
failover, rollback, verify, analyst queries."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from replicator.demo import DemoConsole, run_demo

pytestmark = pytest.mark.spark


def test_demo_mirrors_rolls_back_verifies_and_leaves_the_table(
    spark: Any, tmp_path: Path
) -> None:
    output = io.StringIO()
    result = run_demo(
        output_dir=str(tmp_path / "demo"), docs=800, vbuckets=8, live_seconds=4,
        live_rate=150, spark=spark, console=DemoConsole(output),
    )
    text = output.getvalue()
    assert result == 0, text
    assert "EQUAL" in text
    assert "was rewound from seqno" in text, "the failover must force a visible rollback"
    assert "Time travel: 800 documents at version" in text
    assert (tmp_path / "demo" / "mirror" / "_delta_log").is_dir()

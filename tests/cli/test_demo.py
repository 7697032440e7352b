"""The demo (`make demo`, that is `replicator demo`) runs to completion, in a small size: mirror,
live workload with a failover, rollback, verify, analyst queries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replicator.cli.main import main

pytestmark = pytest.mark.spark


def test_demo_mirrors_rolls_back_verifies_and_leaves_the_table(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # In-process, the command's session builder finds and reuses the tests' Spark session.
    result = main([
        "demo", "--output", str(tmp_path / "demo"), "--docs", "800", "--vbuckets", "8",
        "--live-seconds", "4", "--live-rate", "150",
    ])
    text = capsys.readouterr().out
    assert result == 0, text
    assert "caught up: 800 changes" in text, "the initial load is summarised"
    assert "EQUAL" in text
    assert "was rewound from seqno" in text, "the failover must force a visible rollback"
    assert "Time travel: 800 documents at version" in text
    assert (tmp_path / "demo" / "mirror" / "_delta_log").is_dir()

"""The `replicator` command on a Drizzle source, in-process: produce, run, status, verify,
audit, and the clear errors of bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from replicator.cli.main import main


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_produce_run_status_verify_audit_and_a_tampered_mirror(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log, root = tmp_path / "transaction.log", tmp_path / "mirror"
    code, out, _ = _main(
        capsys, "sim-drizzle", "--log", str(log), "--transactions", "25", "--bulk-rows", "30"
    )
    assert code == 0 and "produced 25 transactions" in out
    source = f"drizzle-log://{log}"
    code, out, err = _main(
        capsys, "run", "--source", source, "--target", str(root), "--until-caught-up"
    )
    assert code == 0, err
    assert "committed" in out and "transactions" in out

    code, out, _ = _main(capsys, "status", "--target", str(root))
    assert code == 0 and "relational mirror of drizzle-log://" in out and "live tables" in out
    code, out, _ = _main(capsys, "status", "--target", str(root), "--json")
    status = json.loads(out)
    assert status["landed"] is True and status["last_group"] >= 1 and status["tables"]

    code, out, _ = _main(capsys, "verify", "--source", source, "--target", str(root))
    assert code == 0 and out.startswith("mirror equals the source"), out

    table = sorted(status["tables"])[0]
    code, out, _ = _main(capsys, "audit", "--target", str(root), "transactions", "--table", table,
                         "--json")
    commits = json.loads(out)
    assert code == 0 and commits and all(c["table"] == table for c in commits)
    assert [c["version"] for c in commits] == sorted(c["version"] for c in commits)

    # Tampering with a table is named, with the key of a row that went missing.
    schema, name = table.split(".")
    path = root / schema / name
    smallest = spark.read.format("delta").load(str(path)).agg({"id": "min"}).first()[0]
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = {smallest}")
    code, out, _ = _main(capsys, "verify", "--source", source, "--target", str(root))
    assert code == 1
    assert f"table {table}: 1 rows missing" in out and "missing (" in out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["run", "--source", "drizzle-log://relative/path", "--target", "/tmp/x",
          "--until-caught-up"], "absolute path"),
        (["run", "--source", "drizzle-log:///no/such/log", "--target", "/tmp/x",
          "--until-caught-up"], "does not exist"),
        (["verify", "--source", "drizzle+amqp://localhost/q", "--target", "/tmp/x"],
         "transaction log"),
        (["sim-drizzle"], "needs --log"),
    ],
)
def test_bad_input_is_one_clear_line(
    spark: Any, capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    code, _, err = _main(capsys, *argv)
    assert code == 2
    assert words in err and "Traceback" not in err
    assert err.count("\n") == 1

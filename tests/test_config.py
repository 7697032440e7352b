"""Settings precedence, validation and password handling."""

from __future__ import annotations

from pathlib import Path

import pytest

from replicator.config import ReplicatorConfig, Secret, VbucketSelection, load_config
from replicator.errors import ConfigError
from replicator.source import client_options


def write_toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "replicator.toml"
    path.write_text(text)
    return str(path)


def test_precedence_defaults_file_env_flags(tmp_path: Path) -> None:
    config_file = write_toml(
        tmp_path,
        '[replicator]\nsource = "couchbase://file/b"\ntarget = "/file"\ncommit_interval_s = 9\n'
        "memory_budget_mb = 64\n",
    )
    env = {"REPLICATOR_TARGET": "/env", "REPLICATOR_MEMORY_BUDGET_MB": "128"}
    config = load_config(
        config_file=config_file, env=env, flags={"memory_budget_mb": 512, "source": None}
    )
    assert config.source == "couchbase://file/b"  # file, flag not given
    assert config.target == "/env"  # env beats file
    assert config.memory_budget_mb == 512  # flag beats env
    assert config.commit_interval_s == 9.0  # file beats default
    assert config.noop_interval_s == ReplicatorConfig().noop_interval_s


def test_password_from_env_never_printed() -> None:
    config = load_config(env={"REPLICATOR_PASSWORD": "hunter2-secret"})
    assert config.resolved_password().value == "hunter2-secret"
    assert "hunter2" not in repr(config)
    assert "hunter2" not in str(config.resolved_password())


def test_password_from_file(tmp_path: Path) -> None:
    secret_file = tmp_path / "pw"
    secret_file.write_text("s3cret\n")
    config = load_config(env={"REPLICATOR_PASSWORD_FILE": str(secret_file)})
    assert config.resolved_password() == Secret("s3cret")


def test_password_refused_from_flags_and_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="never taken from flags"):
        load_config(env={}, flags={"password": "x"})
    config_file = write_toml(tmp_path, 'password = "x"\n')
    with pytest.raises(ConfigError, match="REPLICATOR_PASSWORD") as caught:
        load_config(config_file=config_file, env={})
    assert "'x'" not in str(caught.value)


def test_missing_password_says_where_to_put_it() -> None:
    with pytest.raises(ConfigError, match="REPLICATOR_PASSWORD"):
        load_config(env={}).resolved_password()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("commit_interval_s = 'soon'\n", "commit_interval_s"),
        ("memory_budget_mb = 1\n", "memory_budget_mb"),
        ("nonsense = 1\n", "unknown setting 'nonsense'"),
        ("progress = 'fancy'\n", "progress"),
        ("backfill_order = 'random'\n", "backfill_order must be one of round-robin, sequential"),
        ("first_load_writer = 'arrow'\n", "first_load_writer must be one of auto, spark"),
        ("steady_writer = 'dv'\n", "steady_writer must be one of spark, deletion-vectors"),
        ("vbuckets = '9-3'\n", "invalid vbuckets"),
        ("sasl_mechanism = 'CRAM-MD5'\n", "invalid sasl_mechanism"),
        ("sasl_mechanism = 512\n", "unknown SASL mechanism '512'"),
        ("[replicator\n", "not valid TOML"),
    ],
)
def test_invalid_values_named(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(config_file=write_toml(tmp_path, text), env={})


def test_vbucket_selection_shards_cover_all_once() -> None:
    parts = [VbucketSelection.parse(f"{i}/3").resolve(1024) for i in (1, 2, 3)]
    flat = [vb for part in parts for vb in part]
    assert sorted(flat) == list(range(1024))
    assert len(flat) == len(set(flat))
    assert VbucketSelection.parse("0-2,7").resolve(8) == (0, 1, 2, 7)
    with pytest.raises(ConfigError, match="do not exist"):
        VbucketSelection.parse("0-9").resolve(8)


def test_sasl_mechanism_from_file_env_and_flag_in_one_spelling(tmp_path: Path) -> None:
    assert load_config(env={}).sasl_mechanism is None  # unset: the strongest SCRAM offered
    config_file = write_toml(tmp_path, "sasl_mechanism = 'scram-sha-1'\n")
    assert load_config(config_file=config_file, env={}).sasl_mechanism == "SCRAM-SHA1"
    emptied = write_toml(tmp_path, "sasl_mechanism = ''\n")
    assert load_config(config_file=emptied, env={}).sasl_mechanism is None
    config_file = write_toml(tmp_path, "sasl_mechanism = 'scram-sha-1'\n")
    env = {"REPLICATOR_SASL_MECHANISM": "Scram_Sha_256"}
    assert load_config(config_file=config_file, env=env).sasl_mechanism == "SCRAM-SHA256"
    flagged = load_config(config_file=config_file, env=env, flags={"sasl_mechanism": "plain"})
    assert flagged.sasl_mechanism == "PLAIN"
    assert ReplicatorConfig(sasl_mechanism="scram-sha-512").sasl_mechanism == "SCRAM-SHA512"


@pytest.mark.parametrize("where", ["file", "env", "flag", "constructor"])
def test_bad_sasl_mechanism_names_the_valid_ones_and_not_the_password(
    tmp_path: Path, where: str
) -> None:
    env = {"REPLICATOR_PASSWORD": "hunter2-secret"}
    with pytest.raises(ConfigError) as caught:
        if where == "file":
            load_config(config_file=write_toml(tmp_path, "sasl_mechanism = 'md5'\n"), env=env)
        elif where == "env":
            load_config(env={**env, "REPLICATOR_SASL_MECHANISM": "md5"})
        elif where == "flag":
            load_config(env=env, flags={"sasl_mechanism": "md5"})
        else:
            ReplicatorConfig(password=Secret("hunter2-secret"), sasl_mechanism="md5")
    text = str(caught.value)
    assert text.startswith(
        "invalid sasl_mechanism (--sasl-mechanism): unknown SASL mechanism 'md5'"
    )
    assert "SCRAM-SHA512, SCRAM-SHA256, SCRAM-SHA1, PLAIN" in text
    assert "hunter2" not in text


def test_runs_ask_for_sequential_backfills_unless_configured() -> None:
    # Whole disk snapshots one after another: a first load commits while it streams.
    assert client_options(ReplicatorConfig(), tls=False).connection.backfill_order == "sequential"
    configured = load_config(env={"REPLICATOR_BACKFILL_ORDER": "round-robin"})
    assert client_options(configured, tls=False).connection.backfill_order == "round-robin"

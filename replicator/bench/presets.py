"""Sizes of one benchmark run: `default` (what `make bench` runs), `quick` and `smoke`."""

from __future__ import annotations

from dataclasses import dataclass

from replicator.errors import ConfigError


@dataclass(frozen=True, slots=True)
class BenchPreset:
    """How big each measurement is.

    `docs` x `doc_size` over `vbuckets` is the data set of the serve, drain, initial load,
    plain append and rollback measurements. `steady_runs` are the steady-state runs as
    (offered mutation rate, documents already mirrored, window in seconds), each window
    measured after the replicator caught up. `catch_up_docs` and `catch_up_changes` size the
    until-caught-up run: a mirror of that many documents, that many changes pending. The
    drain alternates with the Java DCP client's `drain_rounds` times each. The read-side
    commands are timed on the initial load's mirror grown to `read_side_versions` versions
    (`read_side_runs` times each, and with Spark `read_side_spark_runs` times, for comparison). The
    memory run mirrors one vbucket whose first snapshot is `memory_snapshot_factor` times
    `memory_budget_mb`; with `memory_alongside` it runs while
    the other measurements do, and `probe_jvm_options` go to the memory probe's JVM. Both are
    for `smoke` only, whose numbers are not compared: running alongside saves a JVM start's
    worth of wall time but disturbs every other figure, and a C1-only JIT
    (-XX:TieredStopAtLevel=1) halves a short run's JVM CPU but is not how production runs.
    Before the initial load, `jvm_warmup_vbuckets` of its vbuckets are loaded into a throwaway
    mirror and plainly appended, untimed (0: no warm-up): the initial load and the plain append
    it is compared with then both run on a JVM past its first compilations, instead of the
    load paying them for both (see `suite.warm_up_jvm`).
    """

    name: str
    docs: int
    doc_size: int
    vbuckets: int
    steady_runs: tuple[tuple[int, int, float], ...]
    steady_commit_interval_s: float
    memory_budget_mb: int
    memory_doc_size: int
    memory_snapshot_factor: int = 4
    rollback_changed_docs: int = 20
    catch_up_timeout_s: float = 120.0
    steady_warmup_catch_ups: int = 2
    memory_alongside: bool = False
    probe_jvm_options: str = ""
    catch_up_docs: int = 20_000
    catch_up_changes: int = 1_000
    drain_rounds: int = 2
    read_side_versions: int = 500
    read_side_runs: int = 3
    read_side_spark_runs: int = 1
    drizzle_transactions: int = 2_000
    jvm_warmup_vbuckets: int = 0

    def __post_init__(self) -> None:
        if self.docs < 1 or self.doc_size < 64:
            raise ConfigError(f"preset {self.name}: need docs >= 1 and doc_size >= 64")
        if not 1 <= self.vbuckets <= 1024:
            raise ConfigError(f"preset {self.name}: vbuckets must be 1..1024")
        if not self.steady_runs or min(min(run) for run in self.steady_runs) <= 0:
            raise ConfigError(f"preset {self.name}: steady_runs need positive rates and sizes")
        if self.steady_warmup_catch_ups < 1:
            raise ConfigError(f"preset {self.name}: steady_warmup_catch_ups must be >= 1")
        if self.read_side_versions < 2 or self.read_side_runs < 1:
            raise ConfigError(
                f"preset {self.name}: read_side_versions must be >= 2, read_side_runs >= 1"
            )
        if not 0 <= self.jvm_warmup_vbuckets < self.vbuckets:
            raise ConfigError(
                f"preset {self.name}: jvm_warmup_vbuckets must be 0..{self.vbuckets - 1}"
            )
        if self.drain_rounds < 1:
            raise ConfigError(f"preset {self.name}: drain_rounds must be >= 1")
        if self.memory_budget_mb < 8:
            raise ConfigError(f"preset {self.name}: memory_budget_mb must be at least 8")

    @property
    def memory_docs(self) -> int:
        """Documents in the memory run's single vbucket: `factor` x the budget in doc bytes."""
        budget = self.memory_budget_mb * 1024 * 1024
        return -(-self.memory_snapshot_factor * budget // self.memory_doc_size)


PRESETS: dict[str, BenchPreset] = {
    "default": BenchPreset(
        name="default",
        docs=1_000_000,
        doc_size=1024,
        vbuckets=1024,
        # The goals: 20,000/s on a million documents for 5 minutes, and 10,000/s on 200,000
        # documents for 30 minutes (the file-count goal's span).
        steady_runs=((10_000, 200_000, 1800.0), (20_000, 1_000_000, 300.0)),
        steady_commit_interval_s=2.0,
        memory_budget_mb=32,
        memory_doc_size=1024,
        catch_up_timeout_s=600.0,
        jvm_warmup_vbuckets=128,
    ),
    "quick": BenchPreset(
        name="quick",
        docs=100_000,
        doc_size=1024,
        vbuckets=64,
        steady_runs=((2_000, 10_000, 20.0), (5_000, 10_000, 20.0)),
        steady_commit_interval_s=2.0,
        memory_budget_mb=16,
        memory_doc_size=1024,
        read_side_versions=100,
        drizzle_transactions=600,
        jvm_warmup_vbuckets=8,
    ),
    "smoke": BenchPreset(
        name="smoke",
        docs=2_000,
        doc_size=256,
        vbuckets=8,
        steady_runs=((300, 200, 3.0),),
        steady_commit_interval_s=0.5,
        memory_budget_mb=8,
        memory_doc_size=4096,
        rollback_changed_docs=5,
        catch_up_timeout_s=120.0,
        steady_warmup_catch_ups=1,
        memory_alongside=True,
        probe_jvm_options="-XX:TieredStopAtLevel=1",
        catch_up_docs=200,
        catch_up_changes=50,
        jvm_warmup_vbuckets=1,
        drain_rounds=1,
        read_side_versions=6,
        read_side_runs=1,
        read_side_spark_runs=0,
        drizzle_transactions=60,
    ),
}


def preset_named(name: str) -> BenchPreset:
    """The preset called `name`; ConfigError naming the choices otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown benchmark preset {name!r}: choose one of {', '.join(PRESETS)}"
        ) from None

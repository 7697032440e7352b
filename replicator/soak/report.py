"""The figures of a crash loop run: what was killed, injected and checked, with nothing lost."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class CrashLoopReport:
    """What a crash loop did. It only exists if every check passed (else the loop raised)."""

    seed: int
    kills: int
    restarts: int
    graceful_stops: int
    kills_by_phase: Mapping[str, int]
    versions_checked: int
    failovers: int
    purges: int
    purged_vbuckets: int
    """Distinct vbuckets purged: each must have been resynced."""
    rollbacks_seen: int
    resyncs_seen: int
    rolled_back_vbuckets: int
    resynced_vbuckets: int
    changes_applied: int
    workload_ops: int
    documents_at_end: int
    elapsed_s: float
    run_seconds: tuple[float, ...] = field(default_factory=tuple)
    """How long each killed run lived, in order."""
    run_cpu_seconds: tuple[float, ...] = field(default_factory=tuple)
    """CPU seconds each killed run (Python and JVM) used: its cost whatever the machine's load."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (soak-output/latest.json)."""
        document = asdict(self)
        document["kills_by_phase"] = dict(self.kills_by_phase)
        document["run_seconds"] = [round(s, 2) for s in self.run_seconds]
        document["run_cpu_seconds"] = [round(s, 2) for s in self.run_cpu_seconds]
        document["elapsed_s"] = round(self.elapsed_s, 1)
        return document

    def render(self) -> str:
        """The figures as an aligned two-column table."""
        phases = ", ".join(f"{name} {count}" for name, count in sorted(self.kills_by_phase.items()))
        lines = [
            ("SIGKILLs survived", f"{self.kills} ({phases})"),
            ("restarts", str(self.restarts)),
            ("graceful stops", str(self.graceful_stops)),
            ("table versions checked", str(self.versions_checked)),
            ("failovers injected", str(self.failovers)),
            ("tombstone purges injected",
             f"{self.purges} ({_count(self.purged_vbuckets, 'vbucket')})"),
            ("rollbacks in table history", _commits_of(self.rollbacks_seen,
                                                       self.rolled_back_vbuckets)),
            ("full resyncs in table history", _commits_of(self.resyncs_seen,
                                                          self.resynced_vbuckets)),
            ("changes applied (exactly once)", str(self.changes_applied)),
            ("workload operations", str(self.workload_ops)),
            ("documents at the end", str(self.documents_at_end)),
            ("changes lost / duplicated", "0 / 0"),
            ("elapsed", f"{self.elapsed_s:.0f} s"),
            ("median killed run", f"{_median(self.run_seconds):.1f} s wall, "
             f"{_median(self.run_cpu_seconds):.1f} s CPU"),
        ]
        width = max(len(label) for label, _ in lines)
        return "\n".join(f"{label.ljust(width)}  {value}" for label, value in lines)


def _commits_of(commits: int, vbuckets: int) -> str:
    return f"{_count(commits, 'commit')}, {_count(vbuckets, 'vbucket')}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _median(values: tuple[float, ...]) -> float:
    return statistics.median(values) if values else 0.0


def write_report(report: CrashLoopReport, extra: Mapping[str, Any], path: str) -> None:
    """Write the figures (and `extra` sections, such as the fuzz figures) as JSON."""
    with open(path, "w", encoding="utf-8") as out:
        json.dump({"crash_loop": report.to_json(), **extra}, out, indent=2, sort_keys=True)
        out.write("\n")

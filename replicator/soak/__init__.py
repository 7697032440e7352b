"""Soak testing: the SIGKILL crash loop against the embedded producer, and its figures.

>>> from pathlib import Path
>>> from replicator.soak import CrashLoopSettings, run_crash_loop
>>> settings = CrashLoopSettings(work_dir=Path("soak"), kills=20)
>>> report = run_crash_loop(settings, spark)  # doctest: +SKIP
>>> print(report.render())  # doctest: +SKIP
"""

from replicator.soak.audit import MirrorAudit, MirrorViolation
from replicator.soak.loop import CrashLoopFailure, CrashLoopSettings, run_crash_loop
from replicator.soak.report import CrashLoopReport

__all__ = [
    "CrashLoopFailure",
    "CrashLoopReport",
    "CrashLoopSettings",
    "MirrorAudit",
    "MirrorViolation",
    "run_crash_loop",
]

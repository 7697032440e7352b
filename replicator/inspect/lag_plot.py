"""`replicator status --plot FILE.png`: a mirror's lag and commit rate, drawn.

Two panels: the changes committed per minute over the history the table still holds (from each
commit's metadata, as `commits.commit_activity` counts them), and, per vbucket, how far behind it
is: seqnos behind the producer with `--source`, otherwise the minutes since its last commit.
People would rather look at a lag curve than read 1024 rows. matplotlib is an optional
dependency (`pip install 'replicator[plot]'`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from replicator.errors import ConfigError
from replicator.inspect.formatting import format_time

if TYPE_CHECKING:
    from replicator.inspect.commits import CommitActivity
    from replicator.inspect.status import MirrorStatus


def changes_per_minute(activities: Sequence[CommitActivity]) -> list[tuple[datetime, int]]:
    """Source changes committed in each minute from the first commit to the last (pure).

    Minutes without a commit count 0, so the curve shows stalls as well as bursts.
    """
    counted = Counter[datetime]()
    for activity in activities:
        if activity.source_changes is not None:
            minute = activity.committed_at.replace(second=0, microsecond=0)
            counted[minute] += activity.source_changes
    if not counted:
        return []
    minute, last = min(counted), max(counted)
    series = []
    while minute <= last:
        series.append((minute, counted.get(minute, 0)))
        minute += timedelta(minutes=1)
    return series


def vbucket_lag(status: MirrorStatus) -> tuple[list[int], list[float], str]:
    """(vbuckets, lag values, what the values are) for the lower panel (pure)."""
    vbuckets = [vb.vbucket for vb in status.vbuckets]
    if status.with_source:
        return vbuckets, [float(max(vb.lag or 0, 0)) for vb in status.vbuckets], (
            "seqnos behind the source"
        )
    minutes = [
        (status.checked_at - vb.committed_at).total_seconds() / 60
        if vb.committed_at is not None else 0.0
        for vb in status.vbuckets
    ]
    return vbuckets, minutes, "minutes since the last commit"


def plot_status(
    status: MirrorStatus, activities: Sequence[CommitActivity], path: str | Path
) -> Path:
    """Draw `status` and the commit rate of `activities` into the PNG at `path`."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed: the figure only goes to a file
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(
            "--plot needs matplotlib: pip install 'replicator[plot]' (or matplotlib)"
        ) from None
    target = Path(path)
    if not target.parent.is_dir():
        raise ConfigError(f"cannot write the plot to {target}: {target.parent} is not a directory")
    figure, (rate_axes, lag_axes) = plt.subplots(2, 1, figsize=(11, 7), layout="constrained")
    series = changes_per_minute(activities)
    if series:
        rate_axes.plot([m for m, _ in series], [n for _, n in series], drawstyle="steps-post")
    rate_axes.set_title("changes committed per minute")
    rate_axes.set_ylabel("changes")
    vbuckets, values, meaning = vbucket_lag(status)
    lag_axes.bar(vbuckets, values, width=1.0)
    lag_axes.set_title(f"per vbucket: {meaning}")
    lag_axes.set_xlabel("vbucket")
    figure.suptitle(
        f"mirror of {status.bucket!r} at {status.target}, table version {status.table_version}, "
        f"{format_time(status.checked_at)}: {status.health.state}"
    )
    try:
        figure.savefig(target, format="png", dpi=100)
    except OSError as exc:
        raise ConfigError(f"cannot write the plot to {target}: {exc.strerror or exc}") from None
    finally:
        plt.close(figure)
    return target


__all__ = ["changes_per_minute", "plot_status", "vbucket_lag"]

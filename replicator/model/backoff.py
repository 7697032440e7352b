"""Retry pacing shared by both sides: DCP stream retries and reconnects, Delta commit conflicts.

Here, in the shared vocabulary, because the protocol side and the Delta side each retry and
neither may import the other.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from replicator.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential retry pacing, capped, with a deadline.

    `delay(n)` is the wait before attempt n+1 (n counts failures from 1). Jitter spreads
    retries of many clients: the delay is drawn from [delay/2, delay] when `jitter` is set.
    """

    initial: float = 0.1
    maximum: float = 10.0
    multiplier: float = 2.0
    deadline: float = 300.0
    """Give up once this many seconds have passed since the first failure."""
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial or self.multiplier < 1:
            raise ConfigError(
                f"backoff needs 0 < initial <= maximum and multiplier >= 1, got {self}"
            )
        if self.deadline <= 0:
            raise ConfigError(f"backoff deadline must be positive, got {self.deadline}")

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after the `failures`-th consecutive failure."""
        if failures < 1:
            raise ValueError(f"failures counts from 1, got {failures}")
        base = min(self.maximum, self.initial * self.multiplier ** min(failures - 1, 64))
        if not self.jitter:
            return base
        return (rng or random).uniform(base / 2, base)

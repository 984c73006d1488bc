"""How one attempt ended: the outcome table both SDKs share."""

from __future__ import annotations

import enum


class Outcome(str, enum.Enum):
    """How one attempt ended (the outcome table in the package README)."""

    SUCCESS = "SUCCESS"
    """2xx. The call is done."""
    TRANSIENT = "TRANSIENT"
    """5xx, 408, timeout, connection error. A breaker failure, charged to the retry budget."""
    RATE_LIMITED = "RATE_LIMITED"
    """429 that is not quota exhaustion. Neutral for the breaker, not charged."""
    SOURCE_DEAD = "SOURCE_DEAD"
    """401, 403, 429 insufficient_quota. Opens the source's breaker at once."""
    CLIENT_ERROR = "CLIENT_ERROR"
    """Any other 4xx. The call fails non_retryable."""
    CANCELLED = "CANCELLED"
    """The caller gave up. The call ends."""

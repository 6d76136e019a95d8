"""The real clock. Only the composition root and the local server use it; everything below the
handlers takes a ``Clock`` (querator.ports) so tests can pass ``querator.testing.FakeClock``."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc


class SystemClock:
    """Wall-clock time in UTC; ``sleep`` blocks the calling thread."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        # An Event wait rather than time.sleep: same effect, and it never raises on negative input.
        threading.Event().wait(max(0.0, seconds))

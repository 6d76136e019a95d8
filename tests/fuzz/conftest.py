"""The fuzz suites' server: ``querator serve`` in a child process with its own embedded store.

Its own, not the session's shared one: fuzzed requests create, change and delete queues with
generated names, which must not reach another suite's queues.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from querator.testing import serve_process
from tests.fuzz.api import QUEUE, Api

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(scope="session")
def api() -> Iterator[Api]:
    with serve_process() as url:
        client = Api(url)
        created = client.post(
            "queues.create",
            {"queue_name": QUEUE, "lease_timeout": "1m", "expire_timeout": "1h", "requested_partitions": 2},
        )
        assert created.status_code == 200, created.text
        yield client

"""The contract suite runs every behaviour against each store the tests can reach."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from moto import mock_aws

from querator.testing import build_service, dynamodb_client

if TYPE_CHECKING:
    from collections.abc import Iterator

    from querator.service import QueueService
    from querator.testing import FakeClock


@pytest.fixture(params=["moto", "moto_server"])
def service(request: pytest.FixtureRequest, clock: FakeClock) -> Iterator[QueueService]:
    if request.param == "moto":
        with mock_aws():
            yield build_service(dynamodb_client(), clock=clock)
    else:
        endpoint = request.getfixturevalue("moto_server")
        yield build_service(dynamodb_client(endpoint), clock=clock)

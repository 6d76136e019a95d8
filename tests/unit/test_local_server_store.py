"""The local server over its own embedded DynamoDB-compatible store (``--store dynamodb``)."""

from __future__ import annotations

import os
from unittest import mock

import pytest

from querator import bootstrap
from querator.config import EnvVar, load_settings
from querator.localserver import LocalServer


@pytest.mark.parametrize(("configured", "expected"), [(None, 29.0), ("7", 7.0)])
def test_the_handlers_wait_for_the_embedded_store_unless_told_otherwise(
    configured: str | None, expected: float
) -> None:
    # The embedded store answers one request at a time; a 5 s read timeout would have botocore send
    # applied conditional writes again under load. A setting of the user's own is kept. The server
    # sets the variables it needs in its process: patch.dict puts the environment back as it was.
    with mock.patch.dict(os.environ):
        for name in (EnvVar.STORE_READ_TIMEOUT, "AWS_ENDPOINT_URL_DYNAMODB", EnvVar.ITEMS_TABLE):
            os.environ.pop(name, None)
        if configured is not None:
            os.environ[EnvVar.STORE_READ_TIMEOUT] = configured
        load_settings.cache_clear()
        server = LocalServer(port=0, store="dynamodb", reaper_interval=3600)
        try:
            server.start()
            assert server.embedded_dynamodb
            assert bootstrap.get_client().meta.config.read_timeout == expected
        finally:
            server.stop()
            load_settings.cache_clear()

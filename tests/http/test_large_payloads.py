"""A 1 MiB item through ``querator serve`` over HTTP, on each store it serves: produced, listed,
leased, dead-lettered, redriven, exported (the storage listing) and completed; over the embedded
DynamoDB (``--store dynamodb``) the payload goes to the embedded payload bucket, which is empty once
the item is completed or deleted (docs/api.md, Large payloads)."""

from __future__ import annotations

import base64
import contextlib
import os
from typing import TYPE_CHECKING, Any
from unittest import mock

import pytest

from querator.config import EnvVar, load_settings
from querator.domain.model import MAX_PAYLOAD_BYTES
from querator.localserver import LocalServer
from querator.testing import s3_client
from tests.http.conftest import Http, decoded

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

BIG = b"big:".ljust(MAX_PAYLOAD_BYTES, b"-")


@contextlib.contextmanager
def served(store: str) -> Iterator[LocalServer]:
    with mock.patch.dict(os.environ):
        for name in ("AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_S3", EnvVar.PAYLOAD_BUCKET):
            os.environ.pop(name, None)
        load_settings.cache_clear()
        local = LocalServer(port=0, store=store, reaper_interval=3600).start()
        try:
            yield local
        finally:
            local.stop()
            load_settings.cache_clear()


def objects_left(local: LocalServer) -> list[str]:
    """The keys in the embedded payload bucket (none when the store keeps payloads in its rows)."""
    if not local.embedded_dynamodb:
        return []
    client = s3_client(os.environ["AWS_ENDPOINT_URL_S3"])
    reply = client.list_objects_v2(Bucket=os.environ[EnvVar.PAYLOAD_BUCKET])
    return [entry["Key"] for entry in reply.get("Contents", []) if "Key" in entry]


def listed(api: Http, queue: str) -> list[bytes]:
    return decoded(api.ok("/v1/storage/items.list", {"queue_name": queue}).get("items", []))


def lease(api: Http, queue: str) -> dict[str, Any]:
    return api.ok("/v1/queue.lease", {"queue_name": queue, "batch_size": 5, "client_id": "c"})


@pytest.fixture(params=["memory", "sqlite", "dynamodb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"sqlite:{tmp_path / 'q.db'}" if request.param == "sqlite" else request.param


def test_a_1_mib_item_goes_through_its_whole_life_and_leaves_no_object(store: str, queue_name: str) -> None:
    # moto's backends are one per process: each test's queues are its own.
    jobs, dlq = queue_name, f"{queue_name}-dlq"
    with served(store) as local:
        api = Http(local.url)
        for body in (
            {"queue_name": dlq, "lease_timeout": "1m", "expire_timeout": "2h"},
            {"queue_name": jobs, "lease_timeout": "1m", "expire_timeout": "1h", "dead_queue": dlq},
        ):
            api.ok("/v1/queues.create", body)
        encoded = base64.b64encode(BIG).decode()
        api.ok("/v1/queue.produce", {"queue_name": jobs, "items": [{"bytes": encoded}, {"utf8": "small"}]})
        assert listed(api, jobs) == [BIG, b"small"]
        assert len(objects_left(local)) == (1 if local.embedded_dynamodb else 0)

        first = lease(api, jobs)
        assert decoded(first["items"]) == [BIG, b"small"]
        big_id, small_id = (item["id"] for item in first["items"])
        retry = {
            "queue_name": jobs,
            "partition": first.get("partition", 0),
            "items": [{"id": big_id, "dead": True}],
        }
        api.ok("/v1/queue.retry", retry)
        api.ok(
            "/v1/queue.complete",
            {"queue_name": jobs, "partition": first.get("partition", 0), "ids": [small_id]},
        )
        assert listed(api, dlq) == [BIG]  # the export of a dead-letter queue is its listing

        assert api.ok("/v1/queue.redrive", {"queue_name": dlq})["moved"] == 1
        again = lease(api, jobs)
        assert decoded(again["items"]) == [BIG]
        assert len(objects_left(local)) == (1 if local.embedded_dynamodb else 0)
        api.ok(
            "/v1/queue.complete",
            {"queue_name": jobs, "partition": again.get("partition", 0), "ids": [again["items"][0]["id"]]},
        )

        api.ok("/v1/queue.produce", {"queue_name": jobs, "items": [{"bytes": encoded}]})
        waiting = api.ok("/v1/storage/items.list", {"queue_name": jobs})["items"]
        api.ok("/v1/storage/items.delete", {"queue_name": jobs, "ids": [waiting[0]["id"]]})

        assert listed(api, jobs) == [] and listed(api, dlq) == []
        assert objects_left(local) == []


def test_a_payload_over_1_mib_is_a_400_naming_the_item(store: str) -> None:
    with served(store) as local:
        api = Http(local.url)
        api.ok("/v1/queues.create", {"queue_name": "jobs", "lease_timeout": "1m", "expire_timeout": "1h"})
        over = base64.b64encode(BIG + b"!").decode()

        reply = api.post(
            "/v1/queue.produce", {"queue_name": "jobs", "items": [{"utf8": "ok"}, {"bytes": over}]}
        )

        assert reply.status == 400
        assert f"items[1]: item payload is larger than {MAX_PAYLOAD_BYTES} bytes" in reply.body["message"]
        assert listed(api, "jobs") == [] and objects_left(local) == []

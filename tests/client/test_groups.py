"""Item groups through the client: ``NewItem(group=)`` against ``querator serve`` (``.group`` on
what the lease and the listing return, kept on import), the wire bodies (no ``group`` key when
empty, so older servers take them), and bad groups refused with ``ValueError`` before anything is
sent, by the same rule as the server's."""

from __future__ import annotations

import pytest

from querator.client import Client, NewItem, StoredItem
from querator.client import models as client_models
from querator.domain import groups as domain_groups
from querator.domain.errors import InvalidRequestError

SAMPLES = ["", "acme", "tenant/ünïcode 🚀", "👨‍👩‍👧", "g" * 128, "g" * 129, "é" * 64, "é" * 65,
           "a\nb", "tab\t", "\x00", "\x7f", "\u2028", "\u2029", "\xa0nbsp"]  # fmt: skip


def test_the_clients_group_rule_is_the_servers() -> None:
    assert client_models.MAX_GROUP_BYTES == domain_groups.MAX_GROUP_BYTES
    for sample in SAMPLES:
        try:
            domain_groups.validate_group(sample)
            server_takes = True
        except InvalidRequestError:
            server_takes = False
        try:
            client_models.check_group(sample)
            client_takes = True
        except ValueError:
            client_takes = False
        assert client_takes == server_takes, sample


@pytest.mark.parametrize("bad", ["g" * 129, "a\nb", 7])
def test_a_bad_group_raises_before_anything_is_sent(bad: object) -> None:
    with pytest.raises(ValueError, match="group"):
        NewItem(payload=b"x", group=bad)  # type: ignore[arg-type]


def test_the_wire_body_has_a_group_only_when_there_is_one() -> None:
    assert "group" not in NewItem(payload=b"x").to_wire()
    assert NewItem(payload=b"x", group="acme").to_wire()["group"] == "acme"


def test_groups_come_back_on_lease_and_listing_and_survive_an_import(client: Client, queue_name: str) -> None:
    client.create_queue(queue_name, lease_timeout="30s", expire_timeout="1h")
    client.produce(queue_name, [NewItem(payload=b"a", group="acme"), b"b"])

    listed = client.list_items(queue_name)
    lease = client.lease(queue_name, 10, request_timeout="1s")
    copy = f"{queue_name}-copy"
    client.create_queue(copy, lease_timeout="30s", expire_timeout="1h")
    client.import_items(copy, [StoredItem.from_wire(i.to_wire()) for i in listed])

    assert [(i.payload, i.group) for i in listed] == [(b"a", "acme"), (b"b", "")]
    assert [(i.payload, i.group) for i in lease.items] == [(b"a", "acme"), (b"b", "")]
    assert [(i.payload, i.group) for i in client.list_items(copy)] == [(b"a", "acme"), (b"b", "")]

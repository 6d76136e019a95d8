"""The stream protocol's message limits: what a subscribe may carry."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from querator.service.tickets import TicketSigner
from querator.stream import protocol


class OneKey:
    """A catalog holding one ticket key, as a store's would."""

    def stream_key(self, candidate: str | None) -> str | None:
        return "a-key-for-tests"


def test_a_ticket_of_a_queue_with_the_longest_name_is_taken() -> None:
    name = "q" * 512
    signer = TicketSigner(OneKey())  # type: ignore[arg-type]
    ticket = signer.issue(name, datetime(2026, 12, 2, tzinfo=UTC)).ticket
    assert len(ticket) > 512

    message = protocol.parse(
        json.dumps({"type": "subscribe", "queue_name": name, "credit": 1, "ticket": ticket})
    )

    assert message.ticket == ticket


def test_a_ticket_longer_than_any_issued_is_refused() -> None:
    text = json.dumps({"type": "subscribe", "queue_name": "q", "credit": 1, "ticket": "t" * 1025})
    with pytest.raises(protocol.ProtocolError, match="ticket must be a string of at most 1024 characters"):
        protocol.parse(text)

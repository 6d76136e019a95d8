"""The client's copies of the stable error classes are the server's: the client ships without the
server, so it spells them out, and this test is what keeps the two spellings one."""

from __future__ import annotations

import inspect

import pytest

from querator.api.errors import STATUS_BY_ERROR, error_response, stable_class, status_for
from querator.client import errors as client_errors
from querator.domain import errors as domain_errors

#: Each stable class the client branches on, with the domain error that the server sends it for.
CLIENT_COPIES = {
    "QUEUE_NOT_FOUND": domain_errors.QueueNotFoundError,
    "QUEUE_EXISTS": domain_errors.QueueAlreadyExistsError,
    "ITEM_NOT_LEASED": domain_errors.ItemNotLeasedError,
    "DUPLICATE_CLIENT": domain_errors.DuplicateClientError,
    "IN_PROGRESS": domain_errors.RequestInProgressError,
}

DOMAIN_ERRORS = [
    klass
    for _, klass in inspect.getmembers(domain_errors, inspect.isclass)
    if issubclass(klass, domain_errors.QueratorError)
]


def test_every_client_constant_is_checked_here() -> None:
    constants = {
        name
        for name, value in vars(client_errors).items()
        if name.isupper() and isinstance(value, str) and not name.startswith("_")
    }
    assert constants == set(CLIENT_COPIES)


@pytest.mark.parametrize(("constant", "error"), CLIENT_COPIES.items(), ids=list(CLIENT_COPIES))
def test_the_client_copy_is_the_servers_stable_class(
    constant: str, error: type[domain_errors.QueratorError]
) -> None:
    # GIVEN the server's reply for the domain error
    reply = error_response(error("some details"))
    # WHEN the client decodes it
    decoded = client_errors.error_for(reply.status, reply.body)
    # THEN the stable class is the client's constant, and the client picks its narrower class for it
    assert getattr(client_errors, constant) == error.stable_class
    assert decoded.stable_class == error.stable_class
    assert type(decoded) is not client_errors.BadRequestError


@pytest.mark.parametrize("error", DOMAIN_ERRORS, ids=lambda e: e.__name__)
def test_every_domain_error_declares_its_own_stable_class_and_code(
    error: type[domain_errors.QueratorError],
) -> None:
    # Declared on the class itself, not inherited and not read from a docstring: editing a docstring
    # never changes the API.
    assert "stable_class" in vars(error)
    assert "code" in vars(error)
    assert stable_class(error) == error.stable_class
    assert ";" not in error.stable_class


def test_stable_classes_and_codes_are_unique() -> None:
    assert len({e.stable_class for e in DOMAIN_ERRORS}) == len(DOMAIN_ERRORS)
    assert len({e.code for e in DOMAIN_ERRORS}) == len(DOMAIN_ERRORS)


def test_every_domain_error_has_a_status() -> None:
    assert {status_for(e) for e in DOMAIN_ERRORS} <= set(STATUS_BY_ERROR.values())

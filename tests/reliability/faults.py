"""A fault injector at the store boundary: botocore hooks on the service's DynamoDB clients.

Faults are injected at ``before-call`` / ``after-call``, above botocore's own retries, so an injected
throttle is what the service sees once botocore has given up. Kinds:

- a DynamoDB error reply (``ProvisionedThroughputExceededException``, ``ThrottlingException``,
  ``InternalServerError``): botocore raises the same ``ClientError`` as for a real reply;
- a connection error before the request is sent (nothing happened in the store);
- a lost reply: the request is applied, then the reply times out (the ambiguous failure);
- a retried reply: the request is applied, its reply is lost, and botocore's own retry of it is
  what the caller sees (a conditional write's retry then finds its own effect; a transaction's
  retry answers as the first did, since DynamoDB keys it by its ``ClientRequestToken``);
- a Lambda timeout: the invocation is stopped dead at that call (a ``BaseException`` no code may
  catch), like a Lambda that hits its timeout between two writes.
"""

from __future__ import annotations

import copy
import enum
import functools
import itertools
from typing import TYPE_CHECKING, Any

from botocore.awsrequest import AWSResponse
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

if TYPE_CHECKING:
    from botocore.client import BaseClient

_ids = itertools.count()


class LambdaTimeout(BaseException):
    """The invocation ran out of time: nothing after this point runs, no handler can catch it."""


class Fault(enum.Enum):
    THROTTLED = "ProvisionedThroughputExceededException"
    THROTTLING = "ThrottlingException"
    INTERNAL = "InternalServerError"
    CONNECTION = "connection error"
    LOST_REPLY = "lost reply"
    RETRIED = "retried after applied"
    LAMBDA_TIMEOUT = "lambda timeout"


#: Operations DynamoDB makes idempotent by their ``ClientRequestToken`` (botocore fills it in and keeps
#: it across its retries).
IDEMPOTENT_BY_TOKEN = frozenset({"TransactWriteItems"})

_STATUS = {Fault.THROTTLED: 400, Fault.THROTTLING: 400, Fault.INTERNAL: 500}


class FaultInjector:
    """Counts the DynamoDB calls of the attached clients and fails the ``fail_at``-th (0-based)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail_at: int | None = None
        self.fault: Fault | None = None
        self.fired = False
        self.enabled = True
        self.fail_on: str | None = None
        self._tag = f"fault-injector-{next(_ids)}"

    def attach(self, client: BaseClient) -> None:
        before = functools.partial(self._before, client)
        client.meta.events.register("before-call.dynamodb", before, unique_id=f"{self._tag}-b")
        client.meta.events.register("after-call.dynamodb", self._after, unique_id=f"{self._tag}-a")

    def arm(self, fail_at: int | None, fault: Fault | None, *, operation: str | None = None) -> None:
        """Fail the ``fail_at``-th call, or with ``operation`` the first call of that operation."""
        self.calls = []
        self.fail_at, self.fault, self.fired, self.enabled = fail_at, fault, False, True
        self.fail_on = operation

    def disarm(self) -> None:
        self.enabled = False

    def _before(
        self, client: BaseClient, model: Any, params: dict[str, Any], context: dict[str, Any], **_: Any
    ) -> Any:
        if not self.enabled:
            return None
        index = len(self.calls)
        self.calls.append(model.name)
        if self.fail_on is not None and model.name == self.fail_on and not self.fired:
            self.fail_at = index
        context[self._tag] = index
        if index != self.fail_at or self.fault is None or self.fault is Fault.LOST_REPLY:
            return None
        self.fired = True
        if self.fault is Fault.RETRIED:
            return self._retried(client, model, params, context)
        if self.fault is Fault.LAMBDA_TIMEOUT:
            raise LambdaTimeout(f"stopped before {model.name}")
        if self.fault is Fault.CONNECTION:
            raise EndpointConnectionError(endpoint_url="http://dynamodb.invalid")
        status = _STATUS[self.fault]
        response = AWSResponse("http://dynamodb.invalid", status, {}, None)
        parsed = {
            "Error": {"Code": self.fault.value, "Message": "injected"},
            "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}},
        }
        return response, parsed

    @staticmethod
    def _retried(client: BaseClient, model: Any, params: dict[str, Any], context: dict[str, Any]) -> Any:
        """Send the request twice, as botocore does when the first reply is lost (the same
        serialized request, so the same ``ClientRequestToken``), and answer with the second reply.
        ``_make_request`` is what botocore's client itself calls at this point."""
        first = client._make_request(model, copy.deepcopy(params), context)  # type: ignore[attr-defined]
        if model.name in IDEMPOTENT_BY_TOKEN:
            return first  # DynamoDB answers a retried token as it answered the first; moto does not
        return client._make_request(model, copy.deepcopy(params), context)  # type: ignore[attr-defined]

    def _after(self, model: Any, context: dict[str, Any], **_: Any) -> None:
        if not self.enabled or self.fault is not Fault.LOST_REPLY:
            return
        if context.get(self._tag) == self.fail_at:
            self.fired = True
            raise ReadTimeoutError(endpoint_url="http://dynamodb.invalid")

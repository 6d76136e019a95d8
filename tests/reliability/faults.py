"""A fault injector at the store boundary: botocore hooks on the service's DynamoDB clients.

Faults are injected at ``before-call`` / ``after-call``, above botocore's own retries, so an injected
throttle is what the service sees once botocore has given up. Kinds:

- a DynamoDB error reply (``ProvisionedThroughputExceededException``, ``ThrottlingException``,
  ``InternalServerError``): botocore raises the same ``ClientError`` as for a real reply;
- a connection error before the request is sent (nothing happened in the store);
- a lost reply: the request is applied, then the reply times out (the ambiguous failure);
- a Lambda timeout: the invocation is stopped dead at that call (a ``BaseException`` no code may
  catch), like a Lambda that hits its timeout between two writes.
"""

from __future__ import annotations

import enum
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
    LAMBDA_TIMEOUT = "lambda timeout"

    @property
    def applied(self) -> bool:
        """Whether the faulted request itself reached the store and was applied."""
        return self is Fault.LOST_REPLY


_STATUS = {Fault.THROTTLED: 400, Fault.THROTTLING: 400, Fault.INTERNAL: 500}


class FaultInjector:
    """Counts the DynamoDB calls of the attached clients and fails the ``fail_at``-th (0-based)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail_at: int | None = None
        self.fault: Fault | None = None
        self.fired = False
        self.enabled = True
        self._tag = f"fault-injector-{next(_ids)}"

    def attach(self, client: BaseClient) -> None:
        client.meta.events.register("before-call.dynamodb", self._before, unique_id=f"{self._tag}-b")
        client.meta.events.register("after-call.dynamodb", self._after, unique_id=f"{self._tag}-a")

    def arm(self, fail_at: int | None, fault: Fault | None) -> None:
        self.calls = []
        self.fail_at, self.fault, self.fired, self.enabled = fail_at, fault, False, True

    def disarm(self) -> None:
        self.enabled = False

    def _before(self, model: Any, context: dict[str, Any], **_: Any) -> Any:
        if not self.enabled:
            return None
        index = len(self.calls)
        self.calls.append(model.name)
        context[self._tag] = index
        if index != self.fail_at or self.fault is None or self.fault is Fault.LOST_REPLY:
            return None
        self.fired = True
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

    def _after(self, model: Any, context: dict[str, Any], **_: Any) -> None:
        if not self.enabled or self.fault is not Fault.LOST_REPLY:
            return
        if context.get(self._tag) == self.fail_at:
            self.fired = True
            raise ReadTimeoutError(endpoint_url="http://dynamodb.invalid")

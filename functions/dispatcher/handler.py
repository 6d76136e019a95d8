"""Lambda entry point: the stream dispatcher, invoked by DynamoDB Streams of the items table (the
keys of rows written) and by an EventBridge schedule (the sweep for items ready by time).

It pushes leased items to the WebSocket connections subscribed to the queues written
(docs/adr/0091-stream-on-aws.md).
"""

from __future__ import annotations

from querator.observability import lambda_entry
from querator.stream.aws import dispatch_event, prepare

lambda_handler = lambda_entry(dispatch_event, correlation_id_path=None, prepare=prepare)

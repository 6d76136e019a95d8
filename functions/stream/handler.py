"""Lambda entry point: the WebSocket API's routes (``$connect``, ``$disconnect``, ``$default``).

A consumer subscribes with a credit and gets leased items pushed; it completes / retries / renews
over the same connection (docs/api.md, "Streaming"; docs/adr/0091-stream-on-aws.md).
"""

from __future__ import annotations

from aws_lambda_powertools.logging import correlation_paths

from querator.observability import lambda_entry
from querator.stream.aws import prepare, websocket_event

lambda_handler = lambda_entry(
    websocket_event, correlation_id_path=correlation_paths.API_GATEWAY_REST, prepare=prepare
)

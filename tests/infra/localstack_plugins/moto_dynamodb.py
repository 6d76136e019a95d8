"""LocalStack's DynamoDB and its streams served by the moto it bundles (``PROVIDER_OVERRIDE_DYNAMODB=moto``
and ``PROVIDER_OVERRIDE_DYNAMODBSTREAMS=moto``).

LocalStack's own DynamoDB provider forwards every call to DynamoDB Local, a Java server it downloads
on first use; this one hands every operation to moto's DynamoDB backend inside the LocalStack
process, as LocalStack does for the services it serves from moto. The streams go with the tables:
the stack's stream dispatcher reads the items table's stream, which only moto's DynamoDB writes.
Test code: LocalStack imports it through this folder's ``entry_points.txt`` when the deploy test puts
the folder on ``PYTHONPATH`` (``localstack`` is importable only there). Users with Docker run stock
LocalStack and need none of this.
"""

from __future__ import annotations

from localstack.aws.api.dynamodb import DynamodbApi
from localstack.aws.api.dynamodbstreams import DynamodbstreamsApi
from localstack.services.plugins import Service, aws_provider


class MotoDynamoDBProvider(DynamodbApi):
    """No operation of its own: moto answers every one."""


class MotoDynamoDBStreamsProvider(DynamodbstreamsApi):
    """No operation of its own: moto answers every one, from its DynamoDB's tables."""


@aws_provider(api="dynamodb", name="moto")
def dynamodb_moto() -> Service:
    from localstack.services.moto import MotoFallbackDispatcher  # noqa: PLC0415 - as LocalStack's own

    return Service.for_provider(MotoDynamoDBProvider(), dispatch_table_factory=MotoFallbackDispatcher)


@aws_provider(api="dynamodbstreams", name="moto")
def dynamodbstreams_moto() -> Service:
    from localstack.services.moto import MotoFallbackDispatcher  # noqa: PLC0415

    return Service.for_provider(MotoDynamoDBStreamsProvider(), dispatch_table_factory=MotoFallbackDispatcher)

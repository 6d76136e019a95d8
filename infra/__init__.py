"""The CDK app: one stack of the queue service (tables, layer, functions, API, reaper, monitoring).

``infra`` imports only names from the product (``querator.storage.dynamodb.schema``,
``querator.api.routes``, ``querator.config``); the product never imports ``infra``.
"""

"""The CDK app: one stack of the queue service (tables, layer, functions, API, reaper, monitoring).

``infra`` imports only names from the product (``querator.storage.dynamodb.schema``,
``querator.api.routes``, ``querator.config``); the product never imports ``infra``.
"""

from __future__ import annotations

import os

# jsii prints a page-wide banner on every start under Node 20 (past its end of life, still what the
# project's machines run); set before any module of this package imports aws_cdk.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

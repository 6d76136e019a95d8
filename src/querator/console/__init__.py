"""The web console: static pages that operate queues through the public HTTP API.

``querator serve`` serves it at ``/console``; ``querator console`` serves it on 127.0.0.1 and forwards
its API calls to a deployed stack, signed with the user's AWS credentials (``querator.console.proxy``).
The pages are a client like any other: they call ``POST /v1/...`` and nothing else (docs/console.md).
"""

"""HTTP wire layer: routes, request and response schemas, durations and timestamps, error → status.

Pure: nothing here talks to storage or to a server. Handlers, the local server, the OpenAPI document
and the CDK routes all read this package, so the wire rules (docs/api.md) live in one place.
"""

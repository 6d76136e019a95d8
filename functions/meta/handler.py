"""Lambda entry point: GET /health, /openapi.json, /docs (routes served: ``routes.for_function("meta")``)."""

from __future__ import annotations

from querator.api.gateway import build_app
from querator.api.routes import Function
from querator.bootstrap import get_service
from querator.config import load_settings
from querator.observability import lambda_entry

app = build_app(Function.META, service=get_service, settings=load_settings)
lambda_handler = lambda_entry(app.resolve, prepare=app.prepare)

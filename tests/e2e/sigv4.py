"""A minimal SigV4-signed JSON client over urllib, so the e2e suite depends on no client library.

Credentials and region come from the standard AWS chain (environment, profile, SSO …) via botocore.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import botocore.session
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

_REGION_IN_HOST = re.compile(r"\.execute-api\.([a-z0-9-]+)\.amazonaws\.com")


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any]


@dataclass(frozen=True)
class SignedApi:
    base_url: str
    region: str
    signer: SigV4Auth | None

    @classmethod
    def from_environment(cls, url: str) -> SignedApi:
        match = _REGION_IN_HOST.search(url)
        region = (
            os.environ.get("QUERATOR_E2E_REGION")
            or (match.group(1) if match else None)
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
            or "us-east-1"
        )
        credentials = botocore.session.Session().get_credentials()
        if credentials is None:
            raise RuntimeError("no AWS credentials: the API accepts SigV4-signed requests only")
        return cls(url.rstrip("/"), region, SigV4Auth(credentials, "execute-api", region))

    def unsigned(self) -> SignedApi:
        return SignedApi(self.base_url, self.region, None)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 30) -> Reply:
        url = self.base_url + path
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        request = AWSRequest(method=method, url=url, data=data, headers=headers)
        if self.signer is not None:
            self.signer.add_auth(request)
        signed_headers = dict(request.headers.items())
        # The URL is the operator's QUERATOR_E2E_URL (http for LocalStack, https for AWS).
        prepared = urllib.request.Request(url, data=data, headers=signed_headers, method=method)  # noqa: S310
        try:
            with urllib.request.urlopen(prepared, timeout=timeout) as response:  # noqa: S310
                return Reply(response.status, _json(response.read()))
        except urllib.error.HTTPError as error:
            return Reply(error.code, _json(error.read()))

    def post(self, path: str, body: dict[str, Any]) -> Reply:
        return self.call("POST", path, body)


def _json(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return {"raw": raw.decode(errors="replace")}
    return value if isinstance(value, dict) else {"value": value}

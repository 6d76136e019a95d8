"""Python client: HTTP transport over one urllib3 connection pool, with optional SigV4 signing.

The pool keeps connections alive across calls (and threads); it never retries by itself, because
whether a call may be repeated depends on the call, which only ``client.py`` knows. Errors say
whether the request could have reached the server (``ConnectionFailedError.sent``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

import urllib3
from urllib3.exceptions import ConnectTimeoutError, HTTPError, ReadTimeoutError

from querator.client.errors import ConnectionFailedError, QueratorClientError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from botocore.credentials import Credentials

#: The service name API Gateway checks in a SigV4 signature.
SIGV4_SERVICE: Final = "execute-api"
USER_AGENT: Final = "querator-python-client/0.1"


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    headers: Mapping[str, str]


class RequestSigner(Protocol):
    """Adds authentication headers to a request about to be sent."""

    def sign(self, method: str, url: str, headers: Mapping[str, str], body: bytes) -> dict[str, str]:
        """The headers to send (the given ones plus the signature)."""
        ...


class SigV4Signer:
    """Signs requests for an IAM-protected API Gateway (``execute-api``) with AWS Signature V4.

    Credentials come from botocore's usual chain (environment, profile, SSO, instance role) unless
    given; refreshable credentials are refreshed by botocore when they are read for each signature.
    """

    def __init__(
        self, region: str, credentials: Credentials | None = None, *, service: str = SIGV4_SERVICE
    ) -> None:
        if credentials is None:
            # Imported here: a client without signing should not pay for a botocore session.
            import botocore.session  # noqa: PLC0415

            credentials = botocore.session.Session().get_credentials()
        if credentials is None:
            raise QueratorClientError(
                "SigV4 signing is on but no AWS credentials were found "
                "(set AWS_ACCESS_KEY_ID / AWS_PROFILE, or pass credentials=)"
            )
        self._credentials = credentials
        self.region = region
        self.service = service

    def sign(self, method: str, url: str, headers: Mapping[str, str], body: bytes) -> dict[str, str]:
        from botocore.auth import SigV4Auth  # noqa: PLC0415
        from botocore.awsrequest import AWSRequest  # noqa: PLC0415

        request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
        SigV4Auth(self._credentials, self.service, self.region).add_auth(request)
        return {str(key): str(value) for key, value in request.headers.items()}


class Transport:
    """Sends one request and returns the reply, whatever its status; raises only when there is none."""

    def __init__(
        self,
        base_url: str,
        *,
        signer: RequestSigner | None = None,
        connect_timeout: float = 5.0,
        max_connections: int = 10,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._signer = signer
        self._connect_timeout = connect_timeout
        # block=False: a burst over max_connections opens extra connections instead of waiting; only
        # max_connections of them are kept alive afterwards.
        self._pool = urllib3.PoolManager(num_pools=4, maxsize=max_connections, block=False, retries=False)

    def send(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        read_timeout: float,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """Send ``method path`` and wait up to ``read_timeout`` seconds for the reply.

        Raises
        ------
        ConnectionFailedError
            No reply; ``sent`` is False only when the connection could not even be opened.
        """
        url = self.base_url + path
        all_headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if method != "GET":
            all_headers["Content-Type"] = "application/json"
        all_headers.update(headers or {})
        if self._signer is not None:
            all_headers = self._signer.sign(method, url, all_headers, body)
        try:
            response = self._pool.request(
                method,
                url,
                body=body if method != "GET" else None,
                headers=all_headers,
                timeout=urllib3.Timeout(connect=self._connect_timeout, read=read_timeout),
                redirect=False,
                preload_content=True,
            )
        except ConnectTimeoutError as exc:
            # Also NewConnectionError and NameResolutionError: no byte of the request left.
            raise ConnectionFailedError(
                f"cannot connect to {self.base_url}: {_reason(exc)}", sent=False
            ) from exc
        except ReadTimeoutError as exc:
            # The server may still be working on it (and may act on it).
            raise ConnectionFailedError(
                f"no reply from {self.base_url} within {read_timeout:g} s", sent=True, timed_out=True
            ) from exc
        except HTTPError as exc:
            # Dropped connections: the server may have acted on the request.
            raise ConnectionFailedError(f"no reply from {self.base_url}: {exc}", sent=True) from exc
        return Reply(
            status=response.status,
            body=response.data,
            headers={key.lower(): value for key, value in response.headers.items()},
        )

    def close(self) -> None:
        self._pool.clear()


def _reason(exc: BaseException) -> str:
    """The operating system's reason (``[Errno 111] Connection refused``) rather than urllib3's
    description of its connection object, when there is one."""
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, OSError) and cause.strerror:
        return f"[Errno {cause.errno}] {cause.strerror}"
    return str(exc)

"""``querator serve`` serves the console's files at /console beside the API, and only those."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from querator.console import assets


def fetch(url: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:  # noqa: S310 - 127.0.0.1 only
            return reply.status, dict(reply.headers.items()), reply.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers.items()), error.read()


@pytest.mark.parametrize(
    ("path", "file", "content_type"),
    [
        ("/console/", "index.html", "text/html"),
        ("/console", "index.html", "text/html"),
        ("/console/console.js", "console.js", "text/javascript"),
        ("/console/console.css", "console.css", "text/css"),
    ],
)
def test_the_console_files_come_from_the_package(
    served_url: str, path: str, file: str, content_type: str
) -> None:
    status, headers, body = fetch(served_url + path)
    assert status == 200
    assert headers["Content-Type"].startswith(content_type)
    assert headers["Content-Security-Policy"] == assets.SECURITY_HEADERS["Content-Security-Policy"]
    expected = assets.find("/console/" + ("" if file == "index.html" else file))
    assert expected is not None
    assert body == expected.body


def test_the_console_is_told_it_may_write_and_where_it_runs(served_url: str) -> None:
    status, _, body = fetch(served_url + "/console/config.json")
    assert status == 200
    assert b'"read_only": false' in body
    assert served_url.removeprefix("http://").encode() in body


def test_only_the_console_files_and_only_get(served_url: str) -> None:
    assert fetch(served_url + "/console/secrets.txt")[0] == 404
    assert fetch(served_url + "/console/", method="POST")[0] == 405
    # Outside /console nothing changed: an unknown path is still the contract's 501.
    assert fetch(served_url + "/consolex")[0] == 501

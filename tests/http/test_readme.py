"""The README's curl examples, run as written against a fresh ``querator serve``.

The only changes made to the commands: the port (the test's server picks a free one) and the
``<id from the lease>`` placeholders, filled with the ids the example's own lease returned. Each
command's output is checked against the ``# =>`` line under it.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from querator.localserver import DEFAULT_PORT
from querator.testing import serve_process

pytestmark = pytest.mark.server

README = Path(__file__).parents[2] / "README.md"


def readme_examples() -> list[tuple[str, str]]:
    """(command, expected) pairs from the curl-examples block, continuation lines joined."""
    block = README.read_text().split("<!-- curl-examples:start -->")[1].split("<!-- curl-examples:end -->")[0]
    lines = block.replace("\\\n", " ").splitlines()
    examples: list[tuple[str, str]] = []
    for number, line in enumerate(lines):
        if line.startswith("curl "):
            expected = lines[number + 1].removeprefix("# => ") if number + 1 < len(lines) else ""
            examples.append((line, expected))
    return examples


def test_the_readme_has_the_four_examples_the_issue_asks_for():
    commands = " ".join(command for command, _ in readme_examples())
    for path in ("/v1/queues.create", "/v1/queue.produce", "/v1/queue.lease", "/v1/queue.complete"):
        assert path in commands


def test_the_readme_curl_examples_work_as_written():
    with serve_process() as url:
        leased_ids: list[str] = []
        for example, expected in readme_examples():
            command = example.replace(f"http://127.0.0.1:{DEFAULT_PORT}", url)
            for leased_id in leased_ids:
                command = command.replace('"<id from the lease>"', json.dumps(leased_id), 1)
            assert "<id from the lease>" not in command, "the lease example returned too few ids"
            output = subprocess.run(  # noqa: S603 - the README's own commands, run by bash
                ["bash", "-c", command],  # noqa: S607 - bash from PATH, as a reader runs it
                capture_output=True,
                text=True,
                check=True,
                timeout=30,
            ).stdout
            reply = json.loads(output)
            if "/v1/queue.lease" in command:
                assert [item["bytes"] for item in reply["items"]] == ["aGVsbG8=", "d29ybGQ="]
                assert re.fullmatch(r"\{.*\"items\":\[.*\]\}", expected)
                leased_ids = [item["id"] for item in reply["items"]]
            else:
                assert reply == json.loads(expected), command

"""Invoke handlers the way Lambda would, from the built artifacts only (run by test_layer_runs.py).

Runs under the Lambda runtime's Python version with ``-S`` (no site-packages): ``sys.path`` is only
the function's folder (``/var/task``), the layer's ``python/`` (``/opt/python``) and a folder with the
runtime's SDK (``/var/runtime``), so a module the layer lacks fails here as it would in Lambda.
Reads ``{"functions_root", "layer", "runtime", "steps": [{"function", "event"}]}`` on stdin and
prints one ``RESULTS <json>`` line.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import uuid
from typing import Any

MARKER = "RESULTS "


class Context:
    """The parts of the Lambda context that the handlers and Powertools read."""

    def __init__(self, function_name: str, timeout_seconds: float) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = 512
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{function_name}"
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = self.log_stream_name = function_name
        self._deadline = time.monotonic() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def invoke(plan: dict[str, Any], function: str, event: dict[str, Any]) -> Any:
    folder = f"{plan['functions_root']}/{function}"
    sys.path[:] = [folder, plan["layer"], plan["runtime"], *plan["stdlib"]]
    spec = importlib.util.spec_from_file_location(f"handler_{function}", f"{folder}/handler.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.lambda_handler(event, Context(function, timeout_seconds=10))


def main() -> None:
    plan = json.load(sys.stdin)
    # The standard library only: sys.path[0] is this script's folder, and -S left out site-packages.
    plan["stdlib"] = [p for p in sys.path[1:] if p]
    results = [invoke(plan, step["function"], step["event"]) for step in plan["steps"]]
    sys.stdout.write(MARKER + json.dumps(results, default=str) + "\n")


if __name__ == "__main__":
    main()

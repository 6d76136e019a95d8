"""The runtime client of ``host_lambda.py``'s execution environments, run by the runtime's Python.

Started as ``python3.12 -S -u lambda_bootstrap.py`` in the function's unzipped code with the
environment LocalStack gives a function: ``sys.path`` is that code (``/var/task``), the runtime's
boto3 (``/var/runtime``, ``QUERATOR_LAMBDA_SDK``) and the standard library. It imports the handler
``_HANDLER`` names once, then loops as AWS's runtime interface client does: ``GET …/invocation/next``,
call the handler, ``POST …/response`` (or ``…/error`` with the exception). Standard library only.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
import urllib.request
from typing import Any

API = f"http://{os.environ['AWS_LAMBDA_RUNTIME_API']}/2018-06-01/runtime"


class Context:
    """The parts of the Lambda context that the handlers and Powertools read."""

    def __init__(self, request_id: str, function_arn: str, deadline_ms: int) -> None:
        self.function_name = os.environ["AWS_LAMBDA_FUNCTION_NAME"]
        self.function_version = os.environ.get("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        self.memory_limit_in_mb = int(os.environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128"))
        self.invoked_function_arn = function_arn
        self.aws_request_id = request_id
        self.log_group_name = os.environ.get("AWS_LAMBDA_LOG_GROUP_NAME", "")
        self.log_stream_name = os.environ.get("AWS_LAMBDA_LOG_STREAM_NAME", "")
        self._deadline_ms = deadline_ms

    def get_remaining_time_in_millis(self) -> int:
        return max(0, self._deadline_ms - int(time.time() * 1000))


def _post(path: str, body: Any) -> None:
    data = json.dumps(body, default=str).encode()
    request = urllib.request.Request(f"{API}/{path}", data=data, method="POST")  # noqa: S310 - loopback
    with urllib.request.urlopen(request, timeout=30):  # noqa: S310
        pass


def _error(exc: BaseException) -> dict[str, Any]:
    return {"errorMessage": str(exc), "errorType": type(exc).__name__,
            "stackTrace": traceback.format_tb(exc.__traceback__)}  # fmt: skip


def main() -> None:
    task_root = os.environ["LAMBDA_TASK_ROOT"]
    stdlib = [p for p in sys.path[1:] if p]
    sys.path[:] = [task_root, os.environ["QUERATOR_LAMBDA_SDK"], *stdlib]
    module_path, name = os.environ["_HANDLER"].rsplit(".", 1)
    try:
        handler = getattr(importlib.import_module(module_path.replace("/", ".")), name)
    except Exception as exc:
        traceback.print_exc()
        _post("init/error", _error(exc))
        raise SystemExit(1) from exc
    while True:
        with urllib.request.urlopen(f"{API}/invocation/next") as reply:  # noqa: S310 - loopback, no timeout
            event = json.loads(reply.read() or b"null")
            request_id = reply.headers["Lambda-Runtime-Aws-Request-Id"]
            context = Context(request_id, reply.headers["Lambda-Runtime-Invoked-Function-Arn"],
                              int(reply.headers["Lambda-Runtime-Deadline-Ms"]))  # fmt: skip
            os.environ["_X_AMZN_TRACE_ID"] = reply.headers.get("Lambda-Runtime-Trace-Id", "")
        try:
            result = handler(event, context)
        except Exception as exc:
            traceback.print_exc()
            _post(f"invocation/{request_id}/error", _error(exc))
        else:
            _post(f"invocation/{request_id}/response", result)


if __name__ == "__main__":
    main()

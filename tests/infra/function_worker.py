"""One deployed function, kept warm the way Lambda keeps an execution environment (run by deployment.py).

Started as ``python3.12 -S function_worker.py <task root> <layer python/> <runtime SDK>`` with the
environment the stack gave the function: ``sys.path`` is only the function's deployed asset
(``/var/task``), the layer's ``python/`` (``/opt/python``) and the runtime's SDK (``/var/runtime``), so a
module the layer lacks fails here as it would in Lambda. It imports the handler ``_HANDLER`` names once,
as the runtime does (the cold start, timed), then reads one JSON request a line on stdin and answers
one JSON line on the real stdout; what the function prints (Powertools' EMF metrics) is captured and
returned with the reply.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import sys
import time
import traceback
import uuid
from typing import Any


class Context:
    """The parts of the Lambda context that the handlers and Powertools read."""

    def __init__(self, timeout_seconds: float) -> None:
        self.function_name = os.environ["AWS_LAMBDA_FUNCTION_NAME"]
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = int(os.environ["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"])
        self.invoked_function_arn = os.environ["QUERATOR_TEST_FUNCTION_ARN"]
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = os.environ.get("AWS_LAMBDA_LOG_GROUP_NAME", "")
        self.log_stream_name = "worker"
        self._deadline = time.monotonic() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def main() -> None:
    task_root, layer, runtime = sys.argv[1:4]
    reply = sys.stdout
    stdlib = [p for p in sys.path[1:] if p]
    sys.path[:] = [task_root, layer, runtime, *stdlib]
    started = time.perf_counter()
    printed = io.StringIO()
    # As the runtime reads ``_HANDLER``: a module path (dots, or slashes for folders) and a name in it.
    module_path, name = os.environ["_HANDLER"].rsplit(".", 1)
    with contextlib.redirect_stdout(printed):
        handler = getattr(importlib.import_module(module_path.replace("/", ".")), name)
    init = {"ready": True, "import_seconds": time.perf_counter() - started, "stdout": printed.getvalue()}
    reply.write(json.dumps(init) + "\n")
    reply.flush()
    timeout = float(os.environ["QUERATOR_TEST_TIMEOUT_SECONDS"])
    for line in sys.stdin:
        request = json.loads(line)
        os.environ["_X_AMZN_TRACE_ID"] = f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]};Sampled=1"
        printed = io.StringIO()
        answer: dict[str, Any]
        started = time.perf_counter()
        try:
            with contextlib.redirect_stdout(printed):
                result = handler(request["event"], Context(timeout))
            answer = {"result": result}
        except Exception:
            answer = {"error": traceback.format_exc()}
        answer["seconds"] = time.perf_counter() - started
        answer["stdout"] = printed.getvalue()
        reply.write(json.dumps(answer, default=str) + "\n")
        reply.flush()
    # The end of the input: the environment is gone, as Lambda ends one (no interpreter teardown,
    # which took 27 workers seconds of the module's end).
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

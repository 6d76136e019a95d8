"""LocalStack's Lambda run as host processes (``LAMBDA_RUNTIME_EXECUTOR=host``), not Docker containers.

Stock LocalStack starts each execution environment as a container of the runtime's image, with its
Go init serving the Lambda runtime API inside. This executor serves that API itself, on 127.0.0.1 and
a port of its own per environment, and starts the function as a process of the runtime's Python
running ``lambda_bootstrap.py``: the runtime client's loop (``next``, then ``response`` or ``error``).
The process sees what a Lambda sandbox holds: the function's unzipped code (``/var/task``), the
runtime's boto3 (``/var/runtime``) and the standard library, nothing of the host's site-packages.

Which Python stands in for a runtime: ``QUERATOR_LAMBDA_PYTHON_3_12`` (for ``python3.12``) and the
folder with the runtime's boto3 in ``QUERATOR_LAMBDA_SDK_3_12``; a function of another runtime fails
to start, saying which variable is missing. Test code: LocalStack imports it through this folder's
``entry_points.txt`` when the deploy test puts the folder on ``PYTHONPATH``. Users with Docker run
stock LocalStack and need none of this.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from localstack import config
from localstack.services.lambda_.invocation.lambda_models import FunctionVersion, InvocationResult
from localstack.services.lambda_.invocation.plugins import RuntimeExecutorPlugin
from localstack.services.lambda_.invocation.runtime_executor import RuntimeExecutor

BOOTSTRAP = Path(__file__).with_name("lambda_bootstrap.py")
API = "/2018-06-01/runtime"
#: How long ``start`` waits for the function's first ``next`` (LocalStack's own startup timer, 20 s by
#: default, stops the environment sooner when it is shorter).
STARTUP_SECONDS = 60.0
#: As LocalStack's executor endpoint: the longest Lambda timeout and a margin.
INVOKE_SECONDS = 905.0


class _RuntimeApi(BaseHTTPRequestHandler):
    """The Lambda runtime API of one execution environment, for its one function process."""

    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: LocalStack's log has the invocations already."""

    def _answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        executor = self.server.executor
        if self.path != f"{API}/invocation/next":
            self._answer(404)
            return
        # The function's first ``next``: its handler is imported, the environment is ready.
        if not executor.ready.done():
            executor.ready.set_result(True)
        payload = executor.next_invocation()
        if payload is None:  # stopping: the process is about to be ended
            self._answer(410)
            return
        deadline_ms = int((time.time() + executor.timeout_seconds) * 1000)
        self._answer(
            200,
            payload["payload"].encode(),
            {
                "Content-Type": "application/json",
                "Lambda-Runtime-Aws-Request-Id": payload["invoke-id"],
                "Lambda-Runtime-Deadline-Ms": str(deadline_ms),
                "Lambda-Runtime-Invoked-Function-Arn": payload["invoked-function-arn"],
                "Lambda-Runtime-Trace-Id": payload["trace-id"],
            },
        )

    def do_POST(self) -> None:
        executor = self.server.executor
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        parts = self.path.removeprefix(API).strip("/").split("/")
        if parts == ["init", "error"]:
            if not executor.ready.done():
                executor.ready.set_exception(RuntimeError(f"the function's init failed: {body[:2000]!r}"))
            self._answer(202)
        elif len(parts) == 3 and parts[0] == "invocation" and parts[2] in {"response", "error"}:
            executor.finish(parts[1], body, is_error=parts[2] == "error")
            self._answer(202)
        else:
            self._answer(404)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    executor: HostRuntimeExecutor


class HostRuntimeExecutor(RuntimeExecutor):
    """One execution environment: a runtime API server and the function's process."""

    def __init__(self, id: str, function_version: FunctionVersion) -> None:
        super().__init__(id, function_version)
        self.ready: Future[bool] = Future()
        self.timeout_seconds = float(function_version.config.timeout)
        self._invocations: queue.Queue[dict[str, str] | None] = queue.Queue()
        self._pending: dict[str, Future[InvocationResult]] = {}
        # What the function prints goes to a file, not a pipe: it has flushed (``-u``) before it
        # posts its reply, so the file holds an invocation's output when the reply arrives, where a
        # thread reading a pipe could still be behind.
        descriptor, output = tempfile.mkstemp(prefix=f"lambda-{id}-", suffix=".log")
        os.close(descriptor)
        self._output = Path(output)
        self._output_offset = 0
        self._output_lock = threading.Lock()
        self._server: _Server | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def _python(self) -> tuple[str, str]:
        runtime = self.function_version.config.runtime or ""
        suffix = runtime.removeprefix("python").replace(".", "_")
        python_var, sdk_var = f"QUERATOR_LAMBDA_PYTHON_{suffix}", f"QUERATOR_LAMBDA_SDK_{suffix}"
        python, sdk = os.environ.get(python_var), os.environ.get(sdk_var)
        if not runtime.startswith("python") or not python or not sdk:
            raise RuntimeError(f"no host Python for runtime {runtime!r}: set {python_var} and {sdk_var}")
        return python, sdk

    def start(self, env_vars: dict[str, str]) -> None:
        python, sdk = self._python()
        code = self.function_version.config.code
        task_root = str(code.get_unzipped_code_location()) if code else ""
        self._server = _Server(("127.0.0.1", 0), _RuntimeApi)
        self._server.executor = self
        threading.Thread(
            target=self._server.serve_forever, name=f"runtime-api-{self.id}", daemon=True
        ).start()
        env = {k: str(v) for k, v in env_vars.items()}
        env.update(
            AWS_LAMBDA_RUNTIME_API=f"127.0.0.1:{self._server.server_address[1]}",
            LAMBDA_TASK_ROOT=task_root,
            QUERATOR_LAMBDA_SDK=sdk,
            PATH=os.environ.get("PATH", "/usr/bin:/bin"),
        )
        with self._output.open("ab") as output:
            self._process = subprocess.Popen(  # noqa: S603 - the runtime's Python and the bootstrap
                [python, "-S", "-u", str(BOOTSTRAP)],
                cwd=task_root or None,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        threading.Thread(target=self._watch, name=f"watch-{self.id}", daemon=True).start()
        self.ready.result(timeout=STARTUP_SECONDS)

    def _watch(self) -> None:
        process = self._process
        assert process is not None
        process.wait()
        # The process ended: a start still waiting, or an invocation in flight, fails now, not at
        # its timeout.
        failure = RuntimeError(
            f"the function's process exited with {process.wait()}: {self.get_logs()[-2000:]}"
        )
        if not self.ready.done():
            self.ready.set_exception(failure)
        for future in list(self._pending.values()):
            if not future.done():
                future.set_exception(failure)

    def next_invocation(self) -> dict[str, str] | None:
        return self._invocations.get()

    def finish(self, request_id: str, body: bytes, *, is_error: bool) -> None:
        future = self._pending.pop(request_id, None)
        if future is not None and not future.done():
            future.set_result(InvocationResult(request_id, body, is_error=is_error, logs=self._take_logs()))

    def _take_logs(self) -> str:
        with self._output_lock, self._output.open("rb") as output:
            output.seek(self._output_offset)
            logs = output.read()
            self._output_offset += len(logs)
        return logs.decode(errors="replace")

    def invoke(self, payload: dict[str, str]) -> InvocationResult:
        future: Future[InvocationResult] = Future()
        self._pending[payload["invoke-id"]] = future
        self._invocations.put(payload)
        return future.result(timeout=INVOKE_SECONDS)

    def stop(self) -> None:
        self._invocations.put(None)
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=5)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self._output.unlink(missing_ok=True)

    def get_address(self) -> str:
        return "127.0.0.1"

    def get_endpoint_from_executor(self) -> str:
        # The function reaches LocalStack where LocalStack listens (the gateway's host).
        return config.GATEWAY_LISTEN[0].host

    def get_runtime_endpoint(self) -> str:
        port = self._server.server_address[1] if self._server else 0
        return f"http://127.0.0.1:{port}"

    def get_logs(self) -> str:
        try:
            return self._output.read_text(errors="replace")
        except FileNotFoundError:  # stopped
            return ""

    @classmethod
    def prepare_version(cls, function_version: FunctionVersion) -> None:
        if function_version.config.code:
            function_version.config.code.prepare_for_execution()

    @classmethod
    def cleanup_version(cls, function_version: FunctionVersion) -> None:
        """Nothing to clean: LocalStack removes the unzipped code itself."""

    @classmethod
    def validate_environment(cls) -> bool:
        return sys.platform != "win32"


class HostRuntimeExecutorPlugin(RuntimeExecutorPlugin):
    name = "host"

    def load(self, *args: Any, **kwargs: Any) -> type[HostRuntimeExecutor]:
        return HostRuntimeExecutor

"""A consumer worker in its own process, for the SIGTERM test: ``worker_process.py URL QUEUE LOG``.

Writes ``start <payload>`` and ``ok <payload>`` lines to LOG (items ending in 0 take 5 s, the others
50 ms) and, when stopped, the ``WorkerReport`` as one JSON line on stdout.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from querator.client import Client, LeasedItem


def main() -> int:
    url, queue_name, log_path = sys.argv[1:4]
    lock = threading.Lock()
    log = open(log_path, "a", buffering=1)  # noqa: SIM115, PTH123 - line-buffered for the test to poll

    def write(kind: str, payload: str) -> None:
        with lock:
            log.write(f"{kind} {payload}\n")

    def handler(item: LeasedItem) -> None:
        payload = item.payload.decode()
        write("start", payload)
        time.sleep(5.0 if payload.endswith("0") else 0.05)
        write("ok", payload)

    with Client(url) as client:
        report = client.consume(
            queue_name, handler, concurrency=4, batch_size=4, shutdown_timeout=0.5, request_timeout=1.0
        )
    print(json.dumps(report.as_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The console's weight and time to first render on a 1,000-queue list; its screenshots for the docs.

    uv run python -m benchmarks.console [--queues 1000] [--runs 5] [--screenshots docs/console]

Starts ``querator serve`` (SQLite in a temporary directory), creates the queues through the API, and
opens the console in headless Chromium (Debian's, as the browser tests do). It prints:

- the console's own files (bytes, uncompressed: no CDN, nothing else is loaded);
- for the queue list: time from navigation to the first rows on screen (``first rows``) and to every
  visible row's counts filled in (``counts``), median of ``--runs`` cold loads, and the API calls the
  page made for it (one page of 25 queues: it never reads the other 975);
- with ``--screenshots DIR``: PNGs of the main pages, as docs/console.md shows them.

Timings are this machine's (2 cores, shared) against the local server, not a deployed stack.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from querator.client import Client, NewItem
from querator.console import assets
from querator.testing import serve_process

_FIRST_ROWS = "return document.querySelectorAll('tr[data-queue]').length > 0"
_COUNTS_DONE = (
    "const rows = [...document.querySelectorAll('tr[data-queue]')];"
    " return rows.length > 0 && rows.every(r => r.children[2].textContent !== '…');"
)


def browser() -> webdriver.Chrome:
    options = Options()
    options.binary_location = os.environ.get("CHROMIUM") or shutil.which("chromium") or "chromium"
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1366,900",
    ):
        options.add_argument(argument)
    os.environ["SE_OFFLINE"] = "true"
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver") or "chromedriver"
    return webdriver.Chrome(service=Service(driver), options=options)


def wait_for(driver: webdriver.Chrome, script: str) -> float:
    """Seconds until ``script`` returns true, polled every 5 ms."""
    started = time.perf_counter()
    WebDriverWait(driver, 60, poll_frequency=0.005).until(lambda d: d.execute_script(script))
    return time.perf_counter() - started


def measure_list(driver: webdriver.Chrome, url: str, runs: int) -> dict[str, float]:
    first_rows, counts, calls, transferred = [], [], [], []
    for _ in range(runs):
        driver.get("about:blank")
        started = time.perf_counter()
        driver.get(f"{url}/console/#/")
        wait_for(driver, _FIRST_ROWS)
        first_rows.append(time.perf_counter() - started)
        wait_for(driver, _COUNTS_DONE)
        counts.append(time.perf_counter() - started)
        entries = driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => [e.name, e.transferSize || 0]);"
        )
        calls.append(sum(1 for name, _ in entries if "/v1/" in name))
        transferred.append(sum(size for _, size in entries))
    return {
        "first_rows_ms": statistics.median(first_rows) * 1000,
        "counts_ms": statistics.median(counts) * 1000,
        "api_calls": statistics.median(calls),
        "bytes_after_page": statistics.median(transferred),
    }


def screenshots(driver: webdriver.Chrome, url: str, client: Client, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    client.create_queue("emails-dead", lease_timeout="1m", expire_timeout="24h")
    client.create_queue(
        "emails",
        lease_timeout="30s",
        expire_timeout="24h",
        max_attempts=3,
        dead_queue="emails-dead",
        requested_partitions=2,
    )
    client.produce(
        "emails",
        [
            NewItem(
                payload=f'{{"to": "user{n}@example.com", "template": "welcome"}}'.encode(),
                reference=f"signup-{n}",
            )
            for n in range(12)
        ],
    )
    client.produce(
        "emails",
        [
            NewItem(
                payload=b'{"to": "later@example.com"}',
                reference="digest",
                enqueue_at=datetime.now(timezone.utc) + timedelta(hours=2),
            )
        ],
    )
    leased = client.lease("emails", batch_size=3)
    failed = client.lease("emails", batch_size=2)
    client.retry("emails", failed.items, dead=True)
    pages = {
        "console-queues.png": "#/?pivot=emails",
        "console-queue.png": f"#/queue/emails?partition={leased.partition}",
        "console-item.png": f"#/queue/emails/item/{leased.partition}/{leased.items[0].id}",
        "console-dead-letters.png": "#/queue/emails-dead",
    }
    written = []
    for name, fragment in pages.items():
        driver.get("about:blank")
        driver.get(f"{url}/console/{fragment}")
        WebDriverWait(driver, 30).until(
            lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true"
        )
        time.sleep(0.5)  # let the first refresh fill the counts and the chart; a picture, not a test
        path = directory / name
        driver.save_screenshot(str(path))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--screenshots", type=Path, help="write PNGs of the main pages into this directory")
    args = parser.parse_args(argv)
    print(f"console files: {assets.total_size():,} bytes (index.html, console.js, console.css; no CDN)")
    with serve_process("--store", "memory") as url, Client(url) as client:
        if args.screenshots:
            for path in screenshots(driver := browser(), url, client, args.screenshots):
                print(f"wrote {path}")
            driver.quit()
        started = time.perf_counter()
        for n in range(args.queues):
            client.create_queue(f"q{n:05d}", lease_timeout="1m", expire_timeout="1h")
            if n % 10 == 0:
                client.produce(f"q{n:05d}", ["x"] * 5)
        print(f"created {args.queues} queues in {time.perf_counter() - started:.1f} s")
        driver = browser()
        try:
            figures = measure_list(driver, url, args.runs)
        finally:
            driver.quit()
    print(
        f"queue list of {args.queues} queues, median of {args.runs} cold loads: first rows"
        f" {figures['first_rows_ms']:.0f} ms, every visible row's counts {figures['counts_ms']:.0f} ms,"
        f" {figures['api_calls']:.0f} API calls, {figures['bytes_after_page']:,.0f} bytes transferred"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

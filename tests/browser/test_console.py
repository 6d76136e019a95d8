"""The console in a real (headless) browser against ``querator serve``: what it shows and every action.

Each test sets up queues and items through the API, acts through the page (click, type, confirm) and
checks the result through the API again: the console is a client, so the API is the judge.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pytest
from botocore.credentials import Credentials
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from querator.client import BadRequestError, Client, NewItem
from querator.console.proxy import ConsoleProxy
from tests.browser.pages import Page as PageType

if TYPE_CHECKING:
    from collections.abc import Iterator

    from selenium import webdriver

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def api(console_server: str) -> Iterator[Client]:
    with Client(console_server) as client:
        yield client


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def row_cells(page: PageType, queue: str) -> list[str]:
    row = page.element(f'tr[data-queue="{queue}"]')
    return [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]


#: The queue list's row of a queue as header -> {text, title}, read in one go (the page repaints the
#: cells one by one as it refreshes); null while the row is not drawn.
QUEUE_ROW = """
const table = document.querySelector('table[aria-label="Queues"]');
const row = table && table.querySelector(`tr[data-queue="${CSS.escape(arguments[0])}"]`);
if (!row) return null;
const headers = [...table.querySelectorAll("thead th")].map((th) => th.textContent);
const cell = (i) => ({text: row.cells[i].textContent, title: row.cells[i].title});
return headers.map((header, i) => [header, cell(i)]);  // pairs: an object's key order is lost
"""

#: Makes the page see an older server, one whose queue.stats and OpenAPI document have no `produced`
#: / `completed`: installed before the console's own script, it drops those keys from the replies.
OLDER_SERVER = r"""
(() => {
  const strip = (value) => {
    if (Array.isArray(value)) return value.map(strip);
    if (value === null || typeof value !== "object") return value;
    return Object.fromEntries(Object.entries(value)
      .filter(([key]) => key !== "produced" && key !== "completed").map(([key, v]) => [key, strip(v)]));
  };
  const original = window.fetch.bind(window);
  window.fetch = async (input, init) => {
    const response = await original(input, init);
    if (!/(\/v1\/queue\.stats|\/openapi\.json)$/.test(String(input))) return response;
    const body = strip(JSON.parse(await response.text()));
    const {status, statusText} = response;
    const headers = {"Content-Type": "application/json"};
    return new Response(JSON.stringify(body), {status, statusText, headers});
  };
})();
"""

#: Makes the page see a server from before fair delivery: queues.info and queues.list without
#: `delivery` / `max_leased_per_group`.
BEFORE_FAIR_DELIVERY = r"""
(() => {
  const original = window.fetch.bind(window);
  const strip = (info) => {
    const copy = {...info};
    delete copy.delivery;
    delete copy.max_leased_per_group;
    return copy;
  };
  window.fetch = async (input, init) => {
    const response = await original(input, init);
    if (!/\/v1\/queues\.(info|list)$/.test(String(input)) || !response.ok) return response;
    const body = JSON.parse(await response.text());
    const changed = body.items ? {...body, items: body.items.map(strip)} : strip(body);
    const {status, statusText} = response;
    const headers = {"Content-Type": "application/json"};
    return new Response(JSON.stringify(changed), {status, statusText, headers});
  };
})();
"""


def queue_row(page: PageType, queue: str) -> dict[str, dict[str, str]] | None:
    pairs = page.driver.execute_script(QUEUE_ROW, queue)
    return None if pairs is None else dict(pairs)


def sampled(page: PageType, queue: str, samples: int) -> dict[str, dict[str, str]] | None:
    """The row once its depth chart has drawn at least ``samples`` samples (the rates are written
    before the chart, from the same samples)."""
    row = queue_row(page, queue)
    if not row or "Depth" not in row:
        return None
    found = re.search(r"over the last (\d+) samples", row["Depth"]["text"])
    return row if found and int(found.group(1)) >= samples else None


def per_second(text: str) -> float:
    return float(text.removeprefix("<"))


def partition_columns(page: PageType) -> dict[int, dict[str, str]] | None:
    """The queue page's Partitions table: partition -> header -> text (None while empty)."""
    table = page.element('table[aria-label="Partitions"]')
    headers = [th.text for th in table.find_elements(By.CSS_SELECTOR, "thead th")]
    rows = table.find_elements(By.CSS_SELECTOR, "tbody tr")
    found = {}
    for row in rows:
        cells = dict(zip(headers, [td.text for td in row.find_elements(By.TAG_NAME, "td")], strict=True))
        found[int(cells["Partition"])] = cells
    return found or None


def listed_groups(page: PageType) -> dict[str, str] | None:
    """Item id -> the text of its Group cell, for the rows the items table shows (None while empty)."""
    headers = [th.text for th in page.driver.find_elements(By.CSS_SELECTOR, "section table thead th")]
    if not headers:
        return None  # not drawn yet
    column = headers.index("Group")  # a table without the column fails at once
    rows = page.driver.find_elements(By.CSS_SELECTOR, "tr[data-id]")
    found = {r.get_attribute("data-id"): r.find_elements(By.TAG_NAME, "td")[column].text for r in rows}
    return found or None


def detail_fields(page: PageType) -> dict[str, str]:
    """The item page's fields, label -> value."""
    page.element("dl.fields")
    labels = page.driver.find_elements(By.CSS_SELECTOR, "dl.fields dt")
    values = page.driver.find_elements(By.CSS_SELECTOR, "dl.fields dd")
    return {dt.text: dd.text for dt, dd in zip(labels, values, strict=True)}


def test_the_queue_list_shows_depth_oldest_age_and_dead_letters(page: PageType, api: Client) -> None:
    prefix = fresh("list")
    queue, dead = f"{prefix}-a", f"{prefix}-dead"
    api.create_queue(dead, lease_timeout="1m", expire_timeout="1h")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h", dead_queue=dead)
    api.produce(queue, ["one", "two", "three"])
    api.produce(
        queue, [NewItem(payload=b"later", enqueue_at=datetime.now(timezone.utc) + timedelta(hours=1))]
    )
    api.produce(dead, ["dead letter"])
    assert len(api.lease(queue, batch_size=1).items) == 1

    page.open(f"#/?pivot={prefix}")
    page.until(lambda d: row_cells(page, queue)[2] != "…", "stats never arrived")
    name, partitions, ready, leased, scheduled, oldest, dead_letters, _produced, _completed, _chart = (
        row_cells(page, queue)
    )
    assert (name, partitions, ready, leased, scheduled, dead_letters) == (queue, "1", "2", "1", "1", "1")
    assert oldest.endswith("s")
    # The dead-letter queue is a queue of its own in the list, with its own depth.
    assert row_cells(page, dead)[2] == "1"


def test_the_queue_list_shows_produced_and_completed_per_second_between_two_samples(
    page: PageType, api: Client
) -> None:
    queue = fresh("rates")
    page.open("#/")
    # Refresh off: the list samples once when it is opened, and then only when told to.
    Select(page.element("#refresh")).select_by_value("0")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h", requested_partitions=2)
    api.produce(queue, ["a", "b", "c"])
    page.go(f"#/?pivot={queue}")
    first = page.until(lambda d: sampled(page, queue, 1), "the first sample never arrived")
    assert list(first)[-3:] == ["Produced/s", "Completed/s", "Depth"]
    assert "Net change/s" not in first
    # One sample has counts but no rate yet.
    assert (first["Produced/s"]["text"], first["Completed/s"]["text"]) == ("—", "—")

    api.produce(queue, [f"item {n}" for n in range(5)])
    completed = 0
    while completed < 4:
        lease = api.lease(queue, batch_size=4 - completed)
        assert lease.items, "nothing to lease"
        api.complete(queue, lease.items)
        completed += len(lease.items)
    stats = api.stats(queue)
    assert (sum(p.produced for p in stats.partitions), sum(p.completed for p in stats.partitions)) == (8, 4)

    Select(page.element("#refresh")).select_by_value("2000")
    row = page.until(lambda d: sampled(page, queue, 2), "the page never sampled again")
    # Every sample after the first has 8 produced and 4 completed: the rates count 5 and 4 items.
    assert row["Produced/s"]["title"].startswith("5 produced in the last ")
    assert row["Completed/s"]["title"].startswith("4 completed in the last ")
    assert per_second(row["Produced/s"]["text"]) > 0
    assert per_second(row["Completed/s"]["text"]) > 0
    assert per_second(row["Produced/s"]["text"]) >= per_second(row["Completed/s"]["text"])
    assert row["Ready"]["text"] == "4"

    # The queue's page shows each partition's cumulative counts, as queue.stats has them.
    page.go(f"#/queue/{queue}")
    wanted = {p.partition: (str(p.produced), str(p.completed)) for p in api.stats(queue).partitions}
    shown = page.until(
        lambda d: (
            (columns := partition_columns(page))
            and {n: (c["Produced"], c["Completed"]) for n, c in columns.items()} == wanted
            and columns
        ),
        f"the partitions never showed {wanted}",
    )
    assert len(shown) == 2


@pytest.fixture
def older_server(browser: webdriver.Chrome) -> Iterator[None]:
    script = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": OLDER_SERVER})
    try:
        yield
    finally:
        browser.execute_cdp_cmd(
            "Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]}
        )


@pytest.mark.usefixtures("older_server")
def test_a_server_without_the_counters_shows_no_rates(page: PageType, api: Client) -> None:
    queue = fresh("older")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h")
    api.produce(queue, ["a"])
    page.open(f"#/?pivot={queue}")
    Select(page.element("#refresh")).select_by_value("2000")
    page.until(lambda d: sampled(page, queue, 1))
    api.produce(queue, ["b", "c"])
    [leased] = api.lease(queue, batch_size=1).items
    api.complete(queue, [leased])
    # Samples keep coming (the depth follows), but there is nothing to make a rate of.
    row = page.until(lambda d: (r := sampled(page, queue, 2)) and r["Ready"]["text"] == "2" and r)
    assert (row["Produced/s"]["text"], row["Completed/s"]["text"]) == ("—", "—")
    page.go(f"#/queue/{queue}")
    shown = page.until(lambda d: partition_columns(page))
    assert (shown[0]["Produced"], shown[0]["Completed"]) == ("—", "—")


def test_the_queue_list_pages_through_many_queues(page: PageType, api: Client) -> None:
    prefix = fresh("many")
    names = [f"{prefix}-{n:02d}" for n in range(30)]
    for name in names:
        api.create_queue(name, lease_timeout="1m", expire_timeout="1h")
    page.open(f"#/?pivot={prefix}")
    first = page.until(
        lambda d: (
            [r.get_attribute("data-queue") for r in d.find_elements(By.CSS_SELECTOR, "tr[data-queue]")]
            or None
        )
    )
    assert first == names[:25]
    page.element("#next-page").click()
    page.until(
        lambda d: d.find_element(By.CSS_SELECTOR, "tr[data-queue]").get_attribute("data-queue") == names[25]
    )


def test_create_a_queue_and_an_api_error_is_shown_as_the_api_wrote_it(page: PageType, api: Client) -> None:
    name = fresh("created")
    page.open("#/")
    form = page.element('form[aria-label="New queue"]')
    form.find_element(By.NAME, "queue_name").send_keys(name)
    lease = form.find_element(By.NAME, "lease_timeout")
    lease.clear()
    lease.send_keys("not-a-duration")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    error = page.wait_text("#error", "400")
    assert error.startswith("400 Bad Request: ")
    assert "lease_timeout" in error
    assert name not in [q.queue_name for q in api.list_queues(pivot=name, limit=1)]

    lease.clear()
    lease.send_keys("45s")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    page.wait_text("h1", name)
    assert api.queue_info(name).lease_timeout == timedelta(seconds=45)


def test_edit_settings_produce_a_test_item_and_see_it_listed(page: PageType, api: Client) -> None:
    queue = fresh("edit")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h")
    page.open(f"#/queue/{queue}")
    settings = page.element('form[aria-label="Settings"]')
    attempts = settings.find_element(By.NAME, "max_attempts")
    attempts.clear()
    attempts.send_keys("7")
    settings.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    page.wait_text("#notice", "Settings saved")
    assert api.queue_info(queue).max_attempts == 7

    produce = page.element('form[aria-label="Produce a test item"]')
    payload = produce.find_element(By.NAME, "payload")
    payload.clear()
    payload.send_keys('{"order": 42}')
    produce.find_element(By.NAME, "reference").send_keys("from-the-console")
    produce.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    page.wait_text("#notice", "Item produced")
    [stored] = api.list_items(queue)
    assert (stored.payload, stored.reference, stored.group) == (b'{"order": 42}', "from-the-console", "")
    page.wait_text("#summary", "1 ready")


def fair_marker(page: PageType, queue: str) -> str | None:
    """The text of the delivery marker in the queue list's name cell (None: no marker); waits for the row."""
    cell = page.element(f'tr[data-queue="{queue}"] td')
    markers = cell.find_elements(By.CSS_SELECTOR, "[data-delivery]")
    return markers[0].text if markers else None


def test_create_a_fair_queue_with_a_cap_and_the_list_marks_it(page: PageType, api: Client) -> None:
    prefix = fresh("fair-new")
    name, plain = f"{prefix}-a", f"{prefix}-b"
    page.open("#/")
    form = page.element('form[aria-label="New queue"]')
    form.find_element(By.NAME, "queue_name").send_keys(name)
    delivery = form.find_element(By.NAME, "delivery")
    cap = form.find_element(By.NAME, "max_leased_per_group")
    # Labelled, and FIFO with no cap unless told otherwise.
    assert delivery.accessible_name == "Delivery"
    assert cap.accessible_name == "Max leased per group (fair; 0: unlimited)"
    assert (Select(delivery).first_selected_option.get_attribute("value"), cap.get_attribute("value")) == (
        "fifo",
        "0",
    )
    Select(delivery).select_by_value("fair")
    cap.clear()
    cap.send_keys("3")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    page.wait_text("h1", name)
    info = api.queue_info(name)
    assert (info.delivery, info.max_leased_per_group) == ("fair", 3)

    # The new queue's settings show what the API stored.
    settings = page.element('form[aria-label="Settings"]')
    shown = Select(settings.find_element(By.NAME, "delivery")).first_selected_option.get_attribute("value")
    assert (shown, settings.find_element(By.NAME, "max_leased_per_group").get_attribute("value")) == (
        "fair",
        "3",
    )

    # The form left alone creates a FIFO queue without a cap, as before.
    page.open("#/")
    form = page.element('form[aria-label="New queue"]')
    form.find_element(By.NAME, "queue_name").send_keys(plain)
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    page.wait_text("h1", plain)
    info = api.queue_info(plain)
    assert (info.delivery, info.max_leased_per_group) == ("fifo", 0)

    # The list marks the fair queue, in text with its cap in the title, and not the FIFO one.
    page.open(f"#/?pivot={prefix}")
    assert page.until(lambda d: fair_marker(page, name)) == "Fair"
    marker = page.element(f'tr[data-queue="{name}"] [data-delivery]')
    assert "at most 3 leased per group" in marker.get_attribute("title")
    assert fair_marker(page, plain) is None
    assert row_cells(page, plain)[0] == plain


def test_switch_an_empty_fifo_queue_to_fair_in_the_settings(page: PageType, api: Client) -> None:
    queue = fresh("to-fair")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h")
    page.open(f"#/queue/{queue}")
    settings = page.element('form[aria-label="Settings"]')
    delivery = Select(settings.find_element(By.NAME, "delivery"))
    cap = settings.find_element(By.NAME, "max_leased_per_group")
    assert settings.find_element(By.NAME, "delivery").accessible_name == "Delivery"
    assert cap.accessible_name == "Max leased per group (fair; 0: unlimited)"
    assert cap.get_attribute("min") == "0"
    assert (delivery.first_selected_option.get_attribute("value"), cap.get_attribute("value")) == (
        "fifo",
        "0",
    )
    # Someone else changes another setting meanwhile: Save must send only what was changed here.
    api.update_queue(queue, max_attempts=5)

    delivery.select_by_value("fair")
    settings.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    page.wait_text("#notice", "Settings saved")
    info = api.queue_info(queue)
    assert (info.delivery, info.max_leased_per_group, info.max_attempts) == ("fair", 0, 5)

    cap.clear()
    cap.send_keys("4")
    settings.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    page.until(lambda d: api.queue_info(queue).max_leased_per_group == 4, "the cap was never saved")
    info = api.queue_info(queue)
    assert (info.delivery, info.max_attempts) == ("fair", 5)


def test_switching_delivery_of_a_queue_holding_items_shows_the_api_error(page: PageType, api: Client) -> None:
    queue = fresh("busy")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h")
    api.produce(queue, ["waiting"])
    with pytest.raises(BadRequestError) as refused:
        api.update_queue(queue, delivery="fair")
    assert "delivery" in refused.value.message

    page.open(f"#/queue/{queue}")
    page.wait_text("#summary", "1 ready")
    settings = page.element('form[aria-label="Settings"]')
    Select(settings.find_element(By.NAME, "delivery")).select_by_value("fair")
    settings.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    # The API's 400, word for word as the client read it ("400 Bad Request: ...").
    assert page.wait_text("#error", "400") == str(refused.value)
    assert not page.element("#notice").is_displayed()
    info = api.queue_info(queue)
    assert (info.delivery, info.max_leased_per_group) == ("fifo", 0)
    assert api.stats(queue).total == 1


def test_set_and_clear_rate_limits_in_the_settings(page: PageType, api: Client) -> None:
    queue = fresh("limited")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h", delivery="fair", rate_limit=20)
    page.open(f"#/queue/{queue}")
    settings = page.element('form[aria-label="Settings"]')
    rate = settings.find_element(By.NAME, "rate_limit")
    per_group = settings.find_element(By.NAME, "rate_limit_per_group")
    assert rate.accessible_name == "Rate limit (leases/s; 0: none)"
    assert per_group.accessible_name == "Rate limit per group (fair; leases/s; 0: none)"
    assert (rate.get_attribute("value"), per_group.get_attribute("value")) == ("20", "0")

    per_group.clear()
    per_group.send_keys("0.5")
    settings.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    page.wait_text("#notice", "Settings saved")
    info = api.queue_info(queue)
    assert (info.rate_limit, info.rate_limit_per_group) == (20.0, 0.5)

    rate.clear()
    rate.send_keys("0")
    settings.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    page.until(lambda d: api.queue_info(queue).rate_limit == 0, "the rate limit was never cleared")
    assert api.queue_info(queue).rate_limit_per_group == 0.5


def test_a_rate_limit_the_api_refuses_shows_its_error(page: PageType, api: Client) -> None:
    queue = fresh("fifo-limited")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h")
    page.open(f"#/queue/{queue}")
    settings = page.element('form[aria-label="Settings"]')
    per_group = settings.find_element(By.NAME, "rate_limit_per_group")
    per_group.clear()
    per_group.send_keys("5")
    settings.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    # A FIFO queue has no limit per group: the API's 400 names why.
    assert "rate_limit_per_group needs delivery 'fair'" in page.wait_text("#error", "400")
    assert api.queue_info(queue).rate_limit_per_group == 0


def test_create_a_rate_limited_queue(page: PageType, api: Client) -> None:
    queue = fresh("new-limited")
    page.open("#/")
    form = page.element('form[aria-label="New queue"]')
    form.find_element(By.NAME, "queue_name").send_keys(queue)
    limit = form.find_element(By.NAME, "rate_limit")
    limit.clear()
    limit.send_keys("2.5")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    page.until(lambda d: queue in d.current_url, "the new queue was never opened")
    info = api.queue_info(queue)
    assert (info.rate_limit, info.rate_limit_per_group) == (2.5, 0)


@pytest.fixture
def before_fair_delivery(browser: webdriver.Chrome) -> Iterator[None]:
    script = browser.execute_cdp_cmd(
        "Page.addScriptToEvaluateOnNewDocument", {"source": BEFORE_FAIR_DELIVERY}
    )
    try:
        yield
    finally:
        browser.execute_cdp_cmd(
            "Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]}
        )


@pytest.mark.usefixtures("before_fair_delivery")
def test_a_server_without_delivery_settings_gets_no_delivery_fields(page: PageType, api: Client) -> None:
    queue = fresh("no-fair")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h")
    page.open(f"#/queue/{queue}")
    settings = page.element('form[aria-label="Settings"]')
    assert settings.find_elements(By.NAME, "delivery") == []
    assert settings.find_elements(By.NAME, "max_leased_per_group") == []
    attempts = settings.find_element(By.NAME, "max_attempts")
    attempts.clear()
    attempts.send_keys("2")
    settings.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    page.wait_text("#notice", "Settings saved")
    info = api.queue_info(queue)
    assert (info.max_attempts, info.delivery, info.max_leased_per_group) == (2, "fifo", 0)


def test_produce_a_test_item_with_a_group(page: PageType, api: Client) -> None:
    queue = fresh("produce-group")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h")
    page.open(f"#/queue/{queue}")
    produce = page.element('form[aria-label="Produce a test item"]')
    group = produce.find_element(By.NAME, "group")
    # Labelled: the field is named by its label, so a screen reader announces it.
    assert group.accessible_name == "Group (optional)"
    group.send_keys("tenant-7 ü")
    produce.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    page.wait_text("#notice", "Item produced")
    [stored] = api.list_items(queue)
    assert stored.group == "tenant-7 ü"

    # A group the API refuses (over 128 bytes) is its 400, shown as the API wrote it.
    group.clear()
    group.send_keys("x" * 129)
    produce.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    assert "group" in page.wait_text("#error", "400")
    assert len(api.list_items(queue)) == 1


def test_items_show_their_group_filter_by_group_and_the_detail_shows_it(page: PageType, api: Client) -> None:
    queue = fresh("groups")
    api.create_queue(queue, lease_timeout="5m", expire_timeout="1h")
    markup = "<b>initech</b> & co"  # user data: shown as text, never parsed as HTML
    api.produce(
        queue,
        [
            NewItem(payload=b"1", reference="r1", group="acme"),
            NewItem(payload=b"2", reference="r2", group="globex"),
            NewItem(payload=b"3", reference="r3", group="ACME-eu"),
            NewItem(payload=b"4", reference="r4", group=markup),
            NewItem(payload=b"5", reference="r5"),
        ],
    )
    stored = {item.reference: item for item in api.list_items(queue)}
    assert {ref: item.group for ref, item in stored.items()} == {
        "r1": "acme",
        "r2": "globex",
        "r3": "ACME-eu",
        "r4": markup,
        "r5": "",
    }
    page.open(f"#/queue/{queue}")
    shown = page.until(lambda d: (g := listed_groups(page)) and len(g) == 5 and g)
    assert shown == {item.id: item.group for item in stored.values()}
    assert page.driver.find_elements(By.CSS_SELECTOR, "tr[data-id] b") == []

    group_filter = page.element('input[aria-label="Filter by group"]')
    assert group_filter.accessible_name == "Filter by group"
    group_filter.send_keys("acme")  # like the reference filter: contains, any case
    page.until(lambda d: listed_groups(page) == {stored["r1"].id: "acme", stored["r3"].id: "ACME-eu"})
    group_filter.clear()
    group_filter.send_keys("globex")
    page.until(lambda d: listed_groups(page) == {stored["r2"].id: "globex"})
    # With the reference filter too, only items matching both are listed.
    page.element('input[aria-label="Filter by reference"]').send_keys("r1")
    page.until(lambda d: page.driver.find_elements(By.CSS_SELECTOR, "tr[data-id]") == [])
    page.element('input[aria-label="Filter by reference"]').clear()
    group_filter.clear()
    group_filter.send_keys("initech")
    page.until(lambda d: listed_groups(page) == {stored["r4"].id: markup})

    # The filter is reached by keyboard from the reference filter, and the row's link opens its detail.
    page.element('input[aria-label="Filter by reference"]').click()
    page.driver.switch_to.active_element.send_keys(Keys.TAB)
    assert page.driver.switch_to.active_element.get_attribute("aria-label") == "Filter by group"
    page.element(f'tr[data-id="{stored["r4"].id}"] a').send_keys(Keys.ENTER)
    page.wait_text("h1", stored["r4"].id)
    fields = page.until(lambda d: (f := detail_fields(page)) and "Group" in f and f)
    assert (fields["Group"], fields["Reference"]) == (markup, "r4")
    assert page.driver.find_elements(By.CSS_SELECTOR, "dl.fields b") == []
    page.go(f"#/queue/{queue}/item/0/{stored['r5'].id}")
    page.until(lambda d: detail_fields(page).get("Reference") == "r5")
    assert detail_fields(page)["Group"] == "—"


def test_item_detail_shows_json_pretty_text_and_hex(page: PageType, api: Client) -> None:
    queue = fresh("detail")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h")
    api.produce(
        queue,
        [
            NewItem(payload=b'{"a":[1,2]}', reference="json"),
            NewItem(payload=b"\x00\xffbin", reference="binary"),
        ],
    )
    json_item, binary_item = api.list_items(queue)
    page.open(f"#/queue/{queue}/item/0/{json_item.id}")
    assert json.loads(page.text_of("#payload")) == {"a": [1, 2]}
    assert "\n" in page.text_of("#payload")  # pretty-printed
    page.element('button[value="text"]').click()
    page.wait_text("#payload", '{"a":[1,2]}')
    page.go(f"#/queue/{queue}/item/0/{binary_item.id}")
    assert page.wait_text("#payload", "00 ff 62 69 6e").startswith("00000000  00 ff 62 69 6e")
    assert not page.driver.find_elements(By.CSS_SELECTOR, 'button[value="text"]')


def test_filter_items_by_state_and_reference_then_delete_selected(page: PageType, api: Client) -> None:
    queue = fresh("filter")
    api.create_queue(queue, lease_timeout="5m", expire_timeout="1h")
    api.produce(
        queue,
        [
            NewItem(payload=b"1", reference="alpha"),
            NewItem(payload=b"2", reference="beta"),
            NewItem(payload=b"3", reference="alpha-2"),
        ],
    )
    [leased] = api.lease(queue, batch_size=1).items
    page.open(f"#/queue/{queue}")
    page.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr[data-id]")) == 3)
    Select(page.element('select[aria-label="Filter by state"]')).select_by_value("leased")
    page.until(
        lambda d: (
            [r.get_attribute("data-id") for r in d.find_elements(By.CSS_SELECTOR, "tr[data-id]")]
            == [leased.id]
        )
    )
    Select(page.element('select[aria-label="Filter by state"]')).select_by_value("")
    page.element('input[aria-label="Filter by reference"]').send_keys("alpha")
    rows = page.until(
        lambda d: (
            d.find_elements(By.CSS_SELECTOR, "tr[data-id]")
            if len(d.find_elements(By.CSS_SELECTOR, "tr[data-id]")) == 2
            else None
        )
    )
    chosen = rows[1].get_attribute("data-id")
    rows[1].find_element(By.CSS_SELECTOR, "input[type=checkbox]").click()
    page.element("#delete-selected").click()
    said = page.confirm()
    assert queue in said and "1 items" in said
    page.wait_text("#notice", "Deleted 1 items")
    assert chosen not in [item.id for item in api.list_items(queue)]
    assert len(api.list_items(queue)) == 2


def test_clear_names_the_queue_and_the_count_before_it_removes_them(page: PageType, api: Client) -> None:
    queue = fresh("clear")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h")
    api.produce(queue, ["a", "b", "c", "d"])
    page.open(f"#/queue/{queue}")
    page.wait_text("#summary", "4 ready")
    page.element("#clear").click()
    said = page.confirm()
    assert f'Remove 4 ready items from queue "{queue}"' in said
    page.wait_text("#notice", "Cleared")
    assert api.stats(queue).total == 0


def test_cancelling_a_clear_removes_nothing(page: PageType, api: Client) -> None:
    queue = fresh("keep")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h")
    api.produce(queue, ["a", "b"])
    page.open(f"#/queue/{queue}")
    page.wait_text("#summary", "2 ready")
    page.element("#clear").click()
    page.until(lambda d: d.find_element(By.ID, "confirm").get_attribute("open") is not None)
    page.element("#confirm-cancel").click()
    page.until(lambda d: d.find_element(By.ID, "confirm").get_attribute("open") is None)
    assert api.stats(queue).total == 2


def test_retry_scheduled_items_now(page: PageType, api: Client) -> None:
    queue = fresh("later")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h")
    api.produce(
        queue,
        [
            NewItem(
                payload=b"tomorrow", group="acme", enqueue_at=datetime.now(timezone.utc) + timedelta(days=1)
            )
        ],
    )
    page.open(f"#/queue/{queue}?tab=scheduled")
    page.until(lambda d: listed_groups(page) == {api.list_scheduled(queue)[0].id: "acme"})
    page.element("tr[data-id] input[type=checkbox]").click()
    page.element("#retry-selected").click()
    page.wait_text("#notice", "ready now")
    assert api.list_scheduled(queue) == []
    [ready] = api.list_items(queue)
    assert (ready.payload, ready.group) == (b"tomorrow", "acme")  # moved by the console itself
    assert [item.payload for item in api.lease(queue, batch_size=5).items] == [b"tomorrow"]


def test_dead_letters_redrive_selected_and_all_back_to_the_source_queue(page: PageType, api: Client) -> None:
    prefix = fresh("dlq")
    source, dead = f"{prefix}-jobs", f"{prefix}-dead"
    api.create_queue(dead, lease_timeout="1m", expire_timeout="1h")
    api.create_queue(source, lease_timeout="1m", expire_timeout="1h", dead_queue=dead, max_attempts=1)
    api.produce(
        source,
        [
            NewItem(payload=f"job {n}".encode(), reference=f"r{n}", priority=2, group=f"tenant-{n % 2}")
            for n in range(5)
        ],
    )
    lease = api.lease(source, batch_size=5)
    api.retry(source, lease.items, dead=True)
    assert len(api.list_items(dead)) == 5

    page.open(f"#/queue/{dead}")
    assert source in page.text_of("#dead-letter-of")
    page.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr[data-id]")) == 5)
    page.element("tr[data-id] input[type=checkbox]").click()
    page.element("#redrive-selected").click()
    assert source in page.confirm()
    page.wait_text("#notice", "1 dead letters moved")
    assert len(api.list_items(dead)) == 4
    [back] = api.list_items(source)
    # Moved by the console itself: priority and group kept.
    assert (back.attempts, back.payload, back.priority, back.group) == (0, b"job 0", 2, "tenant-0")

    page.element("#redrive-all").click()
    assert "Move 4 dead letters" in page.confirm()
    page.wait_text("#notice", "Redrive finished: 4 moved")
    assert api.list_items(dead) == []
    moved = api.list_items(source)
    assert sorted(item.payload for item in moved) == [f"job {n}".encode() for n in range(5)]
    assert {item.attempts for item in moved} == {0}
    assert {item.priority for item in moved} == {2}
    assert sorted((item.reference, item.group) for item in moved) == [
        (f"r{n}", f"tenant-{n % 2}") for n in range(5)
    ]
    assert sorted(item.reference for item in moved) == [f"r{n}" for n in range(5)]


def item_columns(page: PageType) -> dict[str, dict[str, str]] | None:
    """The items table: item id -> header -> text (None while it is not drawn)."""
    headers = [th.text for th in page.driver.find_elements(By.CSS_SELECTOR, "section table thead th")]
    rows = page.driver.find_elements(By.CSS_SELECTOR, "tr[data-id]")
    if not headers or not rows:
        return None
    return {
        row.get_attribute("data-id"): dict(
            zip(headers, [td.text for td in row.find_elements(By.TAG_NAME, "td")], strict=True)
        )
        for row in rows
    }


def test_dead_letters_show_their_source_queue_failures_and_last_reason(page: PageType, api: Client) -> None:
    prefix = fresh("why")
    source, dead = f"{prefix}-jobs", f"{prefix}-dead"
    api.create_queue(dead, lease_timeout="1m", expire_timeout="1h")
    api.create_queue(source, lease_timeout="1m", expire_timeout="1h", dead_queue=dead, max_attempts=2)
    api.produce(source, [b"flaky", b"poison", b"fine"])
    flaky, poison, fine = api.lease(source, batch_size=3).items
    api.retry(source, [flaky], reason="TimeoutError: db did not answer")
    long = "ValueError: " + "<b>bad</b> input " * 60  # user data: text, never HTML; over a line long
    api.retry(source, [poison], dead=True, reason=long[:1000])
    api.retry(source, [api.lease(source, batch_size=1).items[0]], reason="KeyError: 'sku'")
    stored = {item.payload: item for item in api.list_items(dead)}
    assert set(stored) == {b"flaky", b"poison"}

    # The dead-letter queue's items: where they came from, how often and why they failed.
    page.open(f"#/queue/{dead}")
    shown = page.until(lambda d: (c := item_columns(page)) and len(c) == 2 and c)
    assert {row["Source queue"] for row in shown.values()} == {source}
    assert shown[stored[b"flaky"].id]["Failures"] == "2"
    assert shown[stored[b"flaky"].id]["Last reason"] == "max attempts: KeyError: 'sku'"
    assert shown[stored[b"poison"].id]["Failures"] == "1"
    cell = page.element(f'tr[data-id="{stored[b"poison"].id}"] td.reason')
    assert cell.get_attribute("title") == long[:1000]  # all of it on hover, one line in the table
    assert (cell.value_of_css_property("white-space"), cell.value_of_css_property("text-overflow")) == (
        "nowrap",
        "ellipsis",
    )
    assert cell.size["width"] < 600  # cut, not the whole kilobyte across the page
    assert page.driver.find_elements(By.CSS_SELECTOR, "tr[data-id] b") == []

    # The item page says it all.
    page.element(f'tr[data-id="{stored[b"poison"].id}"] a').click()
    fields = page.until(lambda d: (f := detail_fields(page)) and "Source queue" in f and f)
    assert (fields["Source queue"], fields["Failures"], fields["Source id"]) == (source, "1", poison.id)
    assert page.text_of("#last-reason") == long[:1000].strip()
    assert page.driver.find_elements(By.CSS_SELECTOR, "#last-reason b") == []

    # A queue whose items never failed keeps its columns; one where an item failed shows why.
    page.go(f"#/queue/{source}")
    listed = page.until(lambda d: (c := item_columns(page)) and len(c) == 1 and c)
    assert "Last reason" not in next(iter(listed.values())) and "Source queue" not in next(
        iter(listed.values())
    )
    api.complete(source, [fine])
    api.produce(source, [b"again"])
    retried = api.lease(source, batch_size=1).items[0]
    api.retry(source, [retried], reason="RuntimeError: once")
    page.go(f"#/queue/{dead}")
    page.go(f"#/queue/{source}")
    listed = page.until(lambda d: (c := item_columns(page)) and "Last reason" in next(iter(c.values())) and c)
    assert [(row["Failures"], row["Last reason"]) for row in listed.values()] == [("1", "RuntimeError: once")]
    page.element("tr[data-id] a").click()
    page.until(lambda d: detail_fields(page).get("Failures") == "1")
    assert page.text_of("#last-reason") == "RuntimeError: once"
    assert detail_fields(page)["Source queue"] == "—"


def test_the_page_refreshes_by_itself(page: PageType, api: Client) -> None:
    queue = fresh("live")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h")
    page.open(f"#/queue/{queue}")
    Select(page.element("#refresh")).select_by_value("2000")
    page.wait_text("#summary", "0 ready")
    api.produce(queue, ["x", "y"])
    page.wait_text("#summary", "2 ready")


def test_a_read_only_console_through_the_signing_proxy_shows_queues_and_offers_no_writes(
    browser: webdriver.Chrome, console_server: str, api: Client
) -> None:
    queue = fresh("readonly")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h")
    api.produce(queue, ["a"])
    credentials = Credentials("AKIDREADONLY", "secret")
    with ConsoleProxy(
        url=console_server, region="us-east-1", credentials=credentials, port=0, read_only=True
    ) as proxy:
        page = PageType(browser, proxy.url).open(f"#/queue/{queue}")
        page.wait_text("#summary", "1 ready")
        assert page.element("#mode").is_displayed()
        assert page.element('input[name="max_attempts"]').get_attribute("readonly") is not None
        assert page.element('input[name="max_leased_per_group"]').get_attribute("readonly") is not None
        assert not page.element('select[name="delivery"]').is_enabled()  # a select has no readonly
        for write in (
            "#clear",
            "#delete-selected",
            'form[aria-label="Produce a test item"]',
            "tr[data-id] input[type=checkbox]",
        ):
            assert page.driver.find_elements(By.CSS_SELECTOR, write) == [], write
        page.open("#/")
        assert page.driver.find_elements(By.CSS_SELECTOR, 'form[aria-label="New queue"]') == []


# -- issue 34: priority on produce, reprioritize, dead-letter queues marked ------------------------------


def test_produce_a_test_item_with_a_priority_and_a_delay(page: PageType, api: Client) -> None:
    queue = fresh("produce-priority")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h")
    page.open(f"#/queue/{queue}")
    produce = page.element('form[aria-label="Produce a test item"]')
    priority = produce.find_element(By.NAME, "priority")
    assert priority.accessible_name == "Priority (0-9, lower leases first)"
    assert priority.get_attribute("value") == "5"
    priority.clear()
    priority.send_keys("1")
    produce.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    page.wait_text("#notice", "Item produced")
    [stored] = api.list_items(queue)
    assert stored.priority == 1

    # A relative delay, counted by the server: the item is scheduled.
    produce = page.element('form[aria-label="Produce a test item"]')
    produce.find_element(By.NAME, "enqueue_in").send_keys("1h")
    produce.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    page.wait_text("#notice", "Item produced")
    [scheduled] = api.list_scheduled(queue)
    assert scheduled.enqueue_at is not None
    assert scheduled.enqueue_at > datetime.now(timezone.utc) + timedelta(minutes=59)

    # A priority the API refuses is its 400, naming the field.
    produce = page.element('form[aria-label="Produce a test item"]')
    produce.find_element(By.NAME, "enqueue_in").clear()
    priority = produce.find_element(By.NAME, "priority")
    priority.clear()
    priority.send_keys("12")
    page.driver.execute_script("arguments[0].noValidate = true", produce)  # past the browser's own check
    produce.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    assert "priority" in page.wait_text("#error", "400")
    assert len(api.list_items(queue)) == 1


def test_reprioritize_selected_items(page: PageType, api: Client) -> None:
    queue = fresh("reprioritize")
    api.create_queue(queue, lease_timeout="5m", expire_timeout="1h")
    api.produce(queue, [NewItem(payload=b"leased"), NewItem(payload=b"waiting")])
    [held] = api.lease(queue, batch_size=1).items
    assert held.payload == b"leased"
    page.open(f"#/queue/{queue}")
    page.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr[data-id]")) == 2)
    for row in page.driver.find_elements(By.CSS_SELECTOR, "tr[data-id]"):
        row.find_element(By.CSS_SELECTOR, "input[type=checkbox]").click()
    new_priority = page.element("#new-priority")
    assert new_priority.accessible_name == "New priority (0-9)"
    new_priority.clear()
    new_priority.send_keys("0")
    page.element("#reprioritize-selected").click()
    page.wait_text("#notice", "2 items now have priority 0")

    items = {item.payload: item for item in api.list_items(queue)}
    assert items[b"waiting"].priority == 0  # moved to priority 0 under a new id
    # Leased: keeps its id and lease, and comes back with priority 0.
    assert items[b"leased"].id == held.id and items[b"leased"].is_leased
    api.retry(queue, [held])
    assert [(i.payload, i.priority) for i in api.lease(queue, batch_size=2).items] == [
        (b"waiting", 0),
        (b"leased", 0),
    ]


def test_the_queue_list_marks_dead_letter_queues_with_their_sources(page: PageType, api: Client) -> None:
    prefix = fresh("marked")
    jobs, mail, dead, plain = f"{prefix}-a-jobs", f"{prefix}-b-mail", f"{prefix}-c-dead", f"{prefix}-d-plain"
    api.create_queue(dead, lease_timeout="1m", expire_timeout="1h")
    api.create_queue(plain, lease_timeout="1m", expire_timeout="1h")
    for source in (jobs, mail):
        api.create_queue(source, lease_timeout="1m", expire_timeout="1h", dead_queue=dead)

    page.open(f"#/?pivot={prefix}")
    marker = page.element(f'tr[data-queue="{dead}"] [data-dead-letter-of]')
    assert marker.text == "Dead-letter queue"
    assert marker.get_attribute("title") == f"dead-letter queue of: {jobs}, {mail}"
    for queue in (jobs, mail, plain):
        assert (
            page.element(f'tr[data-queue="{queue}"] td').find_elements(
                By.CSS_SELECTOR, "[data-dead-letter-of]"
            )
            == []
        )

    # Known from every queue, not only those on the page: the source may be on another page.
    page.open(f"#/?pivot={dead}")
    marker = page.element(f'tr[data-queue="{dead}"] [data-dead-letter-of]')
    assert marker.get_attribute("title") == f"dead-letter queue of: {jobs}, {mail}"


def test_the_partition_table_shows_ages_as_people_read_them(page: PageType, api: Client) -> None:
    queue = fresh("ages")
    api.create_queue(queue, lease_timeout="1m", expire_timeout="1h")
    api.produce(queue, ["a", "b", "c"])
    page.open(f"#/queue/{queue}")
    cell = page.until(
        lambda d: next(
            (c for c in d.find_elements(By.CSS_SELECTOR, 'tr[data-partition="0"] td')[4:5] if c.text != "0s"),
            None,
        ),
        "no average age",
    )
    # Rounded to a tenth (or whole seconds past a minute), the API's exact value in the title.
    assert re.fullmatch(r"[0-9]+(\.[0-9])?(ms|s)|([0-9]+[hms])+", cell.text), cell.text
    assert re.fullmatch(r"[0-9.]+(ms|µs|s)|([0-9.]+[hms])+", cell.get_attribute("title"))

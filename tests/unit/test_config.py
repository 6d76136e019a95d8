"""Settings come from the environment once; a missing or malformed variable fails at cold start."""

from __future__ import annotations

from datetime import timedelta

import pytest

from querator.bootstrap import open_stores
from querator.config import (
    DEFAULT_ENGINE,
    DEFAULT_LEASE_WAIT_CAP,
    ConfigurationError,
    EnvVar,
    StoreKind,
    load_settings,
    parse_store,
    settings_from,
    sqlite_sync,
)

TABLES = {EnvVar.ITEMS_TABLE: "items-prod", EnvVar.CATALOG_TABLE: "queues-prod"}


def test_table_names_are_required_and_named_in_the_error():
    with pytest.raises(ConfigurationError, match=EnvVar.CATALOG_TABLE):
        settings_from({EnvVar.ITEMS_TABLE: "items"})
    with pytest.raises(ConfigurationError, match=f"{EnvVar.ITEMS_TABLE}, {EnvVar.CATALOG_TABLE}"):
        settings_from({})


def test_tunables_have_defaults_and_parse_seconds():
    settings = settings_from(TABLES)
    assert (settings.items_table, settings.catalog_table) == ("items-prod", "queues-prod")
    assert settings.lease_wait_cap == DEFAULT_LEASE_WAIT_CAP
    tuned = settings_from(
        {**TABLES, EnvVar.LEASE_WAIT_CAP: "2.5", EnvVar.REAPER_MARGIN: "0", EnvVar.QUEUE_CACHE: "0"}
    )
    assert (tuned.lease_wait_cap, tuned.reaper_margin, tuned.queue_cache) == (
        timedelta(seconds=2.5),
        timedelta(0),
        timedelta(0),
    )
    assert settings.queue_cache == timedelta(seconds=1)


@pytest.mark.parametrize("raw", ["soon", "0", "-1"])
def test_a_bad_wait_cap_is_refused(raw):
    with pytest.raises(ConfigurationError, match=r"LEASE_WAIT_CAP|lease_wait_cap"):
        settings_from({**TABLES, EnvVar.LEASE_WAIT_CAP: raw})


def test_the_engine_defaults_and_only_a_known_one_is_taken():
    assert settings_from(TABLES).engine == DEFAULT_ENGINE
    assert settings_from({**TABLES, EnvVar.ENGINE: "3"}).engine == 3
    assert settings_from({**TABLES, EnvVar.ENGINE: " 2 "}).engine == 2
    for bad in ("4", "v3", "3.0"):
        with pytest.raises(ConfigurationError, match=EnvVar.ENGINE):
            settings_from({**TABLES, EnvVar.ENGINE: bad})


@pytest.mark.parametrize("url", ["memory", "sqlite"])
def test_engine_v3_stores_hold_a_claim_log_and_engine_v2_stores_none(url, tmp_path, monkeypatch):
    monkeypatch.delenv(EnvVar.ENGINE, raising=False)
    url = f"sqlite:{tmp_path / 'q.db'}" if url == "sqlite" else url
    v3 = open_stores(url, engine=3)
    v2 = open_stores(url, engine=2)
    monkeypatch.setenv(EnvVar.ENGINE, "3")
    from_environment = open_stores(url)
    try:
        assert v3.log is not None and from_environment.log is not None
        assert v2.log is None
    finally:
        for stores in (v3, v2, from_environment):
            stores.close()


def test_a_store_url_is_parsed_and_other_stores_need_no_table_names():
    assert parse_store("memory") == (StoreKind.MEMORY, "")
    assert parse_store("dynamodb") == (StoreKind.DYNAMODB, "")
    assert parse_store("sqlite:/srv/q.db") == (StoreKind.SQLITE, "/srv/q.db")
    assert parse_store("sqlite:/srv/q.db?sync=full") == (StoreKind.SQLITE, "/srv/q.db")
    assert [sqlite_sync(u) for u in ("sqlite:q.db", "sqlite:q.db?sync=normal", "sqlite:q.db?sync=full")] == [
        "normal",
        "normal",
        "full",
    ]
    with pytest.raises(ConfigurationError, match="sync=normal or sync=full"):
        parse_store("sqlite:q.db?sync=off")
    for bad in ("postgres://localhost/q", "sqlite:", "sqlite", "MEMORY", "", "sqlite:?sync=full"):
        with pytest.raises(ConfigurationError, match="unsupported store"):
            parse_store(bad)
    assert settings_from({EnvVar.STORE: "sqlite:q.db"}).store == "sqlite:q.db"
    assert settings_from(TABLES).store == StoreKind.DYNAMODB
    with pytest.raises(ConfigurationError, match="unsupported store"):
        settings_from({**TABLES, EnvVar.STORE: "redis://x"})


def test_the_store_read_timeout_reaches_the_dynamodb_client(monkeypatch: pytest.MonkeyPatch) -> None:
    from querator import bootstrap  # noqa: PLC0415 - the client is built from the patched environment

    assert settings_from(TABLES).store_read_timeout == timedelta(seconds=5)
    for name, value in {**TABLES, EnvVar.STORE_READ_TIMEOUT: "45", EnvVar.REGION: "eu-west-1"}.items():
        monkeypatch.setenv(name, value)
    bootstrap.reset()
    load_settings.cache_clear()
    try:
        config = bootstrap.get_client().meta.config
        # The other settings stay: retries in standard mode, the short connect timeout.
        assert (config.read_timeout, config.connect_timeout) == (45, 2)
        # (botocore keeps max_attempts=4 retries as total_max_attempts=5 requests)
        assert config.retries == {"mode": "standard", "total_max_attempts": 5}
    finally:
        load_settings.cache_clear()
        bootstrap.reset()
    for raw in ("0", "-1", "901", "later"):
        with pytest.raises(ConfigurationError, match=r"STORE_READ_TIMEOUT|store_read_timeout"):
            settings_from({**TABLES, EnvVar.STORE_READ_TIMEOUT: raw})


@pytest.mark.parametrize(
    ("name", "raw", "needs"),
    [
        (EnvVar.REAPER_MARGIN, "-1", "0 or more"),
        (EnvVar.QUEUE_CACHE, "-0.5", "0 or more"),
        (EnvVar.QUEUE_CACHE, "61", "at most 60"),
        (EnvVar.LEASE_WAIT_CAP, "nan", "not a number of seconds"),
        (EnvVar.LEASE_WAIT_CAP, "1e300", "not a number of seconds"),
    ],
)
def test_each_duration_setting_is_checked_naming_its_variable(name: str, raw: str, needs: str) -> None:
    with pytest.raises(ConfigurationError, match=name) as raised:
        settings_from({**TABLES, name: raw})
    assert needs in str(raised.value)


def test_a_table_name_over_dynamodbs_limit_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=EnvVar.ITEMS_TABLE):
        settings_from({**TABLES, EnvVar.ITEMS_TABLE: "t" * 256})
    assert settings_from({**TABLES, EnvVar.ITEMS_TABLE: "t" * 255}).items_table == "t" * 255


def test_settings_are_immutable() -> None:
    settings = settings_from(TABLES)
    with pytest.raises(AttributeError):
        settings.items_table = "other"  # type: ignore[misc]

"""Where the table store is: its default SQLite file, the URLs it takes and refuses (one line,
no password), SQLite folders it makes or refuses, and a PostgreSQL it cannot reach yet."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from profiler_app.core.errors import UserError
from profiler_app.sinks.store import StoreError, TableStore, default_store_url
from profiler_app.sinks.store.urls import parse_store_url
from tests.support.store_cycles import T0, cycle, fetch, profile

pytest_plugins = ["tests.support.postgres"]


def test_default_url_is_a_sqlite_file_in_the_user_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    url = default_store_url()
    assert url == f"sqlite:///{tmp_path / 'data' / 'gpu-profiler' / 'profiler.db'}"
    TableStore(url).close()  # creates the parents
    assert (tmp_path / "data" / "gpu-profiler" / "profiler.db").is_file()
    assert fetch(url, "PRAGMA journal_mode") == [("wal",)]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "malformed store URL"),
        ("mysql://u@h/db", "unsupported store URL scheme 'mysql'"),
        ("sqlite://", "needs a file"),
        ("sqlite:///:memory:", "needs a file"),
        ("sqlite:///profiler.db?mode=ro", "malformed SQLite store URL"),
        ("postgresql://u:hunter2@h:99999/db", "malformed store URL"),
        ("postgresql+asyncpg://u@h/db", "unsupported PostgreSQL driver"),
        ("postgresql://u:hunter2@127.0.0.1:5/", "names no database"),
    ],
)
def test_bad_urls_are_one_line_errors_without_passwords(url: str, message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        TableStore(url)
    assert "hunter2" not in str(caught.value)
    assert "\n" not in str(caught.value)


def test_plain_postgresql_urls_use_psycopg() -> None:
    parsed = parse_store_url("postgresql://profiler:s3cret@db.example:5432/profiler")
    assert parsed.backend == "postgresql"
    assert parse_store_url("postgres://u@h/d").backend == "postgresql"
    assert parse_store_url("postgresql+psycopg://u@h/d").backend == "postgresql"


def test_displayed_postgresql_urls_mask_every_password() -> None:
    """libpq also takes a password (or an SSL key's) as an option in the query string."""
    parsed = parse_store_url(
        "postgresql://profiler:s3cret@db:5432/gpus?sslpassword=k3y&password=hunter2&sslmode=require"
    )
    shown = parsed.display()
    assert shown == (
        "postgresql://profiler:***@db:5432/gpus?sslpassword=***&password=***&sslmode=require"
    )
    assert parsed.query["password"] == "hunter2"  # masked only for display
    with pytest.raises(UserError, match="malformed store URL") as caught:
        parse_store_url("postgresql://u:s3cret@h:99999/db?password=hunter2")
    assert "s3cret" not in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_sqlite_in_an_unwritable_place_is_a_user_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(UserError, match="cannot create the store directory"):
        TableStore(f"sqlite:///{blocker / 'profiler.db'}")
    with pytest.raises(UserError, match=r"the folder .*/file does not exist"):
        TableStore(f"sqlite:///{blocker / 'sub' / 'profiler.db'}")


def test_a_store_url_grows_no_tree_of_folders(tmp_path: Path) -> None:
    """Its own folder is made, as mkdir makes one; a path whose parents are missing is refused."""
    TableStore(f"sqlite:///{tmp_path / 'store' / 'profiler.db'}").close()
    assert (tmp_path / "store" / "profiler.db").is_file()
    with pytest.raises(UserError, match=r"the folder .*/nonexistent does not exist"):
        TableStore(f"sqlite:///{tmp_path / 'nonexistent' / 'dir' / 'x.db'}")
    assert not (tmp_path / "nonexistent").exists()


def test_unreachable_postgresql_is_retried_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listens on the port: the store starts, each publish raises StoreError."""
    url = "postgresql://profiler:hunter2@127.0.0.1:9/profiler?connect_timeout=2"
    with caplog.at_level(logging.WARNING):
        store = TableStore(url)
    assert "will retry" in caplog.text
    assert "hunter2" not in caplog.text
    with pytest.raises(StoreError, match="database unavailable") as caught:
        store.publish(cycle(T0, [profile("0")]))
    assert "hunter2" not in str(caught.value)
    store.close()


def test_postgres_fixture_skips_without_binaries(monkeypatch: pytest.MonkeyPatch) -> None:
    # Imported here: at module level it would precede its registration as a pytest plugin.
    from tests.support import postgres as postgres_support  # noqa: PLC0415

    monkeypatch.setattr(postgres_support, "find_bin_dir", lambda: None)
    with (
        pytest.raises(pytest.skip.Exception, match="PostgreSQL is not installed"),
        postgres_support.running_postgres(),
    ):
        pass

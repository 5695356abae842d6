"""PostgreSQL partitions: ``gpu_window`` by UTC day, the rollups by UTC month.

The writer creates the partitions its rows need, and the next ones ahead, before its cycle's
transaction (``PartitionKeeper``), so that at midnight the new day's partition is already there.
A partition is created as a plain table and attached (``ATTACH PARTITION`` takes a lock that
does not wait for, or stop, other writers and readers, but does one other creator: daemons
starting together create each partition once). Retention drops whole partitions
(``retention.py``). ``report`` and Grafana only read: they never create one.

Partitions are named ``<table>_pYYYYMMDD`` (days) and ``<table>_pYYYYMM`` (months); the name
gives the bounds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from profiler_app.sinks.store.dbapi import Database

# Any fixed number: one daemon at a time drops partitions (retention.py).
PARTITION_LOCK_ID = 0x67707570617274
# How long a daemon creating the partition its rows need waits for others creating partitions
# of the same table (each holds the lock for milliseconds).
CREATE_LOCK_TIMEOUT = "5s"
# How long retention's DROP waits for its lock (a running report holds one) before giving up
# until the next hour: writers queue behind a waiting DROP, never longer than this.
DROP_LOCK_TIMEOUT = "1s"
# The rollups' current bucket rows are updated every cycle: room on each page for HOT updates.
ROLLUP_FILLFACTOR = 70


@dataclass(frozen=True)
class Scheme:
    """How one table is partitioned: by UTC day or UTC month of ``column``."""

    table: str
    column: str
    monthly: bool

    def partition(self, moment: datetime) -> Partition:
        """The partition holding ``moment``."""
        moment = moment.astimezone(UTC)
        if self.monthly:
            lower = datetime(moment.year, moment.month, 1, tzinfo=UTC)
        else:
            lower = datetime(moment.year, moment.month, moment.day, tzinfo=UTC)
        return Partition(self, lower)

    def parse(self, name: str) -> Partition | None:
        """The partition a relation name stands for, None when it is not one of this table."""
        digits = 6 if self.monthly else 8
        match = re.fullmatch(rf"{self.table}_p(\d{{{digits}}})", name)
        if match is None:
            return None
        try:
            lower = datetime.strptime(match[1], "%Y%m" if self.monthly else "%Y%m%d")
        except ValueError:
            return None
        return Partition(self, lower.replace(tzinfo=UTC))


@dataclass(frozen=True)
class Partition:
    scheme: Scheme
    lower: datetime

    @property
    def name(self) -> str:
        suffix = self.lower.strftime("%Y%m" if self.scheme.monthly else "%Y%m%d")
        return f"{self.scheme.table}_p{suffix}"

    @property
    def upper(self) -> datetime:
        if not self.scheme.monthly:
            return self.lower + timedelta(days=1)
        year, month = divmod(self.lower.month, 12)
        return self.lower.replace(year=self.lower.year + year, month=month + 1)

    def following(self) -> Partition:
        return Partition(self.scheme, self.upper)

    def create_statements(self) -> list[str]:
        """A plain table like its parent, then attached: writers keep writing meanwhile."""
        table = self.scheme.table
        storage = (
            "" if self.scheme.table == "gpu_window" else f" WITH (fillfactor = {ROLLUP_FILLFACTOR})"
        )
        return [
            f"CREATE TABLE IF NOT EXISTS {self.name}"
            f" (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS){storage}",
            f"ALTER TABLE {table} ATTACH PARTITION {self.name}"
            f" FOR VALUES FROM ('{_literal(self.lower)}') TO ('{_literal(self.upper)}')",
        ]


RAW = Scheme("gpu_window", "at", monthly=False)
SCHEMES = {
    scheme.table: scheme
    for scheme in (
        RAW,
        Scheme("gpu_hour", "hour", monthly=True),
        Scheme("gpu_day", "day", monthly=True),
        Scheme("gpu_job_day", "day", monthly=True),
        Scheme("pod_hour", "hour", monthly=True),
        Scheme("rightsize_hour", "hour", monthly=True),
        Scheme("rightsize_day", "day", monthly=True),
        Scheme("activity_hour", "hour", monthly=True),
        Scheme("activity_day", "day", monthly=True),
        Scheme("activity_hour_packed", "hour", monthly=True),  # packing.py
        Scheme("activity_day_packed", "day", monthly=True),
    )
}


def is_partition(name: str) -> bool:
    """Whether a table name is one of the partitions (Alembic's autogenerate leaves them out:
    they are made by the writer, not by the models)."""
    return any(scheme.parse(name) is not None for scheme in SCHEMES.values())


def _literal(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S+00")


class PartitionKeeper:
    """Creates the partitions a cycle's rows need (and the next of each) when missing."""

    def __init__(self) -> None:
        self._known: set[str] = set()  # names of partitions seen or created

    def ensure(self, database: Database, needs: Iterable[tuple[str, datetime]]) -> None:
        """Makes sure each (table, time) of ``needs`` has its partition, waiting for the lock
        if another daemon holds it, and tries to create the one after each too, ahead of time:
        that one only if its lock is free at once (another daemon is creating it otherwise),
        so that a thousand daemons crossing midnight together queue for nothing."""
        needed: dict[str, Partition] = {}
        ahead: dict[str, Partition] = {}
        for table, moment in needs:
            partition = SCHEMES[table].partition(moment)
            needed[partition.name] = partition
            ahead[partition.following().name] = partition.following()
        for name in needed:
            ahead.pop(name, None)
        unknown = [name for name in (*needed, *ahead) if name not in self._known]
        if not unknown:
            return
        present = {
            name
            for (name,) in database.query(
                "SELECT name FROM unnest(%(names)s::text[]) AS name"
                " WHERE to_regclass(name) IS NOT NULL",
                {"names": unknown},
            )
        }
        self._known.update(present)
        missing = [p for name, p in needed.items() if name not in self._known]
        if missing:
            self._create(database, missing, wait=True)
        later = [p for name, p in ahead.items() if name not in self._known]
        if later:
            try:
                self._create(database, later, wait=False)
            except database.errors as error:
                if type(error).__name__ != "LockNotAvailable":  # someone else is at it
                    raise

    def _create(self, database: Database, partitions: list[Partition], *, wait: bool) -> None:
        """Creates ``partitions`` where still missing, under each parent's ATTACH lock: it
        serialises daemons creating partitions of one table (not its writers or readers), and
        once held, the lookups below see what another daemon created meanwhile."""
        with database.transaction() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{CREATE_LOCK_TIMEOUT}'")
            for table in sorted({partition.scheme.table for partition in partitions}):
                nowait = "" if wait else " NOWAIT"
                cursor.execute(f"LOCK TABLE {table} IN SHARE UPDATE EXCLUSIVE MODE{nowait}")
                for partition in partitions:
                    if partition.scheme.table != table:
                        continue
                    cursor.execute(
                        "SELECT to_regclass(%(name)s) IS NOT NULL", {"name": partition.name}
                    )
                    if not cursor.fetchone()[0]:
                        for statement in partition.create_statements():
                            cursor.execute(statement)
        self._known.update(partition.name for partition in partitions)

    def forget(self) -> None:
        """After a failed write: a partition may have been dropped under this daemon."""
        self._known.clear()


def partitions(cursor: Any, scheme: Scheme) -> list[tuple[Partition, bool]]:
    """The partitions of ``scheme`` present, oldest first, each with whether it is attached
    (a table left detached by an interrupted drop is still listed)."""
    cursor.execute(
        "SELECT relname, relispartition FROM pg_class"
        " WHERE relkind = 'r' AND relname LIKE %(prefix)s"
        " AND relnamespace = current_schema()::regnamespace",
        {"prefix": f"{scheme.table}\\_p%"},
    )
    found = []
    for name, attached in cursor.fetchall():
        partition = scheme.parse(name)
        if partition is not None:
            found.append((partition, bool(attached)))
    return sorted(found, key=lambda item: item[0].lower)

"""Idle blocks (sinks/store/idle_blocks.py): waste's idle time per workload over blocks of whole
days, made from gpu_day once the days are settled; the report ranks from them and reads the
days between from gpu_day. The plan and the due blocks as pure functions; the blocks made, read
and dropped on SQLite and a real PostgreSQL."""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from profiler_app.sinks.store import TableStore, sink
from profiler_app.sinks.store.dbapi import Database
from profiler_app.sinks.store.engine import create_store_engine
from profiler_app.sinks.store.history import gpu_history
from profiler_app.sinks.store.idle_blocks import (
    GPU_KEY,
    IDLE_BLOCK_LOCK_ID,
    KEY,
    LEVELS,
    MARGIN_DAYS,
    IdleBlocks,
    blocks_over,
    due,
    late_days,
    plan,
)
from profiler_app.sinks.store.models import (
    gpu_day,
    gpu_window,
    idle_block,
    idle_block_gpu,
    idle_block_made,
)
from profiler_app.sinks.store.rollups import EPOCH
from profiler_app.sinks.store.sink import StoreError
from profiler_app.sinks.store.urls import parse_store_url
from tests.support.migrations import migrate
from tests.unit.test_store_rollups import cycle, gpu, report, rows

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.postgres import PostgresServer

pytest_plugins = ["tests.support.postgres"]

DAY = timedelta(days=1)
# An epoch day divisible by 16: every level's blocks start on it.
ALIGNED = EPOCH + DAY * (20_608 // 16 * 16)
H = datetime(2026, 5, 31, 23, 0, tzinfo=UTC)  # at(0) of the rollup tests


def day(index: int) -> datetime:
    return ALIGNED + DAY * index


# -- the plan and the due blocks ---------------------------------------------------------------


def test_a_range_takes_the_largest_blocks_made_inside_it() -> None:
    made = {(day(0), 16), (day(0), 8), (day(8), 8), (day(16), 4), (day(20), 2), (day(16), 2)}
    assert plan(day(0), day(23), made) == [
        (day(0), day(16), 16),
        (day(16), day(20), 4),
        (day(20), day(22), 2),
        (day(22), day(23), None),
    ]
    # Starting inside the 16-day block: its 8-day half, then days where nothing was made.
    assert plan(day(8), day(21), made) == [
        (day(8), day(16), 8),
        (day(16), day(20), 4),
        (day(20), day(21), None),
    ]


def test_days_without_blocks_are_one_run() -> None:
    assert plan(day(1), day(9), {(day(2), 2)}) == [
        (day(1), day(2), None),
        (day(2), day(4), 2),
        (day(4), day(9), None),
    ]
    assert plan(day(0), day(5), set()) == [(day(0), day(5), None)]
    assert plan(day(3), day(3), set()) == []


def test_a_block_reaching_past_the_range_is_not_taken() -> None:
    assert plan(day(0), day(7), {(day(0), 8)}) == [(day(0), day(7), None)]


def test_blocks_are_due_aligned_settled_and_after_their_halves() -> None:
    """From the oldest day, blocks that end MARGIN_DAYS before today; each level's blocks on
    multiples of its length; a block of four days and more only once its halves are due."""
    now = day(18) + timedelta(hours=5)  # blocks end on day 16 at the latest
    got = list(due(day(1), now, set()))
    assert got == [
        *((day(n), 2) for n in range(2, 16, 2)),
        *((day(n), 4) for n in (4, 8, 12)),
        (day(8), 8),
    ]
    assert all(start + DAY * days <= now - DAY * MARGIN_DAYS for start, days in got)
    # Made ones are not due again; a missing half holds back its block.
    made = {(day(2), 2), (day(4), 2), (day(6), 2), (day(4), 4)}
    again = list(due(day(1), now, made - {(day(6), 2)}))
    assert (day(6), 2) in again
    assert (day(4), 4) not in again
    assert (day(8), 8) in again
    half_missing = list(due(day(10), now, set()))  # day 8-9 before the oldest: no 8-day block
    assert (day(8), 8) not in half_missing
    assert (day(8), 4) not in half_missing
    assert (day(12), 4) in half_missing


def test_nothing_is_due_before_the_margin() -> None:
    assert list(due(day(0), day(1) + DAY * MARGIN_DAYS, set())) == []
    assert list(due(day(0), day(2) + DAY * MARGIN_DAYS, set())) == [(day(0), 2)]


def test_only_writes_reaching_back_past_yesterday_are_late() -> None:
    now = day(20) + timedelta(hours=0, minutes=10)
    # A 30-minute window, or a whole day's, across midnight: not late.
    assert late_days(now - timedelta(minutes=30), now, now) is None
    assert late_days(now - DAY, now, now) is None
    # A window of 25 hours reaches the day before yesterday: that day may be in a block made
    # by a daemon whose clock runs a day ahead.
    assert late_days(now - timedelta(hours=25), now, now) == (day(18), day(19))
    # A cycle of day 5 written late (after an outage): its own days only.
    old = day(5) + timedelta(hours=1)
    assert late_days(old - timedelta(hours=2), old, now) == (day(4), day(6))


def test_the_blocks_over_days_are_every_level_holding_them() -> None:
    assert set(blocks_over(day(5), day(6))) == {(day(4), 2), (day(4), 4), (day(0), 8), (day(0), 16)}
    assert set(blocks_over(day(7), day(9))) == {
        (day(6), 2),
        (day(8), 2),
        (day(4), 4),
        (day(8), 4),
        (day(0), 8),
        (day(8), 8),
        (day(0), 16),
    }


# -- made, read and dropped in a store ----------------------------------------------------------


def write_days(store: TableStore, days: int, step: float = 3600.0, *, first: int = 0) -> None:
    """Hourly cycles of three GPUs from H + ``first`` days to H + ``days`` days: GPU 0's
    workload (allocated, its memory not held) changes every five hours and idles a varying
    share (the hour's part keeps any two workloads' sums apart: no ties to break), GPU 1 holds
    memory idle, GPU 2 has no pod."""
    seconds = first * 86400 + 3600.0
    while seconds <= days * 86400:
        hour = int(seconds // 3600)
        busy = gpu("0", util=float(hour % 97), idle=(hour % 7) / 7 + hour / 1e5, fb=100.0)
        busy = dataclasses.replace(busy, owner_name=f"job-{hour // 5}")
        held = gpu("1", "idle", util=0.0, idle=1.0, fb=30_000.0)
        store.publish(cycle(seconds, [busy, held, gpu("2", "idle", idle=1.0, pod=None)]))
        seconds += step


def make(url: str, now: datetime, **options: Any) -> int:
    database = Database(parse_store_url(url))
    try:
        return IdleBlocks(every=0.0, **{"limit": 1000, **options}).make(database, now)
    finally:
        database.close()


def waste(url: str, since: datetime, until: datetime, top: int = 2, **options: Any) -> list[Any]:
    return report(url, since, until, views=("waste",), top=top, **options).waste


def block_sums(url: str) -> dict[tuple[Any, ...], float]:
    return {
        (row["start"], row["days"], *(row[key] for key in KEY)): row["idle_gpu_seconds"]
        for row in rows(url, idle_block)
    }


def day_sums(
    url: str, made: set[tuple[datetime, int]], key: tuple[str, ...] = KEY
) -> dict[tuple[Any, ...], float]:
    """Each made block's idle seconds per ``key``, summed in Python from gpu_day: for
    ``GPU_KEY`` (idle_block_gpu), of the rows without an owner name only."""
    sums: dict[tuple[Any, ...], float] = defaultdict(float)
    for row in rows(url, gpu_day):
        if key == GPU_KEY and row["owner_name"] != "":
            continue
        for start, days in made:
            if start <= row["day"] < start + DAY * days and row["idle_gpu_seconds"] > 0:
                sums[(start, days, *(row[column] for column in key))] += row["idle_gpu_seconds"]
    return dict(sums)


def gpu_block_sums(url: str) -> dict[tuple[Any, ...], float]:
    return {
        (row["start"], row["days"], *(row[key] for key in GPU_KEY)): row["idle_gpu_seconds"]
        for row in rows(url, idle_block_gpu)
    }


def test_blocks_hold_gpu_days_idle_time_and_the_ranking_reads_them(store_url: str) -> None:
    """20 days written; blocks made: each equals gpu_day's rows summed; the waste report with
    them equals the one without. Scaling the blocks' rows changes the ranking's figures: the
    ranking reads them; the GPU counts still come from gpu_day."""
    store = TableStore(store_url)
    write_days(store, 20)
    store.close()
    since, until = H + timedelta(minutes=17), H + DAY * 20 - timedelta(minutes=3)
    before = waste(store_url, since, until)

    made = make(store_url, H + DAY * 22)
    stored = {(row["start"], row["days"]) for row in rows(store_url, idle_block_made)}
    assert made == len(stored) > 0
    assert {days for _, days in stored} >= {2, 4, 8}
    sums = block_sums(store_url)
    expected = day_sums(store_url, stored)
    assert sums.keys() == expected.keys()
    assert sums == pytest.approx(expected, rel=1e-12)
    gpus = gpu_block_sums(store_url)
    assert {key[2:] for key in gpus} == {(True, False, "", "", "node-a", "GPU-2", "")}
    assert gpus == pytest.approx(day_sums(store_url, stored, GPU_KEY), rel=1e-12)
    assert {key[:2] for key in gpus} == stored
    assert make(store_url, H + DAY * 22) == 0  # nothing more due

    after = waste(store_url, since, until)
    assert [(w.kind, w.owner_name, w.gpus) for w in after] == [
        (w.kind, w.owner_name, w.gpus) for w in before
    ]
    assert [w.idle_gpu_hours for w in after] == pytest.approx(
        [w.idle_gpu_hours for w in before], rel=1e-12
    )

    # A workload the top 2 left out, its blocks' idle time scaled up: the ranking lists it now.
    engine = create_store_engine(parse_store_url(store_url), create_file=False)
    allocated = [w for w in before if w.kind == "allocated-idle"]
    with engine.begin() as connection:
        left_out = connection.execute(
            sa.select(idle_block.c.owner_name)
            .where(
                idle_block.c.has_pod,
                ~idle_block.c.memory_held,
                idle_block.c.owner_name.not_in([w.owner_name for w in allocated]),
                idle_block.c.days == 8,  # inside the range: the plan takes it
            )
            .limit(1)
        ).scalar_one()
        connection.execute(
            sa.update(idle_block)
            .where(idle_block.c.owner_name == left_out)
            .values(idle_gpu_seconds=idle_block.c.idle_gpu_seconds * 1e6)
        )
    engine.dispose()
    assert left_out in {w.owner_name for w in waste(store_url, since, until)}


def ranked(url: str, since: datetime, until: datetime, **options: Any) -> list[tuple[Any, ...]]:
    """waste --top 2's rows: kind, workload, GPUs and idle hours."""
    return [
        (w.kind, w.namespace, w.owner_kind, w.owner_name, w.gpus, w.idle_gpu_hours)
        for w in waste(url, since, until, **options)
    ]


def assert_ranked_equal(got: list[tuple[Any, ...]], expected: list[tuple[Any, ...]]) -> None:
    assert [row[:5] for row in got] == [row[:5] for row in expected]
    assert [row[5] for row in got] == pytest.approx([row[5] for row in expected], rel=1e-9)


def assert_later_days_rank_as_raw(
    url: str, writer: Callable[..., None], first: int, days: int
) -> None:
    """The current writer adds days ``first`` to ``days`` and their blocks are made: waste
    --top 2 from the first row to then equals the raw rows' ranking."""
    store = TableStore(url)
    writer(store, days, first=first)
    store.close()
    assert make(url, H + DAY * (days + 2)) > 0
    since, until = H + timedelta(minutes=17), H + DAY * days
    assert_ranked_equal(ranked(url, since, until), ranked(url, since, until, rollups=False))


def test_waste_holds_on_old_and_new_rows_across_0015_down_and_up(store_url: str) -> None:
    """Twelve days written and their blocks made: waste --top 2 equals the raw rows' ranking.
    Down to 0014 (the blocks go, the rows stay) and up again: the same, from gpu_day; the same
    with the old rows' blocks made again; and over twenty days once the current writer has
    added eight more and their blocks are made."""
    engine = create_store_engine(parse_store_url(store_url), create_file=True)
    try:
        store = TableStore(store_url)
        write_days(store, 12)
        store.close()
        since, until = H + timedelta(minutes=17), H + DAY * 12
        reference = ranked(store_url, since, until, rollups=False)
        assert make(store_url, H + DAY * 14) > 0
        assert_ranked_equal(ranked(store_url, since, until), reference)

        migrate(engine, "0014_workload_indexes", down=True)
        blocks = {"idle_block", "idle_block_gpu", "idle_block_made"}
        assert not blocks & set(sa.inspect(engine).get_table_names())
        migrate(engine, "head")
        assert rows(store_url, idle_block_made) == []
        assert_ranked_equal(ranked(store_url, since, until), reference)
        assert make(store_url, H + DAY * 14) > 0
        assert_ranked_equal(ranked(store_url, since, until), reference)

        assert_later_days_rank_as_raw(store_url, write_days, 12, 20)
    finally:
        engine.dispose()


def test_0016_fills_the_gpus_of_the_blocks_made_before_it(store_url: str) -> None:
    """Blocks made: waste --top 2 equals the raw rows'. Down to 0015 (idle_block_gpu goes, the
    blocks stay made) and up again: the upgrade fills each made block's GPUs from gpu_day as
    the writer made them, and waste lists the same; and over sixteen days once the current
    writer has added six more and their blocks are made."""
    engine = create_store_engine(parse_store_url(store_url), create_file=True)
    try:
        store = TableStore(store_url)
        write_unowned_days(store, 10)
        store.close()
        since, until = H + timedelta(minutes=17), H + DAY * 10
        assert make(store_url, H + DAY * 12) > 0
        made = rows(store_url, idle_block_made)
        written, listed = gpu_block_sums(store_url), ranked(store_url, since, until)
        assert_ranked_equal(listed, ranked(store_url, since, until, rollups=False))

        migrate(engine, "0015_idle_blocks", down=True)
        assert "idle_block_gpu" not in sa.inspect(engine).get_table_names()
        assert rows(store_url, idle_block_made) == made
        migrate(engine, "head")
        filled = gpu_block_sums(store_url)
        assert filled.keys() == written.keys()
        assert filled == pytest.approx(written, rel=1e-12)
        assert_ranked_equal(ranked(store_url, since, until), listed)

        assert_later_days_rank_as_raw(store_url, write_unowned_days, 10, 16)
    finally:
        engine.dispose()


def test_a_range_with_a_node_ranks_from_gpu_day(store_url: str) -> None:
    """Blocks hold no node: the report of one node reads its days from gpu_day. Before any
    block is made there is no second relation."""
    store = TableStore(store_url)
    write_days(store, 10)
    store.close()
    engine = create_store_engine(parse_store_url(store_url), create_file=False)
    since, until = H, H + DAY * 10
    try:
        with engine.connect() as connection:  # no block made yet: the relation serves
            assert gpu_history(connection, since=since, until=until).idle is None
        make(store_url, H + DAY * 12)
        with engine.connect() as connection:
            assert gpu_history(connection, since=since, until=until).idle is not None
            one = gpu_history(connection, since=since, until=until, node="node-a")
            assert one.idle is None
    finally:
        engine.dispose()


def write_unowned_days(store: TableStore, days: int, *, first: int = 0) -> None:
    """Hourly cycles of four GPUs from H + ``first`` days to H + ``days`` days: GPU 0 held by
    a PyTorchJob's pod, idle a tenth; GPU 2 with no pod; GPU 3 with no pod for the first five
    days, then a Job's; GPU 4 with no pod for three days, then a pod without a controller in
    namespace lab, idle throughout."""
    seconds = first * 86400 + 3600.0
    while seconds <= days * 86400:
        day_index = int(seconds // 86400)
        owned = gpu("0", util=90.0, idle=0.1, fb=100.0)
        no_pod = gpu("2", "idle", idle=1.0, fb=100.0, pod=None)
        three = gpu("3", "idle", idle=0.5, fb=100.0, pod=None)
        if day_index >= 5:
            three = dataclasses.replace(
                gpu("3", idle=0.5, fb=100.0, pod="batch-0"), owner_kind="Job", owner_name="batch"
            )
        four = gpu("4", "idle", idle=1.0, fb=100.0, pod=None)
        if day_index >= 3:
            four = dataclasses.replace(
                gpu("4", "idle", idle=1.0, fb=100.0, pod="bare-0"),
                namespace="lab",
                owner_kind=None,
                owner_name=None,
            )
        store.publish(cycle(seconds, [owned, no_pod, three, four]))
        seconds += 3600.0


def test_waste_counts_the_gpus_of_workloads_without_an_owner_from_the_blocks(
    store_url: str,
) -> None:
    """Ten days of GPUs with no pod and a pod without a controller, their blocks made:
    waste --top 2 lists the same GPUs and hours as the raw rows. A GPU added to a made block's
    idle_block_gpu (and to no other table) is counted: the count reads that table."""
    store = TableStore(store_url)
    write_unowned_days(store, 10)
    store.close()
    since, until = H + timedelta(minutes=17), H + DAY * 10
    reference = ranked(store_url, since, until, rollups=False)
    assert [row[:5] for row in reference if row[3] is None] == [
        ("idle-no-pod", None, None, None, 3),
        ("allocated-idle", "lab", None, None, 1),
    ]
    assert make(store_url, H + DAY * 12) > 0
    assert_ranked_equal(ranked(store_url, since, until), reference)

    made = {(row["start"], row["days"]) for row in rows(store_url, idle_block_made)}
    start, days = max(made, key=lambda block: block[1])  # the largest: the plan takes it
    engine = create_store_engine(parse_store_url(store_url), create_file=False)
    with engine.begin() as connection:
        connection.execute(
            sa.insert(idle_block_gpu).values(
                start=start, days=days, memory_held=False, has_pod=False, namespace="",
                owner_kind="", node="node-z", uuid="GPU-z", gpu_i_id="", idle_gpu_seconds=60.0,
            )
        )  # fmt: skip
    engine.dispose()
    unclaimed = [row for row in ranked(store_url, since, until) if row[0] == "idle-no-pod"]
    assert [row[4] for row in unclaimed] == [4]


def test_blocks_under_days_retention_dropped_go_and_are_not_read(store_url: str) -> None:
    """gpu_day's oldest days deleted (retention): the report skips the blocks over them at
    once, and the next call drops them."""
    store = TableStore(store_url)
    write_days(store, 12)
    store.close()
    make(store_url, H + DAY * 14)
    made = {(row["start"], row["days"]) for row in rows(store_url, idle_block_made)}
    first = min(start for start, _ in made)
    engine = create_store_engine(parse_store_url(store_url), create_file=False)
    with engine.begin() as connection:
        connection.execute(sa.delete(gpu_day).where(gpu_day.c.day < first + DAY))
    engine.dispose()
    since, until = first, H + DAY * 12
    fresh = waste(store_url, since, until, top=0)  # every group, from gpu_day
    assert [(w.kind, w.owner_name) for w in waste(store_url, since, until, top=100)] == [
        (w.kind, w.owner_name) for w in fresh
    ]
    make(store_url, H + DAY * 14)
    kept = {(row["start"], row["days"]) for row in rows(store_url, idle_block_made)}
    assert kept == {(start, days) for start, days in made if start >= first + DAY}
    assert {row["start"] for row in rows(store_url, idle_block)} <= {start for start, _ in kept}


def test_a_late_cycle_drops_the_blocks_of_its_days_and_they_are_made_again(
    store_url: str,
) -> None:
    """node-b's cycle of 10 June fails to commit (the store is down), and is written with its
    next cycle, on 20 June: the blocks holding 10 June go in that transaction, the others stay;
    made again, every block equals gpu_day's rows summed, and the ranking lists the same
    groups as from gpu_day alone."""
    store = TableStore(store_url)
    write_days(store, 20)
    store.close()
    made = make(store_url, H + DAY * 20)
    before = {(row["start"], row["days"]) for row in rows(store_url, idle_block_made)}
    assert made == len(before) > 0
    late = dataclasses.replace(
        gpu("0", "idle", idle=1.0, fb=100.0),
        hostname="node-b",
        uuid="GPU-b0",
        owner_name="late-job",
    )
    node_b = TableStore(store_url)

    def store_down(*_: Any) -> None:
        raise node_b._database.errors[0]("the store is down")

    held_back = dataclasses.replace(
        cycle(0, [late]), node="node-b", at=H + DAY * 9 + timedelta(hours=12)
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(node_b, "_upsert_pods", store_down)
        with pytest.raises(StoreError):
            node_b.publish(held_back)
    assert [row for row in rows(store_url, gpu_window) if row["node"] == "node-b"] == []
    node_b.publish(dataclasses.replace(held_back, at=H + DAY * 19 + timedelta(hours=12)))
    node_b.close()
    kept = {(row["start"], row["days"]) for row in rows(store_url, idle_block_made)}
    june_10 = datetime(2026, 6, 10, tzinfo=UTC)  # the cycle's 30 minutes: in 10 June only
    holding = set(blocks_over(june_10, june_10 + DAY))
    assert kept == before - holding
    assert before & holding  # some were made, and dropped

    assert make(store_url, H + DAY * 20) == len(before & holding)
    again = {(row["start"], row["days"]) for row in rows(store_url, idle_block_made)}
    assert again == before
    assert block_sums(store_url) == pytest.approx(day_sums(store_url, again), rel=1e-12)
    assert gpu_block_sums(store_url) == pytest.approx(
        day_sums(store_url, again, GPU_KEY), rel=1e-12
    )
    since, until = H, H + DAY * 20
    ranked = waste(store_url, since, until, top=3)
    full = waste(store_url, since, until, top=0)
    assert "late-job" in {w.owner_name for w in full}
    for kind in {w.kind for w in full}:
        mine = [w for w in full if w.kind == kind][:3]
        assert [(w.owner_name, w.gpus) for w in ranked if w.kind == kind] == [
            (w.owner_name, w.gpus) for w in mine
        ]


def test_a_call_makes_at_most_its_limit_smallest_first(store_url: str) -> None:
    store = TableStore(store_url)
    write_days(store, 12)
    store.close()
    assert make(store_url, H + DAY * 14, limit=2) == 2
    assert {row["days"] for row in rows(store_url, idle_block_made)} == {LEVELS[0]}
    assert make(store_url, H + DAY * 14, limit=1000) > 0
    assert make(store_url, H + DAY * 14, limit=1000) == 0


def test_the_store_makes_blocks_when_due(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """TableStore makes the due blocks after a cycle once it is due (here at once)."""
    monkeypatch.setattr(sink, "IdleBlocks", functools.partial(IdleBlocks, every=0.0))
    store = TableStore(store_url)
    write_days(store, 6)
    store.close()
    assert rows(store_url, idle_block_made) != []


@pytest.mark.integration
def test_one_daemon_makes_blocks_at_a_time(postgres_server: PostgresServer) -> None:
    """With the advisory lock held elsewhere, make() returns -1 and writes nothing."""
    url = postgres_server.create_database()
    store = TableStore(url)
    write_days(store, 6)
    store.close()
    database, other = Database(parse_store_url(url)), Database(parse_store_url(url))
    try:
        with other.transaction() as cursor:
            cursor.execute(f"SELECT pg_advisory_xact_lock({IDLE_BLOCK_LOCK_ID})")
            assert IdleBlocks(every=0.0).make(database, H + DAY * 8) == -1
        assert rows(url, idle_block_made) == []
        assert IdleBlocks(every=0.0).make(database, H + DAY * 8) > 0
    finally:
        database.close()
        other.close()


@pytest.mark.integration
def test_a_late_cycle_waits_for_blocks_being_made(postgres_server: PostgresServer) -> None:
    """While another daemon holds the blocks' advisory lock (making blocks), a cycle reaching
    back three days waits for it before dropping blocks, then commits."""
    url = postgres_server.create_database()
    store = TableStore(url)
    write_days(store, 8)
    make(url, H + DAY * 8)
    other = Database(parse_store_url(url))
    # A new GPU's first row covers the whole window: three days, back into made blocks.
    late = cycle(8 * 86400, [gpu("7", "idle", fb=100.0)])
    late = dataclasses.replace(late, window_seconds=3 * 86400.0)
    done = threading.Event()
    writer = threading.Thread(target=lambda: (store.publish(late), done.set()))
    try:
        with other.transaction() as cursor:
            cursor.execute(f"SELECT pg_advisory_xact_lock({IDLE_BLOCK_LOCK_ID})")
            writer.start()
            waiting = False
            for _ in range(200):
                cursor.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                )
                waiting = cursor.fetchone()[0] > 0
                if waiting:
                    break
                time.sleep(0.05)
            assert waiting
            assert not done.is_set()
        writer.join(timeout=30)
        assert done.is_set()
    finally:
        store.close()
        other.close()

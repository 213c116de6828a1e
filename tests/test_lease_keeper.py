"""The run's lease keeper and the executor's fence, on a real SQLite state DB (decision 121).

A stall is the event loop blocked (``time.sleep`` inside a provider call): what a
SIGSTOP, a GC pause or a suspended VM does to a flow. The guarantee under test: while
the lease's local deadline holds, admissions cost no DB round trip; once it has passed,
no new call starts before the database confirmed the lease, and a lease taken over
meanwhile admits nothing more.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from blockbuster import BlockBuster

from steerflow.errors import LeaseLostError
from steerflow.executor import FlowExecutor, build_graph
from steerflow.orchestrate._lease import LeaseKeeper, LeaseLoss
from steerflow.plan import parse_plan
from steerflow.providers import PlanRequest, Provider, ProviderRequest, ProviderResponse
from steerflow.state import STATE_DB_URL_ENV, Owner, ResumeClaim, StateDB
from waiting import wait_until, wait_until_async

pytestmark = pytest.mark.timeout(60)

RUN = "20260101T000000-aaaaaa"
ELSEWHERE = Owner(host="host-elsewhere", pid=4242, started_at=None)


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StateDB:
    monkeypatch.delenv(STATE_DB_URL_ENV, raising=False)
    opened = StateDB.open(tmp_path / "home")
    yield opened  # type: ignore[misc]
    opened.close()


def _db_now(db: StateDB) -> float:
    return float(db.backend.query(f"SELECT {db.backend.clock_sql} AS now")[0]["now"])


def _take_over(home: Path) -> str:
    """Another process's resume of RUN, through its own connection."""
    with StateDB.open(home) as other:
        claim = ResumeClaim(RUN, fork=False, has_checkpoint=lambda _run: False)
        return other.create_session(kind="flow", run_id="20260101T000001-bbbbbb", resume=claim).id


async def test_admissions_within_the_lease_cost_no_round_trip(db: StateDB) -> None:
    row = db.create_session(kind="flow", run_id=RUN, owner=ELSEWHERE, lease_s=30.0)
    keeper = LeaseKeeper(db, row.id, row.lease_epoch, lease_s=30.0)
    assert not keeper.fresh()  # nothing is admitted before the first confirmation
    assert await keeper.hold()
    assert (keeper.renewals, keeper.waited) == (1, 1)
    for _ in range(10_000):
        assert keeper.fresh() and await keeper.hold()
    assert (keeper.renewals, keeper.waited) == (1, 1)


async def test_the_heartbeat_renews_a_lease_that_is_still_fresh(db: StateDB) -> None:
    row = db.create_session(kind="flow", run_id=RUN, owner=ELSEWHERE, lease_s=30.0)
    keeper = LeaseKeeper(db, row.id, row.lease_epoch, lease_s=30.0)
    # A quarter lease is 7.5 s; shortened so the test need not wait: every renewal after
    # the first happens while the lease is fresh, which is the heartbeat other hosts read.
    keeper.interval_s = 0.02
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(keeper.run(stop))
        await wait_until_async(lambda: keeper.renewals >= 5, timeout=20, what="five renewals")
        stop.set()
    renewed = db.get_session(row.id)
    assert renewed is not None and renewed.heartbeat_at is not None
    assert renewed.heartbeat_at > (row.heartbeat_at or 0) and keeper.fresh()
    assert renewed.lease_expires is not None and row.lease_expires is not None
    assert renewed.lease_expires > row.lease_expires
    assert keeper.waited == 0  # nobody waited: the lease never ran out


async def test_after_a_stall_the_next_admission_asks_the_database(db: StateDB) -> None:
    row = db.create_session(kind="flow", run_id=RUN, owner=ELSEWHERE, lease_s=1.0)
    keeper = LeaseKeeper(db, row.id, row.lease_epoch, lease_s=1.0)
    assert await keeper.hold()
    # the stall under test (the loop is blocked): past the lease, no takeover
    wait_until(lambda: not keeper.fresh(), timeout=30, what="the lease's local deadline")
    assert not keeper.fresh()
    assert await keeper.hold()
    assert (keeper.renewals, keeper.waited) == (2, 2)
    assert keeper.fresh()


class _Stalling(Provider):
    """Blocks the loop in its first call until another process has taken the lease over."""

    spec = "test"

    def __init__(self, during: threading.Thread, bb: BlockBuster) -> None:
        self.during = during
        self.bb = bb
        self.invoked: list[str] = []

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        self.invoked.append(request.node_key)
        if len(self.invoked) == 1:
            self.during.start()
            self.bb.deactivate()  # the stall is the point: the blocking call is on purpose
            try:
                # the stall: no task runs until the other process has taken the lease over
                self.during.join(timeout=30)
                assert not self.during.is_alive(), "the takeover did not happen within 30 s"
            finally:
                self.bb.activate()
        return ProviderResponse(text=f"done {request.node_key}")

    async def plan(self, request: PlanRequest) -> object:
        raise AssertionError("not a planner")


async def test_a_lease_taken_over_during_a_stall_admits_nothing_more(
    db: StateDB, tmp_path: Path, blockbuster: BlockBuster
) -> None:
    assert db.path is not None
    row = db.create_session(kind="flow", run_id=RUN, owner=ELSEWHERE, lease_s=1.0)
    keeper = LeaseKeeper(db, row.id, row.lease_epoch, lease_s=1.0)
    taker: list[str] = []

    def take_over_once_expired() -> None:
        home = db.path.parent  # type: ignore[union-attr]

        def lapsed(other: StateDB) -> bool:
            # the lease as last renewed, against the database's clock (not this process's)
            current = other.get_session(row.id)
            assert current is not None and current.lease_expires is not None
            return _db_now(other) > current.lease_expires

        with StateDB.open(home) as other:
            wait_until(lambda: lapsed(other), timeout=30, what="the lease to run out")
        taker.append(_take_over(home))

    provider = _Stalling(threading.Thread(target=take_over_once_expired), blockbuster)
    plan = parse_plan(
        {"plan": [{"agent_id": f"n{i}", "instruction": "x"} for i in range(4)]}, source="t"
    )
    executor = FlowExecutor(
        build_graph(plan),
        provider_for=lambda op: provider,
        run_id=RUN,
        home=tmp_path,
        artifact_dir=lambda key: tmp_path / "legs" / key,
        concurrency=1,
    )
    losses: list[LeaseLoss] = []
    keeper.on_lost += [
        losses.append,
        lambda loss: executor.close_admission(loss.reason, cancel_inflight=True),
    ]
    executor.fence = keeper
    assert await keeper.hold()
    await executor.run()
    assert provider.invoked == ["n0"], "a call started after the stall without a DB check"
    assert [type(loss.error) for loss in losses] == [LeaseLostError]
    assert taker and taker[0] in str(losses[0].error) and "host-elsewhere" not in taker
    statuses = {op.key: op.status for op in executor.graph}
    assert statuses == {"n0": "completed", "n1": "pending", "n2": "pending", "n3": "pending"}
    assert executor.admission_reason == "taken-over"

"""A provider whose node calls run as Ray tasks: the executor cannot tell it from local.

The request is rendered here (steers, dependencies) and sent whole; the response comes back
as a local call's would, with where it ran in ``placement``. A cancellation of the node's
task (``ctl stop --now``, SIGINT, a deadline for an agent worker) cancels the remote call:
first as the provider's own cancellation, then, if it does not end in time, by killing
its worker. A worker or node that dies mid-call fails the node: Ray's own task retries are
off, so nothing runs twice behind the executor's back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from types import ModuleType
from typing import Any, Protocol

from steerflow.cluster._placement import describe_request, ray_options
from steerflow.cluster._worker import CANCEL_GRACE_S, TICK_S, steerflow_version
from steerflow.errors import ProviderError
from steerflow.providers import PlanReply, PlanRequest, Provider, ProviderRequest, ProviderResponse


class RayCluster(Protocol):
    """What a :class:`RayProvider` uses of the connected cluster (``_connect.RayCluster``)."""

    ray: ModuleType
    task: Any

    def unplaceable(
        self, roles: Mapping[str | None, Mapping[str, float] | None], *, fresh: bool = False
    ) -> list[tuple[str | None, str]]: ...


__all__ = ["RayProvider", "ray_provider"]


def ray_provider(
    inner: Provider,
    cluster: RayCluster,
    resources_for: Callable[[str | None], Mapping[str, float] | None],
) -> Provider:
    """``inner`` with its node calls on ``cluster``, keeping its class-level traits."""
    traits = {
        "cancel_at_deadline": inner.cancel_at_deadline,
        "deadline_grace_s": getattr(inner, "deadline_grace_s", None),
        "needs_artifact_dir": inner.needs_artifact_dir,
        "reports_usage": inner.reports_usage,
    }
    cls = type(f"Ray{type(inner).__name__}", (RayProvider,), traits)
    provider: Provider = cls(inner, cluster, resources_for)
    return provider


class RayProvider(Provider):
    """Dispatches :meth:`invoke` to the cluster; planning stays in the flow process."""

    def __init__(
        self,
        inner: Provider,
        cluster: RayCluster,
        resources_for: Callable[[str | None], Mapping[str, float] | None],
    ) -> None:
        self.inner = inner
        self.spec = inner.spec
        self._cluster = cluster
        self._resources_for = resources_for
        self._version = steerflow_version()

    async def invoke(self, request: ProviderRequest) -> ProviderResponse:
        resources = self._resources_for(request.assignee)
        await self._check_placeable(request.assignee, resources)
        task = self._cluster.task.options(**ray_options(resources))
        # The live sink is this process's; the worker hands its output back instead.
        calls = task.remote(self.inner.portable_spec(), replace(request, live=None), self._version)
        try:
            return await self._follow(calls, request)
        except asyncio.CancelledError:
            await self._cancel(calls)
            raise

    async def _check_placeable(
        self, role: str | None, resources: Mapping[str, float] | None
    ) -> None:
        # Ray keeps a task no node can take pending until one joins: a flow would wait
        # silently. Checked against the alive nodes before each dispatch instead.
        missing = await asyncio.to_thread(self._cluster.unplaceable, {role: resources})
        if missing:
            raise ProviderError(
                f"ray: no alive node can place this call ({describe_request(resources)}): "
                f"{missing[0][1]}"
            )

    async def _follow(self, calls: Any, request: ProviderRequest) -> ProviderResponse:
        ray = self._cluster.ray
        placement: dict[str, object] | None = None
        try:
            async for item in _items(calls):
                kind = item[0]
                if kind == "start":
                    placement = item[1]
                elif kind == "out":
                    request.emit(item[1])
                elif kind == "error":
                    # the text a local call would have failed the node with
                    raise ProviderError(item[2])
                elif kind == "done":
                    response: ProviderResponse = item[1]
                    response.placement = placement
                    return response
        except ray.exceptions.RayError as exc:
            raise ProviderError(_lost(exc, placement)) from None
        raise ProviderError(f"ray: the call ended without a result{_where(placement)}")

    async def _cancel(self, calls: Any) -> None:
        ray = self._cluster.ray
        ray.cancel(calls, force=False)  # lands at the worker's next yield (a tick at most)
        try:
            await asyncio.wait_for(_drain(calls), TICK_S + CANCEL_GRACE_S)
        except TimeoutError:
            ray.cancel(calls, force=True)  # the call would not end: its worker is killed
        except asyncio.CancelledError:
            ray.cancel(calls, force=True)  # cancelled again while waiting: no more grace
            raise
        except Exception:
            return

    async def plan(self, request: PlanRequest) -> object:
        return await self.inner.plan(request)

    async def plan_with_usage(self, request: PlanRequest) -> PlanReply:
        return await self.inner.plan_with_usage(request)

    def portable_spec(self) -> str:
        return self.inner.portable_spec()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _items(calls: Any) -> AsyncIterator[tuple[Any, ...]]:
    async for ref in calls:
        yield await ref


async def _drain(calls: Any) -> None:
    async for _ in _items(calls):
        pass


def _where(placement: Mapping[str, object] | None) -> str:
    if not placement:
        return ""
    node = str(placement.get("node_id") or "?")[:8]
    return f" (node {node}, {placement.get('node_ip')}, pid {placement.get('pid')})"


def _lost(exc: BaseException, placement: Mapping[str, object] | None) -> str:
    """What a node whose call Ray lost records: which failure, and where it ran."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"ray: {type(exc).__name__}: the call was lost{_where(placement)}: {first}"

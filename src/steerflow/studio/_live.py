"""What a live page polls: a run's ``show --json``, read again only after something changed.

Every open Run page asks every 500 ms. Reading a 1,000-node run for each of them would
keep a core busy, so the answer is cached per run under a change tag: the state DB's
``data_version`` on one long-lived read connection (it moves whenever another connection
commits: a node published, a control stamped, a status set) plus the checkpoint files'
size and mtime (SQLite only: on PostgreSQL every poll reads). A poll whose tag is
unchanged is answered from the cache, or with 304 when the page sent that tag back
(``If-None-Match``). The tag is taken before the read, so a change during the read only
makes the next poll read again.

A dead owner commits nothing, so a run last read ``running`` also has its tag move every
:data:`RUNNING_RECHECK_S`: the read then reports it ``interrupted`` (``state.effective_status``)
within that time, while the other runs keep their tag until something changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

from steerflow import views
from steerflow.home import is_run_id
from steerflow.state import StateDB, db_exists
from steerflow.studio._pages import RunsQuery, runs_live
from steerflow.studio._runs_list import runs_of

__all__ = ["LiveRuns"]

#: Runs whose answer is kept (the least recently asked for is dropped first).
CACHED_RUNS = 64
#: How often an answer that said ``running`` is read again although nothing committed.
RUNNING_RECHECK_S = 1.0


class LiveRuns:
    """The live answers of one studio process (thread-safe)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._lock = threading.Lock()
        self._db: StateDB | None = None
        self._cache: OrderedDict[str, tuple[str, bytes]] = OrderedDict()
        #: Cache keys whose last answer had a run ``running`` (see the module doc).
        self._running: set[str] = set()

    def close(self) -> None:
        """Close the read connection."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _version(self) -> int | None:
        with self._lock:
            if self._db is None:
                if not db_exists(self.home):
                    return None
                self._db = StateDB.open(self.home, create=False)
            if self._db.location.startswith(("postgres://", "postgresql://")):
                # There data_version counts control inserts only, not node publications:
                # no tag, so every poll reads (correct, and costlier).
                return None
            return self._db.data_version()

    def tag(self, target: str) -> str | None:
        """The change tag of run ``target`` (a run id), or None when it cannot be had."""
        if not is_run_id(target):
            return None  # a session id names no run directory to watch
        version = self._version()
        if version is None:
            return None
        parts = [str(version)]
        run_dir = self.home / "runs" / target
        for name in ("checkpoint.json", "checkpoint.json.journal"):
            try:
                st = os.stat(run_dir / name)
            except FileNotFoundError:
                parts.append("-")
            else:
                parts.append(f"{st.st_ino:x}.{st.st_size:x}.{st.st_mtime_ns:x}")
        parts.append(self._recheck(target))
        digest = hashlib.blake2b("|".join(parts).encode(), digest_size=12).hexdigest()
        return f'W/"{digest}"'

    def runs_tag(self, query: RunsQuery) -> str | None:
        """The change tag of one page of the runs list (the state DB alone holds it)."""
        version = self._version()
        if version is None:
            return None
        key = "runs?" + query.params()
        recheck = self._recheck(key)
        digest = hashlib.blake2b(f"{key}|{version}|{recheck}".encode(), digest_size=12)
        return f'W/"{digest.hexdigest()}"'

    def runs_answer(self, query: RunsQuery, limit: int) -> tuple[str | None, bytes]:
        """``(tag, the Runs page's live JSON)``, read again only after a commit."""
        key = "runs?" + query.params()
        tag = self.runs_tag(query)
        if tag is not None:
            with self._lock:
                cached = self._cache.get(key)
                if cached is not None and cached[0] == tag:
                    return cached
        listed, _ = runs_of(self.home, query, limit)
        progress = views.run_progress(self.home, [r.session_id for r in listed])
        body = json.dumps(runs_live(listed, progress)).encode()
        if tag is not None:
            self._remember(key, tag, body, running=any(r.status == "running" for r in listed))
        return tag, body

    def _recheck(self, key: str) -> str:
        """A part of the tag that moves every ``RUNNING_RECHECK_S`` while ``key`` runs."""
        with self._lock:
            running = key in self._running
        return str(int(time.monotonic() // RUNNING_RECHECK_S)) if running else "-"

    def _remember(self, key: str, tag: str, body: bytes, *, running: bool) -> None:
        with self._lock:
            if running:
                self._running.add(key)
            else:
                self._running.discard(key)
            self._cache[key] = (tag, body)
            self._cache.move_to_end(key)
            while len(self._cache) > CACHED_RUNS:
                self._cache.popitem(last=False)

    def answer(self, target: str) -> tuple[str | None, bytes]:
        """``(tag, show --json bytes)`` of run ``target``.

        Raises:
            UnknownIdError, AmbiguousIdError: ``target`` names no run or several.
        """
        tag = self.tag(target)
        if tag is not None:
            with self._lock:
                cached = self._cache.get(target)
                if cached is not None and cached[0] == tag:
                    self._cache.move_to_end(target)
                    return cached
        view = views.show_run(self.home, target)
        shown = view.to_json()
        # The page reloads its control log when this moves (a control sent from anywhere).
        shown["control_count"] = (
            len(views.control_status(self.home, view.session_id).controls)
            if view.session_id and view.has_session
            else 0
        )
        body = json.dumps(shown, default=str).encode()
        if tag is not None:
            self._remember(target, tag, body, running=view.status == "running")
        return tag, body

"""Running layout searches so that no request can pin the server.

A search is CPU-bound numpy work that stops itself at its time budget, but only between batches of
plans: one batch of a pathological question (thousands of explicit layers on 1,024 GPUs) can run
for minutes, and a Python thread cannot be stopped. So, by default, each search runs in its own
process (forked from a warm `forkserver` that has the model and tuner already imported, a few
milliseconds to start), which is killed when it overruns `budget + SEARCH_GRACE_S`; the request then
gets a 503. The child also arms an alarm on itself, so even a search orphaned by a killed server
ends. Processes also let two searches use two cores (threads would share one GIL).

`SearchRunner` sits in front: it answers repeated questions from the response cache, lets
identical concurrent questions share one search, runs at most `workers` searches at a time and
refuses (503) more than `max_pending` waiting ones instead of queueing without end.
`isolation="thread"` runs searches in threads instead (tests that replace the search use it).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import signal
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from api import service

log = logging.getLogger("gridtune.api")

SEARCH_GRACE_S = 10.0
"""Seconds a search may run past its budget before its process is killed and the answer is 503."""
STARTUP_SLACK_S = 30.0
PRELOAD = ("api.service", "perfmodels.steptime", "tuner.search", "tuner.launch", "tuner.trials", "numpy.ma")
"""What a search process runs (`service.run_recommend`: the search, the best plan's launches, the
trial advice; numpy.ma, which np.unique loads on first call), imported once in the forkserver.
`import tuner` alone does not import the search (tuner/__init__.py), so the modules are named;
tests/test_startup.py checks that a search imports nothing outside the standard library beyond them."""


def search_context() -> Any:
    """The multiprocessing context searches run in: `forkserver` (with PRELOAD imported once), else
    `spawn`. No module state here: the standard library keeps one forkserver per process, and each
    SearchRunner holds the context it was built with."""
    try:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))  # modules that fail to import are skipped
    except ValueError:  # no forkserver on this platform
        ctx = multiprocessing.get_context("spawn")
    return ctx


def warm_up(ctx: Any) -> None:
    """Start the forkserver (it imports numpy and the model once) so the first search is fast."""
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def _child(job: service.RecommendJob, conn: Any, limit_s: float) -> None:
    """Entry point of a search process: run, send one message, exit."""
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_REAL, limit_s)  # default SIGALRM action: the process ends
    try:
        data, complete = service.run_recommend(job)
        conn.send(("ok", data, complete))
    except service.InputError as exc:
        conn.send(("input", list(exc.loc), exc.msg))
    except service.Unavailable as exc:
        conn.send(("unavailable", str(exc)))
    except BaseException as exc:  # a bug: report it to the parent, which logs it
        conn.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    finally:
        conn.close()


def run_in_process(ctx: Any, job: service.RecommendJob, limit_s: float) -> tuple[bytes, bool]:
    """Run one search in a fresh process of `ctx`; kill it after `limit_s` seconds (blocking: call
    from a thread)."""
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(job, sender, limit_s + 2.0), daemon=True, name="gridtune-search")
    proc.start()
    sender.close()
    try:
        if not receiver.poll(limit_s):
            raise service.Unavailable(
                f"the search did not finish within {limit_s:g} s (time budget {job.time_budget_s:g} s) "
                "and was stopped; pin more of the search or ask about fewer GPUs"
            )
        message = receiver.recv()
    except EOFError:
        raise service.Unavailable(
            f"the search process ended without an answer (exit code {proc.exitcode})"
        ) from None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(10)
        receiver.close()
    kind = message[0]
    if kind == "ok":
        return message[1], bool(message[2])
    if kind == "input":
        raise service.InputError(tuple(message[1]), message[2])
    if kind == "unavailable":
        raise service.Unavailable(message[1])
    raise RuntimeError(f"the search failed: {message[1]}\n{message[2]}")


class SearchRunner:
    """Bounded, cached, de-duplicated searches (see the module docstring)."""

    def __init__(self, *, workers: int, max_pending: int, cache: service.ResponseCache,
                 isolation: str = "process") -> None:
        if isolation not in ("process", "thread"):
            raise ValueError(f"search isolation must be 'process' or 'thread', got {isolation!r}")
        self.workers = workers
        self.max_pending = max_pending
        self.cache = cache
        self.isolation = isolation
        self.context = search_context() if isolation == "process" else None
        self.pending = 0
        self._inflight: dict[str, asyncio.Future[bytes]] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self.workers, thread_name_prefix="gridtune-search"
                )
            return self._executor

    def start(self) -> None:
        """Warm the search processes' forkserver in the background (server start-up)."""
        if self.isolation == "process":
            threading.Thread(target=warm_up, args=(self.context,), name="gridtune-search-warmup",
                             daemon=True).start()

    def stop(self) -> None:
        """Drop queued searches; running ones end at their limit (processes) or on their own (threads)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    async def run(self, job: service.RecommendJob) -> bytes:
        hit = self.cache.get(job.key)
        if hit is not None:
            return hit
        shared = self._inflight.get(job.key)
        if shared is not None:
            return await asyncio.shield(shared)
        owner: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._inflight[job.key] = owner
        try:
            data = await self._search(job)
        except BaseException as exc:
            if not owner.done():
                owner.set_exception(exc)
                owner.exception()  # retrieved: waiters re-raise it, nobody logs "never retrieved"
            raise
        else:
            owner.set_result(data)
            return data
        finally:
            self._inflight.pop(job.key, None)

    async def _search(self, job: service.RecommendJob) -> bytes:
        if self.pending >= self.max_pending:
            raise service.Unavailable(f"{self.pending} searches are already waiting; retry later")
        self.pending += 1  # only touched on the event loop thread
        try:
            loop = asyncio.get_running_loop()
            limit = job.time_budget_s + SEARCH_GRACE_S
            if self.isolation == "process":
                future = loop.run_in_executor(self.executor(), run_in_process, self.context, job, limit)
            else:
                future = loop.run_in_executor(self.executor(), service.run_recommend, job)
            # a safety net only (the process is killed at `limit`): queueing behind other searches
            # and a cold process start come on top
            wait_s = 2 * limit + STARTUP_SLACK_S
            try:
                data, complete = await asyncio.wait_for(future, timeout=wait_s)
            except asyncio.TimeoutError:
                raise service.Unavailable(
                    f"the search did not finish within {wait_s:g} s (time budget {job.time_budget_s:g} s); "
                    "retry later"
                ) from None
            if complete:
                self.cache.put(job.key, data)
            return data
        finally:
            self.pending -= 1

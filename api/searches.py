"""Running layout searches so that no request can pin the server, and answering them warm.

A search is CPU-bound numpy work that stops itself at its time budget, but only between batches of
plans: one batch of a pathological question (thousands of explicit layers on 1,024 GPUs) can run
for minutes, and a Python thread cannot be stopped. So, by default, searches run in a `WorkerPool`
of long-lived worker processes, one per search that may run at once (`workers`, one per CPU by
default, GRIDTUNE_SEARCH_WORKERS). The workers are forked from a `forkserver` that has imported
PRELOAD once (started in the background at server start-up, with the workers); each loops: receive
a job over its pipe, run `service.run_recommend`, send back one message ("ok", "input",
"unavailable" or "error"), wait for the next. The first search warms a worker (numpy's and the
model's first-call costs: a cold process's first GPT-3 175B search on 1,024 GPUs took ~150 ms where
warm ones took 55-105 ms) and it stays warm: a search costs its own time plus a pipe round trip,
with no process start per request.
Processes also let two searches use two cores (threads would share one GIL).

The guarantees of a process per search are kept. A worker whose search overruns
`budget + SEARCH_GRACE_S` is killed and a fresh worker takes its place; the request gets a 503. A
worker that crashes or ends without an answer is reaped and replaced the same way (503, "ended
without an answer"). Each job also arms an alarm on the worker itself, and a worker exits when its
pipe reaches EOF, so neither a search nor an idle worker outlives a killed server. A worker is
also replaced after WORKER_MAX_SEARCHES searches or once it holds more than WORKER_MAX_RSS_BYTES.
`SearchRunner.stop()` ends every worker.

`SearchRunner` sits in front: it answers repeated questions from the response cache, lets
identical concurrent questions share one search, runs at most `workers` searches at a time (one
executor thread per worker, each waiting on its worker's pipe) and refuses (503, Retry-After) more
than `max_pending` waiting ones instead of queueing without end. `isolation="thread"` runs searches
in threads instead (tests that replace the search use it).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import queue
import signal
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from api import service

log = logging.getLogger("gridtune.api")

SEARCH_GRACE_S = 10.0
"""Seconds a search may run past its budget before its worker is killed (and replaced) and the answer
is 503."""
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


def _reply(job: service.RecommendJob) -> tuple[Any, ...]:
    """Run one search and word its outcome as the one message a worker sends back: ("ok", data,
    complete), ("input", loc, msg), ("unavailable", msg) or ("error", summary, traceback)."""
    try:
        data, complete = service.run_recommend(job)
        return ("ok", data, complete)
    except service.InputError as exc:
        return ("input", list(exc.loc), exc.msg)
    except service.Unavailable as exc:
        return ("unavailable", str(exc))
    except Exception as exc:  # a bug: report it to the parent, which logs it
        return ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())


def _serve(conn: Any) -> None:
    """Entry point of a search worker: take (job, limit_s) from `conn`, answer one message, wait for
    the next, until the server closes its end (EOF: the server stopped the pool or died). Each job
    arms an alarm of `limit_s` on the worker itself (default SIGALRM action: the process ends), so a
    search orphaned by a killed server ends too."""
    if hasattr(signal, "SIGINT"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C is the server's: it stops the workers
    alarm = hasattr(signal, "setitimer")
    try:
        while True:
            try:
                job, limit_s = conn.recv()
            except (EOFError, OSError):
                return
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, limit_s)
            message = _reply(job)
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
            try:
                conn.send(message)
            except OSError:  # the server is gone
                return
    finally:
        conn.close()


class _Worker:
    """One long-lived search process of `ctx` and the server's end of its pipe."""

    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_serve, args=(child,), daemon=True, name="gridtune-search")
        try:
            self.proc.start()
        except BaseException:
            self.conn.close()
            raise
        finally:
            child.close()
        self.pid: int = self.proc.pid
        self.searches = 0

    def run(self, job: service.RecommendJob, limit_s: float) -> tuple[Any, ...]:
        """Send one job and wait up to `limit_s` for its message. Raises TimeoutError when none came
        in time, EOFError (or OSError) when the process ended without one."""
        self.searches += 1
        self.conn.send((job, limit_s + 2.0))
        if not self.conn.poll(limit_s):
            raise TimeoutError
        return self.conn.recv()

    def end(self) -> None:
        """Kill the process (a no-op if it ended), reap it and close the pipe and the process handle."""
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)
        self.conn.close()
        if self.proc.exitcode is not None:
            self.proc.close()  # its sentinel now, not whenever the garbage collector runs


PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
WORKER_MAX_SEARCHES = 1000
"""A worker is replaced after this many searches ..."""
WORKER_MAX_RSS_BYTES = 2 << 30
"""... or once it holds more than this much memory after a search (a huge search's heap is not
always returned to the system): a fresh one starts in its place."""


def _rss_bytes(pid: int) -> int | None:
    """Resident memory of process `pid` (Linux /proc), None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


class WorkerPool:
    """`size` warm search processes forked from the forkserver of `ctx`. Each request's thread takes
    an idle worker (starting one when its slot is empty), sends it the job and waits for the answer;
    a worker that overruns its limit is killed, one that crashes is reaped, and either is replaced by a
    fresh process before the request gets its 503. There are as many slots as threads that use them
    (SearchRunner's executor), so taking one never waits for long."""

    def __init__(self, ctx: Any, size: int) -> None:
        self.ctx = ctx
        self.size = size
        self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        for _ in range(size):
            self._idle.put(None)  # an empty slot: a worker starts there when first needed
        self._live: dict[int, _Worker] = {}
        self._lock = threading.Lock()
        self.closed = False

    def pids(self) -> list[int]:
        """The process ids of the live workers, idle or busy."""
        with self._lock:
            return sorted(pid for pid, w in self._live.items() if w.proc.is_alive())

    def _start(self) -> _Worker | None:
        worker = _Worker(self.ctx)
        with self._lock:
            if not self.closed:
                self._live[worker.pid] = worker
                return worker
        worker.end()  # the pool was closed while it started
        return None

    def _drop(self, worker: _Worker) -> None:
        with self._lock:
            self._live.pop(worker.pid, None)
        worker.end()

    def _release(self, worker: _Worker | None, *, healthy: bool) -> None:
        """Give a slot back: the worker if it may go on, else a fresh one started in its place (or an
        empty slot, where the next search starts one, if that start fails)."""
        if worker is not None and (not healthy or self.closed):
            self._drop(worker)
            worker = None
            if not healthy and not self.closed:
                try:
                    worker = self._start()
                except Exception:  # the next search tries again, or says why not
                    log.exception("could not start a search worker")
        if not self.closed:
            self._idle.put(worker)

    def _take(self) -> _Worker | None:
        while True:
            if self.closed:
                raise service.Unavailable("the service is stopping; retry later")
            try:
                return self._idle.get(timeout=1.0)
            except queue.Empty:
                continue

    def fill(self) -> None:
        """Start a worker in every empty idle slot (server start-up, in the background)."""
        for _ in range(self.size):
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                return
            if worker is None and not self.closed:
                try:
                    worker = self._start()
                except Exception:  # the first search starts it, or says why not
                    log.exception("could not start a search worker")
            self._release(worker, healthy=True)

    def run(self, job: service.RecommendJob, limit_s: float) -> tuple[bytes, bool]:
        """Run one search on an idle worker; blocking (call from a thread)."""
        if self.closed:
            raise service.Unavailable("the service is stopping; retry later")
        worker = self._take()
        healthy = False
        try:
            if worker is None or not worker.proc.is_alive():  # an empty slot, or a worker that died idle
                if worker is not None:
                    self._drop(worker)
                    worker = None
                try:
                    worker = self._start()
                except Exception as exc:  # said in the 503
                    log.exception("could not start a search worker")
                    raise service.Unavailable(
                        f"could not start a search process ({exc}); retry later"
                    ) from None
                if worker is None:
                    raise service.Unavailable("the service is stopping; retry later")
            try:
                message = worker.run(job, limit_s)
            except TimeoutError:
                raise service.Unavailable(
                    f"the search did not finish within {limit_s:g} s (time budget {job.time_budget_s:g} s) "
                    "and was stopped; pin more of the search or ask about fewer GPUs"
                ) from None
            except (EOFError, OSError):
                if self.closed:
                    raise service.Unavailable("the service is stopping; retry later") from None
                worker.proc.join(1)
                raise service.Unavailable(
                    f"the search process ended without an answer (exit code {worker.proc.exitcode}) "
                    "and was replaced; retry"
                ) from None
            healthy = worker.searches < WORKER_MAX_SEARCHES and (
                (_rss_bytes(worker.pid) or 0) <= WORKER_MAX_RSS_BYTES
            )
        finally:
            self._release(worker, healthy=healthy)
        kind = message[0]
        if kind == "ok":
            return message[1], bool(message[2])
        if kind == "input":
            raise service.InputError(tuple(message[1]), message[2])
        if kind == "unavailable":
            raise service.Unavailable(message[1])
        raise RuntimeError(f"the search failed: {message[1]}\n{message[2]}")

    def close(self) -> None:
        """End every worker, idle or busy (a busy one's request gets a 503), and start none again."""
        with self._lock:
            self.closed = True
            workers = list(self._live.values())
            self._live.clear()
        for worker in workers:
            if worker.proc.is_alive():
                worker.proc.kill()
        for worker in workers:
            worker.proc.join(10)
        while True:  # idle ones: close their pipes (busy ones' threads close theirs)
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                break
            if worker is not None:
                worker.conn.close()


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
        self._pool: WorkerPool | None = None
        self._lock = threading.Lock()

    def executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self.workers, thread_name_prefix="gridtune-search"
                )
            return self._executor

    def pool(self) -> WorkerPool:
        """The search processes (isolation "process"): one per executor thread."""
        with self._lock:
            if self._pool is None:
                self._pool = WorkerPool(self.context, self.workers)
            return self._pool

    def worker_pids(self) -> list[int]:
        """Process ids of the live search workers (none with isolation "thread" or before any started)."""
        with self._lock:
            pool = self._pool
        return pool.pids() if pool is not None else []

    def start(self) -> None:
        """Start the forkserver and the search workers in the background (server start-up), so the
        first searches find warm processes waiting."""
        if self.isolation == "process":
            pool = self.pool()

            def warm() -> None:
                warm_up(self.context)
                pool.fill()

            threading.Thread(target=warm, name="gridtune-search-warmup", daemon=True).start()

    def stop(self) -> None:
        """Drop queued searches and end the search workers (a search still running gets a 503; with
        isolation "thread" it ends on its own). A later `start` or search starts a new pool."""
        with self._lock:
            executor, self._executor = self._executor, None
            pool, self._pool = self._pool, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        if pool is not None:
            pool.close()

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
                future = loop.run_in_executor(self.executor(), self.pool().run, job, limit)
            else:
                future = loop.run_in_executor(self.executor(), service.run_recommend, job)
            # a safety net only (the worker is killed at `limit`): queueing behind other searches
            # and a worker's start come on top
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

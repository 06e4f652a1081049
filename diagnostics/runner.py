"""run(target, job) → Result, and a bounded fan-out over many targets.

Every outcome becomes a Result: the runtime's framed document when one came back (let in only
through ``wire.read_result``: a malformed one is the target's ``protocol`` row), otherwise an
``error`` classified by the hop that failed (DESIGN.md §3 invariants 4 and 8).  Nothing raises out of
``run_one`` except KeyboardInterrupt.
"""

import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Callable, List, Optional, Sequence, Union

from . import bundle, redact, wire
from .errors import InputError
from .hops import chain_for, local
from .hops.base import (TransportError, concurrent_runs_allowed, descriptors_error, first_line,
                        out_of_descriptors)
from .hops.ssh import SshPool, SshTransport
from .results import Result
from .topology import Target

DEFAULT_PARALLEL = 32
# Beyond the target-side timeout, how long the client waits before giving up on a silent link.
CLIENT_GRACE_S = 15.0


def _tail(data: bytes, limit: int = 8192) -> str:
    return data[-limit:].decode("utf-8", "replace")


def run_one(target: Target, job: bundle.Job, pool: SshPool) -> Result:
    """The target's result, secrets masked (DESIGN.md §3: nothing secret in any output)."""
    result = _run_one(target, job, pool)
    clean = Result.from_dict(redact.redact_document(result.to_dict(), target.env_dict))
    clean.duration_s = result.duration_s
    return clean


def _run_one(target: Target, job: bundle.Job, pool: SshPool) -> Result:
    started = time.monotonic()
    timeout = job.timeout if job.timeout is not None else target.timeout

    def failed(layer, message, **kw) -> Result:
        return Result.failure(job.diagnostic, target.name, layer, message,
                              duration_s=time.monotonic() - started, **kw)

    try:
        chain = chain_for(target, pool)
        nonce = bundle.new_nonce()
        header = bundle.build_header(job, target=target.name, timeout=timeout,
                                     env=target.env_dict, activate=target.activate,
                                     python=target.python, nonce=nonce, tmpdir=target.tmpdir)
        payload = bundle.build_payload(header, bundle.job_files(job))
        deadline = time.monotonic() + timeout + CLIENT_GRACE_S
        output = chain.transport.run(chain.argv(), payload, deadline)
    except TransportError as exc:
        return failed(exc.layer, exc.message, stderr=exc.stderr)
    except InputError:
        raise
    except Exception as exc:  # a bug of ours: say so, with the traceback
        if out_of_descriptors(exc):
            found = descriptors_error(f"{type(exc).__name__}: {exc}")
            return failed(found.layer, found.message)
        return failed("internal", f"{type(exc).__name__}: {exc}", type=type(exc).__name__,
                      traceback=traceback.format_exc())

    stderr = _tail(output.stderr)
    try:
        doc = wire.read_result(output.stdout, nonce)
    except wire.ProtocolError as exc:
        return failed("protocol", f"the target answered with a malformed result: {exc}",
                      type="ProtocolError", stderr=stderr)
    if doc is not None:
        result = Result.from_dict(doc)
        result.target = target.name
        result.duration_s = time.monotonic() - started
        return result
    if output.timed_out:
        return failed("timeout", f"no answer within {timeout:g} s + {CLIENT_GRACE_S:g} s grace "
                      "(the link may be down; the target-side timeout stops the diagnostic)",
                      stderr=stderr)
    found = chain.classify(output.exit_code, stderr, _tail(output.stdout, 2048))
    if found:
        layer, reason = found
        return failed(layer, reason, stderr=stderr)
    if output.lost:
        return failed("unreachable", f"{output.lost} before a result arrived", stderr=stderr)
    if wire.FRAME_BEGIN.split(" ")[0].encode() in output.stdout:
        return failed("protocol", "the target answered with a malformed result: no complete "
                      "result frame for this run", type="ProtocolError", stderr=stderr)
    reason = first_line(stderr) or f"exit code {output.exit_code}, no result"
    return failed("internal", f"no result from the runtime: {reason}", stderr=stderr)


class SlurmAllocation:
    """A login target's allocation: one row target per node, released with ``release()``."""

    def __init__(self, target: Target, pool: SshPool, job: bundle.Job):
        self.target = target
        self.pool = pool
        self.job = job
        self.jobid: Optional[str] = None
        self.rows: List[Target] = []
        self.failure: Optional[Result] = None
        self._login = None
        self._lock = threading.Lock()
        self._released = False
        self._requested = False      # salloc was sent: a job (pending or granted) may exist
        from .hops import slurm
        self.job_name = slurm.job_name()   # unique: a pending request is cancelled by its name

    def allocate(self) -> "SlurmAllocation":
        from dataclasses import replace
        from .hops import slurm
        started = time.monotonic()
        t = self.target
        base = t.name.split(":", 1)[0]
        queue_timeout = self.job.timeout if self.job.timeout is not None else t.timeout
        try:
            login = chain_for(replace(t, slurm=None, container=None, become=None), self.pool).transport
            with self._lock:
                if self._released:
                    raise TransportError("unreachable", f"salloc on {base}: the run was interrupted")
                self._login, self._requested = login, True
            deadline = time.monotonic() + queue_timeout + CLIENT_GRACE_S
            out = login.run(slurm.salloc_argv(t.slurm, queue_timeout, self.job_name), b"", deadline)
            text = (out.stderr + out.stdout).decode("utf-8", "replace")
            with self._lock:
                self.jobid = slurm.parse_granted(text)
                released_meanwhile = self._released
            if released_meanwhile:   # released while salloc ran: granted meanwhile, or not
                self._cancel()
                raise TransportError("unreachable", f"salloc on {base}: the run was interrupted")
            if not self.jobid:
                reason = first_line("\n".join(l for l in text.splitlines() if "error" in l.lower())
                                    or text) or f"exit {out.exit_code}"
                raise TransportError("unreachable", f"salloc on {base} got no allocation: {reason}",
                                     text[-4000:])
            nodes = slurm.node_names(t.slurm)
            if not nodes:
                out = self._login.run(slurm.squeue_nodes_argv(self.jobid), b"", deadline)
                try:
                    nodes = slurm.allocated_nodes(out.stdout.decode("utf-8", "replace"))
                except ValueError as exc:
                    raise TransportError("unreachable", f"allocation {self.jobid} on {base}: {exc}",
                                         (out.stderr + out.stdout[:4000]).decode("utf-8", "replace"))
            self.rows = [replace(t, name=f"{base}:{node}", slurm_step=(self.jobid, node))
                         for node in nodes]
        except TransportError as exc:
            self.failure = Result.failure(self.job.diagnostic, t.name, exc.layer, exc.message,
                                          stderr=exc.stderr, duration_s=time.monotonic() - started)
        except Exception as exc:
            self.failure = Result.failure(self.job.diagnostic, t.name, "internal",
                                          f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(),
                                          duration_s=time.monotonic() - started)
        return self

    def release(self) -> None:
        """``scancel`` the allocation; called once the run is over, in every outcome. While
        salloc still waits in the queue (an interrupted run), the pending request is cancelled
        by its job name: closing the SSH channel does not end a salloc that has no terminal."""
        with self._lock:
            self._released = True
            requested = self._requested
        if requested:
            self._cancel()

    def _cancel(self) -> None:
        from .hops import slurm
        argv = slurm.scancel_argv(self.jobid) if self.jobid else slurm.scancel_name_argv(self.job_name)
        try:
            self._login.run(argv, b"", time.monotonic() + 30)
        except Exception:
            pass


def _expand_slurm(targets: Sequence[Target], job_for, pool: SshPool, ex,
                  allocations: List["SlurmAllocation"]) -> List[object]:
    """Each Slurm login target becomes its allocation (made in parallel); others stay.
    Each allocation joins ``allocations`` before it is waited for, so an interrupt during
    the queue wait still releases it."""
    pending = {}
    for i, t in enumerate(targets):
        if t.slurm is not None and t.slurm_step is None:
            allocation = SlurmAllocation(t, pool, job_for(t))
            allocations.append(allocation)
            pending[i] = ex.submit(allocation.allocate)
    return [pending[i].result() if i in pending else t for i, t in enumerate(targets)]


def run_many(targets: Sequence[Target], job: Union[bundle.Job, Callable[[Target], bundle.Job]], *,
             parallel: int = DEFAULT_PARALLEL, pool: Optional[SshPool] = None,
             on_result: Optional[Callable[[Result], None]] = None) -> List[Result]:
    """Run ``job`` (or ``job(target)``) on every target, at most ``parallel`` at a time.

    ``on_result`` sees each result as it arrives (for --save and progress); the returned list
    is in target order. One slow or dead target delays no other target's report."""
    job_for = job if callable(job) else (lambda target: job)
    own_pool = pool is None
    pool = pool or SshPool()
    # NOTE: each target in flight holds descriptors; past RLIMIT_NOFILE they fail with EMFILE
    workers = max(1, min(parallel, 256, concurrent_runs_allowed()))
    ex = ThreadPoolExecutor(max_workers=workers)
    allocations: List[SlurmAllocation] = []
    try:
        # Slurm login targets become one row per node; a failed allocation is its own row.
        planned: List[Union[Target, Result]] = []
        for item in _expand_slurm(targets, job_for, pool, ex, allocations):
            if isinstance(item, SlurmAllocation):
                planned.extend([item.failure] if item.failure else item.rows)
            else:
                planned.append(item)
        results: List[Optional[Result]] = [p if isinstance(p, Result) else None for p in planned]
        # NOTE: resolving runs `ssh -G` (a child with pipes): fewer at once than the runs
        with ThreadPoolExecutor(max_workers=max(1, workers // 2)) as resolver:
            endpoints = list(resolver.map(lambda p: _endpoint_of(p, pool), planned))
        for endpoint in endpoints:
            if endpoint is not None:
                pool.plan(endpoint)

        def run_and_finish(i: int) -> Result:
            try:
                return run_one(planned[i], job_for(planned[i]), pool)
            finally:
                if endpoints[i] is not None:
                    pool.finished(endpoints[i])

        futures = {ex.submit(run_and_finish, i): i
                   for i, p in enumerate(planned) if not isinstance(p, Result)}
        for i, r in enumerate(results):
            if r is not None and on_result:
                on_result(r)
        for fut in as_completed(futures):
            result = fut.result()
            results[futures[fut]] = result
            if on_result:
                on_result(result)
        return results
    except KeyboardInterrupt:   # Ctrl-C, TERM, HUP: local children are told as remote ones are
        local.stop_running()
        raise
    finally:
        # On Ctrl-C: drop queued targets; closing the pool below ends the running ones
        # (their runtimes see stdin close and kill the diagnostics).
        ex.shutdown(wait=False, cancel_futures=True)
        for allocation in allocations:
            allocation.release()
        if own_pool:
            pool.close()


def _endpoint_of(planned: Union[Target, Result], pool: SshPool):
    """The SSH endpoint a planned target connects through (None: local, or not resolvable;
    run_one then reports why)."""
    if isinstance(planned, Result) or planned.local:
        return None
    try:
        transport = chain_for(planned, pool).transport
    except Exception:
        return None
    return transport.endpoint if isinstance(transport, SshTransport) else None

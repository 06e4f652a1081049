"""run(target, job) → Result, and a bounded fan-out over many targets.

Every outcome becomes a Result: the runtime's framed document when one came back (let in only
through ``wire.read_result``: a malformed one is the target's ``protocol`` row), otherwise an
``error`` classified by the hop that failed (docs/architecture.md, invariants 4 and 8).  Nothing raises out of
``run_one`` except KeyboardInterrupt.
"""

import time
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import bundle, shards
from ..core import redact, wire
from ..core.errors import InputError
from ..transport import chain_for, local, sshg_cache, transport_for
from ..transport.base import (TransportError, concurrent_runs_allowed, descriptors_error, first_line,
                        out_of_descriptors)
from ..transport.slurm import SlurmAllocation, SrunStep, allocate_all
from ..transport.held import HeldTransport
from ..transport.ssh import SshPool, SshTransport
from ..core.results import Result
from ..inventory.topology import Target

DEFAULT_PARALLEL = 32
RESOLVERS = 16   # `ssh -G` children at once while a run resolves its targets' endpoints
# Beyond the target-side timeout, how long the client waits before giving up on a silent link.
CLIENT_GRACE_S = 15.0
# on_progress(target name, record): a record from wire.ProgressReader, or None when the target
# starts (its run begins: a live display counts its time from there).
OnProgress = Callable[[str, Optional[Dict[str, Any]]], None]


def _tail(data: bytes, limit: int = 8192) -> str:
    return data[-limit:].decode("utf-8", "replace")


def run_one(target: Target, job: bundle.Job, pool: SshPool, *,
            step: Optional[SrunStep] = None, on_progress: Optional[OnProgress] = None) -> Result:
    """The target's result, secrets masked (docs/architecture.md, invariant 8: nothing secret in any output).
    ``step``: run as that step of a Slurm allocation (a node row). ``on_progress``: the
    runtime is asked for progress lines and each one let in is passed on as it arrives, secrets
    masked (its text is still the target's: shown only through ``render.safe_text``)."""
    result = _run_one(target, job, pool, step, on_progress)
    clean = Result.from_dict(redact.redact_document(result.to_dict(), target.env_dict))
    clean.duration_s = result.duration_s
    return clean


class _ProgressRelay:
    """Passes one target's progress records on, with its secrets masked as its result's are
    (docs/architecture.md, invariant 8: nothing secret in any output). Output is passed on in whole lines (a secret
    cut in two by a chunk boundary would escape the masks), the last piece of a line at the end.
    A display that fails stops receiving records; the run goes on (a live line is a courtesy,
    the result is what counts)."""

    LINE_LIMIT = 64 * 1024     # a longer line is passed on in pieces

    def __init__(self, name: str, nonce: str, env: Dict[str, str], on_progress: OnProgress):
        self.name, self.on_progress = name, on_progress
        self.secrets = redact.known_secrets(env)
        self.partial = {stream: "" for stream in wire.PROGRESS_STREAMS}
        self.broken = False
        self.reader = wire.ProgressReader(nonce, self.record)

    def _pass(self, record: Optional[Dict[str, Any]]) -> None:
        if not self.broken:
            try:
                self.on_progress(self.name, record)
            except Exception:
                self.broken = True

    def start(self) -> None:
        self._pass(None)

    def record(self, record: Dict[str, Any]) -> None:
        record = dict(record)
        for key in ("text", "source"):
            if key in record:
                record[key] = redact.redact_text(record[key], self.secrets)
        output = []
        for stream, text in record.pop("output", ()):
            lines = (self.partial[stream] + text).split("\n")
            self.partial[stream] = lines.pop()
            whole = "".join(line + "\n" for line in lines)
            if len(self.partial[stream]) > self.LINE_LIMIT:
                whole, self.partial[stream] = whole + self.partial[stream], ""
            if whole:
                output.append((stream, redact.redact_text(whole, self.secrets)))
        if output:
            record["output"] = output
        self._pass(record)

    def finish(self) -> None:
        """What is left of lines that never ended (the script's last line without a newline)."""
        output = [(stream, redact.redact_text(text, self.secrets))
                  for stream, text in self.partial.items() if text]
        if output:
            self._pass({"seq": self.reader.last_seq + 1, "t": 0.0, "output": output})


def _run_one(target: Target, job: bundle.Job, pool: SshPool, step: Optional[SrunStep],
             on_progress: Optional[OnProgress] = None) -> Result:
    started = time.monotonic()
    timeout = job.timeout if job.timeout is not None else target.timeout

    def failed(layer, message, **kw) -> Result:
        return Result.failure(job.diagnostic, target.name, layer, message,
                              duration_s=time.monotonic() - started, **kw)

    try:
        chain = chain_for(target, pool, step)
        nonce = bundle.new_nonce()
        header = bundle.build_header(job, target=target.name, timeout=timeout,
                                     env=target.env_dict, activate=target.activate,
                                     python=target.python, nonce=nonce, tmpdir=target.tmpdir,
                                     code_cache=target.code_cache)
        watch, relay = {}, None   # no progress asked for: the transport is called as before
        if on_progress is not None:
            header = dict(header, progress=True)
            relay = _ProgressRelay(target.name, nonce, target.env_dict, on_progress)
            watch = {"on_stdout": relay.reader.feed}
            relay.start()
        payload = bundle.build_payload(header, bundle.job_files(job))
        deadline = time.monotonic() + timeout + CLIENT_GRACE_S
        output = chain.transport.run(chain.argv(), payload, deadline, **watch)
        if relay is not None:
            relay.finish()
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
        doc = wire.read_result(output.stdout, nonce, job.script_name if job.team else None)
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


def run_many(targets: Sequence[Target], job: Union[bundle.Job, Callable[[Target], bundle.Job]], *,
             parallel: int = DEFAULT_PARALLEL, pool: Optional[SshPool] = None,
             on_result: Optional[Callable[[Result], None]] = None,
             on_progress: Optional[OnProgress] = None,
             keep_allocations: Optional[Dict[str, SlurmAllocation]] = None,
             workers: Optional[int] = None) -> List[Result]:
    """Run ``job`` (or ``job(target)``) on every target, at most ``parallel`` at a time.

    ``on_result`` sees each result as it arrives (for --save and progress); the returned list
    is in target order. One slow or dead target delays no other target's report.
    ``on_progress``: see ``run_one`` (called from the worker threads).
    ``keep_allocations``: Slurm allocations by login target name, reused when there and kept
    there when granted here, not released at the end: the caller (a runbook, whose steps share
    them) releases them. Without it each run allocates and releases its own.
    ``workers``: worker processes to spread the targets over (``shards.py``); None: as many as
    the fan-out is worth (``$MLDIAG_WORKERS`` overrides), and never with a caller's pool or
    allocations."""
    job_for = job if callable(job) else (lambda target: job)
    # NOTE: the connection holder (transport/held.py) is one process: a fan-out past one process's
    # share (shards.py), and a worker's share of one, is faster with connections of its own.
    hold = pool is None and workers is None and len(targets) <= shards.MIN_TARGETS_PER_WORKER
    if workers is None:
        workers = 1 if pool is not None or keep_allocations is not None else \
            shards.worker_count(targets, shards.requested_workers())
    elif workers > 1:
        workers = shards.worker_count(targets, workers)
    if workers > 1:
        return shards.run(targets, job_for, workers, parallel=parallel, run_many=run_many,
                          on_result=on_result, on_progress=on_progress)
    own_pool = pool is None
    pool = pool or SshPool()
    pool.hold = hold
    # NOTE: each target in flight holds descriptors; past RLIMIT_NOFILE they fail with EMFILE
    workers = max(1, min(parallel, 256, concurrent_runs_allowed()))
    stopper = local.Stopper()       # this fan-out's local children (an interrupt stops them)
    ex = ThreadPoolExecutor(max_workers=workers, initializer=local.answer_to, initargs=(stopper,))
    allocations: List[SlurmAllocation] = []
    try:
        planned = _plan(targets, job_for, pool, ex, allocations, keep_allocations)
        results: List[Optional[Result]] = [p if isinstance(p, Result) else None for p in planned]
        # NOTE: resolving runs `ssh -G` (a child with pipes): fewer at once than the runs, and
        # at most RESOLVERS (128 at once at --parallel 256 was about 1 GB of short-lived children)
        # (the batch: the config's state read once, this run's new `ssh -G` answers kept)
        with sshg_cache.batch(), \
                ThreadPoolExecutor(max_workers=max(1, min(workers // 2, RESOLVERS))) as resolver:
            endpoints = list(resolver.map(lambda p: _endpoint_of(p, pool), planned))
        for endpoint in endpoints:
            if endpoint is not None:
                pool.plan(endpoint)

        def run_and_finish(i: int) -> Result:
            target, step = planned[i]
            try:
                job = job_for(target)
                result = run_one(target, job, pool, step=step, on_progress=on_progress)
                second = job.follow_up(result) if job.follow_up is not None else None
                if second is not None:
                    first = result
                    result = run_one(target, second, pool, step=step, on_progress=on_progress)
                    result.duration_s += first.duration_s
                return result
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
        stopper.stop()
        raise
    finally:
        # On Ctrl-C: drop queued targets; closing the pool below ends the running ones
        # (their runtimes see stdin close and kill the diagnostics).
        ex.shutdown(wait=False, cancel_futures=True)
        kept = list((keep_allocations or {}).values())
        for allocation in allocations:
            if not any(allocation is k for k in kept):
                allocation.release()
        if own_pool:
            pool.close()


Placed = Tuple[Target, Optional[SrunStep]]   # a target, and the Slurm step it runs as (a node row)


def _plan(targets: Sequence[Target], job_for, pool: SshPool, ex,
          allocations: List[SlurmAllocation],
          keep: Optional[Dict[str, SlurmAllocation]] = None) -> List[Union[Placed, Result]]:
    """What runs: each target as it is, except that a Slurm login target becomes one row per
    node of its allocation (or, with none, its failure as its own row). ``keep``: allocations
    to reuse (by target name), and where a new one that was granted is put."""
    diagnostic_of = {}

    def allocation_for(t: Target) -> SlurmAllocation:
        if keep is not None and t.name in keep:
            return keep[t.name]          # granted for an earlier step: allocate() returns at once
        job = job_for(t)
        queue_timeout = job.timeout if job.timeout is not None else t.timeout
        allocation = SlurmAllocation(t, lambda: transport_for(t, pool), queue_timeout, CLIENT_GRACE_S)
        diagnostic_of[id(allocation)] = job.diagnostic
        return allocation

    planned: List[Union[Placed, Result]] = []
    for item in allocate_all(targets, allocation_for, ex.submit, allocations):
        if not isinstance(item, SlurmAllocation):
            planned.append((item, None))
        elif item.failure is None:
            if keep is not None:
                keep[item.target.name] = item
            planned.extend((row.target, row.step) for row in item.rows)
        else:
            planned.append(_allocation_failed(item, diagnostic_of[id(item)]))
    return planned


def place(targets: Sequence[Target], job_for, pool: SshPool,
          keep: Optional[Dict[str, SlurmAllocation]] = None
          ) -> Tuple[List[Union[Placed, Result]], Callable[[], None]]:
    """Each target where it will run, for runs that start several at once (engine/groups.py):
    a Slurm login target becomes its node rows (or its allocation's failure, a row of its own),
    as in ``run_many``. The second: releases the allocations made here (not those ``keep``
    holds: a runbook's, released by the runbook)."""
    allocations: List[SlurmAllocation] = []

    def release() -> None:
        kept = list((keep or {}).values())
        for allocation in allocations:
            if not any(allocation is k for k in kept):
                allocation.release()
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(len(targets), RESOLVERS))) as ex:
            return _plan(targets, job_for, pool, ex, allocations, keep), release
    except BaseException:
        release()
        raise


def _allocation_failed(allocation: SlurmAllocation, diagnostic: str) -> Result:
    exc, name = allocation.failure, allocation.target.name
    if isinstance(exc, TransportError):
        return Result.failure(diagnostic, name, exc.layer, exc.message, stderr=exc.stderr,
                              duration_s=allocation.duration_s)
    return Result.failure(diagnostic, name, "internal", f"{type(exc).__name__}: {exc}",
                          traceback=allocation.failure_traceback, duration_s=allocation.duration_s)


def _endpoint_of(planned: Union[Placed, Result], pool: SshPool):
    """The SSH endpoint a planned target connects through (None: local, or not resolvable;
    run_one then reports why)."""
    if isinstance(planned, Result) or planned[0].local:
        return None
    try:
        transport = transport_for(planned[0], pool)
    except Exception:
        return None
    return transport.endpoint if isinstance(transport, (SshTransport, HeldTransport)) else None

"""run(target, job) → Result, and a bounded fan-out over many targets.

Every outcome becomes a Result: the runtime's framed document when one came back, otherwise an
``error`` classified by the hop that failed (DESIGN.md §3 invariant 4).  Nothing raises out of
``run_one`` except KeyboardInterrupt.
"""

import json
import re
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Callable, List, Optional, Sequence, Union

from . import bundle
from .errors import InputError
from .hops import chain_for
from .hops.base import first_line
from .hops.ssh import SshPool, TransportError
from .results import Result
from .topology import Target

DEFAULT_PARALLEL = 32
# Beyond the target-side timeout, how long the client waits before giving up on a silent link.
CLIENT_GRACE_S = 15.0
_FRAME = re.compile(rb"@@MLDIAG-RESULT-BEGIN ([0-9a-f]+)@@\n(.*?)\n@@MLDIAG-RESULT-END \1@@", re.S)


def parse_frame(stdout: bytes, nonce: str) -> Optional[dict]:
    """The result document framed with this run's nonce; whatever else is on stdout is noise."""
    for match in _FRAME.finditer(stdout):
        if match.group(1).decode() == nonce:
            return json.loads(match.group(2).decode("utf-8"))
    return None


def _tail(data: bytes, limit: int = 8192) -> str:
    return data[-limit:].decode("utf-8", "replace")


def run_one(target: Target, job: bundle.Job, pool: SshPool) -> Result:
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
                                     python=target.python, nonce=nonce)
        payload = bundle.build_payload(header, bundle.job_files(job))
        deadline = time.monotonic() + timeout + CLIENT_GRACE_S
        output = chain.transport.run(chain.argv(), payload, deadline)
    except TransportError as exc:
        return failed(exc.layer, exc.message, stderr=exc.stderr)
    except InputError:
        raise
    except Exception as exc:  # a bug of ours: say so, with the traceback
        return failed("internal", f"{type(exc).__name__}: {exc}", type=type(exc).__name__,
                      traceback=traceback.format_exc())

    stderr = _tail(output.stderr)
    try:
        doc = parse_frame(output.stdout, nonce)
    except ValueError as exc:
        return failed("internal", f"unreadable result frame: {exc}", stderr=stderr)
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
    reason = first_line(stderr) or f"exit code {output.exit_code}, no result"
    return failed("internal", f"no result from the runtime: {reason}", stderr=stderr)


def run_many(targets: Sequence[Target], job: Union[bundle.Job, Callable[[Target], bundle.Job]], *,
             parallel: int = DEFAULT_PARALLEL, pool: Optional[SshPool] = None,
             on_result: Optional[Callable[[Result], None]] = None) -> List[Result]:
    """Run ``job`` (or ``job(target)``) on every target, at most ``parallel`` at a time.

    ``on_result`` sees each result as it arrives (for --save and progress); the returned list
    is in target order. One slow or dead target delays no other target's report."""
    job_for = job if callable(job) else (lambda target: job)
    own_pool = pool is None
    pool = pool or SshPool()
    results: List[Optional[Result]] = [None] * len(targets)
    try:
        if len(targets) == 1:
            results[0] = run_one(targets[0], job_for(targets[0]), pool)
            if on_result:
                on_result(results[0])
            return results
        ex = ThreadPoolExecutor(max_workers=max(1, min(parallel, len(targets))))
        try:
            futures = {ex.submit(run_one, t, job_for(t), pool): i for i, t in enumerate(targets)}
            for fut in as_completed(futures):
                result = fut.result()
                results[futures[fut]] = result
                if on_result:
                    on_result(result)
            return results
        finally:
            # On Ctrl-C: drop queued targets; closing the pool below ends the running ones
            # (their runtimes see stdin close and kill the diagnostics).
            ex.shutdown(wait=False, cancel_futures=True)
    finally:
        if own_pool:
            pool.close()

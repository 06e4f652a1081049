"""A large fan-out spread over worker processes, so the client's throughput grows with cores.

Each target's SSH work (paramiko's key exchange, ciphers and channel bookkeeping) is Python
code under one GIL: about 50 ms of one core per target, 50 s at 1,000 targets. Past
``MIN_TARGETS_PER_WORKER`` targets per core, ``runner.run_many`` forks workers here, each
running its share with its own connection pool and sending each result back as it arrives
(one JSON line per result on a pipe). This process keeps what the user sees: one table, one
``--save`` directory, one exit code, one live display, results in target order.

- Targets that share a connection stay in one worker: containers of one host, hosts behind
  one jump host (``shard_key``); targets on this machine share nothing. The split is by that key, balanced by target count.
- ``--parallel N`` stays the bound for the whole run: each worker gets its part of N.
- Workers are forked before this process starts any thread of the run, and end with
  ``os._exit`` (no atexit handler, no stdio buffer of ours is run or flushed twice).
- A worker that dies (killed, a bug) costs only its own targets, each an ``internal`` error row
  with what is known; the other workers' results stand.
- Ctrl-C reaches the workers with us (one process group); TERM or HUP sent to this process is
  passed on. Either way every worker is ended and reaped before the interrupt goes on.

Not sharded: runs with a caller's pool or Slurm allocations (a runbook's steps share them),
Slurm login targets (a node row belongs to its allocation), and small fan-outs.
``$MLDIAG_WORKERS`` overrides the count (1: never; N: N workers whenever there are N groups).
"""

import json
import os
import selectors
import signal
import sys
import threading
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence

from ..core.errors import InputError
from ..transport.sshconfig import Endpoint
from ..core.results import Result
from ..inventory.topology import Target

WORKERS_ENV = "MLDIAG_WORKERS"
# Below this many targets per core a second process costs more (its fork, its own connection
# setup) than it saves: 64 targets use 2 workers, 1,000 use every core.
MIN_TARGETS_PER_WORKER = 32
END_GRACE_S = 5.0        # how long interrupted workers get to close their connections
CRASHED = 70             # a worker's exit code after an exception of ours (its traceback was sent)


def shard_key(target: Target, endpoint: Optional[Endpoint] = None) -> tuple:
    """What a target's connection is shared by: the outermost SSH hop of its chain (the jump
    host, else the host itself), as ssh_config resolved it (``endpoint``: a ``ProxyJump`` there
    is seen only so), else as hosts.yaml writes it. A target on this machine shares nothing (its
    runs are local processes): a group of its own."""
    if target.local or target.host is None:
        return ("local", target.name)
    if endpoint is not None:
        while endpoint.jump is not None:
            endpoint = endpoint.jump
        return ("endpoint", endpoint.key)
    host = target.host
    while host.jump is not None:
        host = host.jump
    return ("ssh", host.address or host.name, host.port, host.user)


RESOLVERS = 8   # `ssh -G` children at once


def resolved_keys(targets: Sequence[Target]) -> List[tuple]:
    """``shard_key`` of each target after ssh_config (``ssh -G``, cached per alias in this
    process: the workers forked later inherit the answers). A target that does not resolve
    keeps its hosts.yaml key; its own run says why."""
    from concurrent.futures import ThreadPoolExecutor
    from ..transport import sshg_cache
    from ..transport.sshconfig import resolve

    def key(target: Target) -> tuple:
        if target.local or target.host is None:
            return shard_key(target)
        try:
            return shard_key(target, resolve(target.host))
        except Exception:
            return shard_key(target)

    # the executor is joined (no thread left at the fork); the batch keeps the new `ssh -G` answers
    with sshg_cache.batch(), ThreadPoolExecutor(max_workers=RESOLVERS) as ex:
        return list(ex.map(key, targets))


def requested_workers(environ=os.environ) -> Optional[int]:
    """``$MLDIAG_WORKERS`` as a count; None when unset or empty."""
    text = environ.get(WORKERS_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise InputError(f"${WORKERS_ENV} must be a whole number of worker processes, 1 or more "
                         f"(1: no workers); it is {text!r}")
    return int(text)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_count(targets: Sequence[Target], requested: Optional[int] = None,
                 cores: Optional[int] = None, keys: Optional[Sequence[tuple]] = None) -> int:
    """How many workers run ``targets``: 1 (this process alone) for a Slurm target among them
    or a small fan-out; never more than there are groups of targets sharing a connection
    (``keys``: each target's ``shard_key``; without them, as hosts.yaml writes the hosts)."""
    if any(t.slurm is not None for t in targets):
        return 1
    groups = len(set(keys if keys is not None else map(shard_key, targets)))
    if requested is not None:
        return max(1, min(requested, groups))
    cores = cores or _cores()
    return max(1, min(cores, len(targets) // MIN_TARGETS_PER_WORKER, groups))


def split(targets: Sequence[Target], workers: int,
          keys: Optional[Sequence[tuple]] = None) -> List[List[int]]:
    """Target indices per worker: whole groups (``keys``, else ``shard_key``), the largest first
    onto the worker with the fewest targets; each worker's indices in target order."""
    groups: Dict[tuple, List[int]] = {}
    for i, target in enumerate(targets):
        groups.setdefault(keys[i] if keys is not None else shard_key(target), []).append(i)
    shares: List[List[int]] = [[] for _ in range(workers)]
    for members in sorted(groups.values(), key=len, reverse=True):
        min(shares, key=len).extend(members)
    return [sorted(share) for share in shares if share]


def parallel_share(parallel: int, workers: int, index: int) -> int:
    """Worker ``index``'s part of ``--parallel``: together exactly ``parallel`` (at least 1 each)."""
    return max(1, parallel // workers + (1 if index < parallel % workers else 0))


class _Worker:
    def __init__(self, pid: int, fd: int, indices: List[int]):
        self.pid, self.fd, self.indices = pid, fd, indices
        self.buffer = b""
        self.crash: Optional[str] = None
        self.status: Optional[int] = None   # os.waitpid's status once reaped


def run(targets: Sequence[Target], job_for: Callable, workers: int, *, parallel: int,
        run_many: Callable[..., List[Result]],
        on_result: Optional[Callable[[Result], None]] = None,
        on_progress: Optional[Callable] = None) -> List[Result]:
    """``run_many`` over ``targets`` in up to ``workers`` forked processes (fewer when ssh_config
    joins hosts behind one jump host); the results in target order, each passed to
    ``on_result`` here as it arrives (see the module docstring)."""
    keys = resolved_keys(targets)
    shares = split(targets, min(workers, len(set(keys))), keys)
    if len(shares) == 1:
        return run_many(targets, job_for, parallel=parallel, on_result=on_result,
                        on_progress=on_progress, workers=1)
    sys.stdout.flush()
    sys.stderr.flush()
    started = time.monotonic()
    running: List[_Worker] = []
    try:
        for index, indices in enumerate(shares):
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:   # the worker: never returns
                os.close(read_fd)
                for other in running:
                    os.close(other.fd)
                _work(write_fd, [targets[i] for i in indices], job_for, run_many,
                      parallel_share(parallel, len(shares), index), on_progress is not None)
            os.close(write_fd)
            running.append(_Worker(pid, read_fd, indices))
        results: List[Optional[Result]] = [None] * len(targets)
        _collect(running, results, on_result, on_progress)
    except BaseException:
        _end(running)
        raise
    for worker in running:
        for i in worker.indices:
            if results[i] is None:
                results[i] = _lost(targets[i], job_for, worker, time.monotonic() - started)
                if on_result:
                    on_result(results[i])
    return results


def _work(fd: int, targets: List[Target], job_for, run_many, parallel: int,
          progress: bool) -> None:
    lock = threading.Lock()
    index = {t.name: i for i, t in enumerate(targets)}

    def send(message: dict) -> None:
        data = memoryview((json.dumps(message, separators=(",", ":")) + "\n").encode("utf-8"))
        with lock:
            while data:
                data = data[os.write(fd, data):]

    def result_arrived(result: Result) -> None:
        send({"i": index.get(result.target), "result": result.to_dict()})

    def progress_arrived(name: str, record) -> None:
        send({"progress": name, "record": record})

    code = 0
    try:
        run_many(targets, job_for, parallel=parallel, on_result=result_arrived,
                 on_progress=progress_arrived if progress else None, workers=1)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        code = CRASHED
        try:
            send({"crash": traceback.format_exc()})
        except BaseException:
            pass
    finally:
        os._exit(code)


def _collect(running: List[_Worker], results: List[Optional[Result]], on_result,
             on_progress) -> None:
    selector = selectors.DefaultSelector()
    for worker in running:
        selector.register(worker.fd, selectors.EVENT_READ, worker)
    open_count = len(running)
    while open_count:
        for key, _ in selector.select():
            worker: _Worker = key.data
            chunk = os.read(worker.fd, 1 << 16)
            if not chunk:
                selector.unregister(worker.fd)
                os.close(worker.fd)
                worker.fd = -1
                open_count -= 1
                _, worker.status = os.waitpid(worker.pid, 0)
                continue
            lines = (worker.buffer + chunk).split(b"\n")
            worker.buffer = lines.pop()
            # NOTE: these lines are our own forked worker's, not a target's: each result in them
            # was let in through wire.read_result there (bounded, checked, secrets masked)
            for line in lines:
                _dispatch(worker, json.loads(line), results, on_result, on_progress)
    selector.close()


def _dispatch(worker: _Worker, message: dict, results, on_result, on_progress) -> None:
    if "result" in message:
        i = message["i"]
        if i is None or not 0 <= i < len(worker.indices):
            return
        result = Result.from_dict(message["result"])
        results[worker.indices[i]] = result
        if on_result:
            on_result(result)
    elif "progress" in message:
        if on_progress:
            on_progress(message["progress"], message["record"])
    elif "crash" in message:
        worker.crash = message["crash"]


def _how_it_ended(status: Optional[int]) -> str:
    if status is None:
        return "it was lost"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"it was killed by {name}"
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    return "an error of mldiag's (traceback below)" if code == CRASHED else f"it exited {code}"


def _lost(target: Target, job_for, worker: _Worker, elapsed: float) -> Result:
    diagnostic = job_for(target).diagnostic
    message = (f"mldiag's worker process {worker.pid} running this target ended before its result: "
               f"{_how_it_ended(worker.status)}")
    extra = {"traceback": worker.crash} if worker.crash else {}
    return Result.failure(diagnostic, target.name, "internal", message, duration_s=elapsed, **extra)


def _end(running: List[_Worker]) -> None:
    """Interrupted (or a bug here): every worker told to stop, given END_GRACE_S to close its
    connections, then killed; all reaped, their pipes closed."""
    alive = [w for w in running if w.status is None]
    for worker in alive:
        try:
            os.kill(worker.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + END_GRACE_S
    for worker in alive:
        while True:
            pid, status = os.waitpid(worker.pid, os.WNOHANG)
            if pid:
                worker.status = status
                break
            if time.monotonic() >= deadline:
                os.kill(worker.pid, signal.SIGKILL)
                _, worker.status = os.waitpid(worker.pid, 0)
                break
            time.sleep(0.02)
    for worker in running:
        if worker.fd >= 0:
            os.close(worker.fd)
            worker.fd = -1

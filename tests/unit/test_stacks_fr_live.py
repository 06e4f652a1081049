"""A live rank's flight recorder, asked of torch's worker server (scripts/flight_recorder.py
``live_dump``). The real server, in a real hung gloo job: tests/integration/test_stacks_fr.py.
Here a stand-in process plays a worker server that misbehaves -- it has the thread name torch's
server threads have (pt_workerserver, written to its /proc comm) and answers on a Unix socket or
a wildcard TCP port as a script says: the recorded dumps of tests/fixtures/stacks/fr/ as JSON,
404s, a flood, a drip, a close, a chunked answer -- and every one ends bounded, as a row's error."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from diagnostics.builtin.stacks import flight_recorder as stacks_fr
from tests.programs import load_script
from tests.unit.test_stacks_fr import raw_dump

fr = load_script("flight_recorder.py", "mldiag_test_flight_recorder_live")

STANDIN = textwrap.dedent(r'''
    import os, socket, sys, threading, time
    mode, where, body_file, named = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "named"
    body = open(body_file, "rb").read() if body_file != "-" else b""

    def answer(c):
        c.recv(65536)
        if mode == "json":
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                      % len(body) + body)
        elif mode == "404":
            c.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        elif mode == "flood":
            c.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
            try:
                while True:
                    c.sendall(b"[" * 65536)
            except OSError:
                pass
        elif mode == "drip":
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{":
                c.sendall(bytes([byte]))
                time.sleep(0.5)
        elif mode == "chunked":
            c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
        elif mode == "garbage":
            c.sendall(b"\x00\x01 not http at all")
        c.close()

    def serve():
        if named:
            with open("/proc/self/task/%d/comm" % threading.get_native_id(), "w") as f:
                f.write("pt_workerserver")
        if where.startswith("/"):
            s = socket.socket(socket.AF_UNIX)
            s.bind(where)
        else:
            s = socket.socket(socket.AF_INET6)
            s.bind(("::", int(where)))
        s.listen(8)
        print(s.getsockname()[1] if not where.startswith("/") else "ready", flush=True)
        while True:
            c, _ = s.accept()
            threading.Thread(target=answer, args=(c,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    time.sleep(120)
''')


@pytest.fixture
def standin(tmp_path):
    started = []

    def start(mode, where="0", body=None, named=True, env=None):
        body_file = "-"
        if body is not None:
            body_file = str(tmp_path / f"body{len(started)}")
            with open(body_file, "wb") as f:
                f.write(body)
        p = subprocess.Popen([sys.executable, "-c", STANDIN, mode, str(where), body_file,
                              "named" if named else "plain"], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, **(env or {})))
        started.append(p)
        first = p.stdout.readline().strip()
        return p.pid, (int(first) if first.isdigit() else None)

    yield start
    for p in started:
        p.kill()
        p.wait()


def rank0_json():
    return json.dumps(raw_dump(0)).encode()


def test_a_rank_answering_on_a_wildcard_port_gives_its_dump(standin):
    pid, port = standin("json", body=rank0_json())
    assert fr.wildcard_ports(pid, {}) == [(port, "tcp6")]
    got = fr.live_dump(pid, {"RANK": "0"}, 0)
    want, error = fr.summarize(raw_dump(0))
    assert error is None and got["live"] is True and got["format"] == "json" and "error" not in got, got
    assert got["file"] == f"pid {pid}: worker server, port {port}, /handler/fr_trace_json"
    assert got["pg_status"] == json.loads(json.dumps(want["pg_status"])) and got["entries_total"] == want["entries_total"]


def test_a_rank_answering_on_its_unix_socket_gives_its_dump(standin, tmp_path):
    path = str(tmp_path / "rank0.sock")
    pid, _ = standin("json", path, body=rank0_json())
    got = fr.live_dump(pid, {fr.SOCKET_ENV: path}, 0)
    assert "error" not in got and got["file"] == f"pid {pid}: worker server, unix socket {path}, /handler/fr_trace_json"
    assert got["pg_status"]["0"]["last_enqueued_collective"] == 2


def test_a_process_without_a_worker_server_thread_is_not_asked(standin):
    pid, port = standin("json", body=rank0_json(), named=False)
    assert port and fr.live_dump(pid, {}, 0) is None


def test_the_stores_port_is_never_asked(standin):
    pid, port = standin("json", body=rank0_json())
    got = fr.live_dump(pid, {"MASTER_PORT": str(port)}, 0)
    assert got["error"] == "no socket of its worker server found", got


@pytest.mark.parametrize("mode,error", [
    ("404", "no flight-recorder handler (HTTP 404)"),
    ("flood", "an answer over the 100000-byte limit: not read"),
    ("drip", "no whole answer in the time allowed"),
    ("chunked", "a chunked answer (not read)"),
    ("garbage", "not an HTTP answer"),
])
def test_a_misbehaving_server_is_a_bounded_error(standin, mode, error):
    pid, port = standin(mode)
    t0 = time.monotonic()
    got = fr.live_dump(pid, {}, 3, timeout=1.5, max_bytes=100000)
    assert time.monotonic() - t0 < 4
    assert (got["rank"], got["live"], got["error"]) == (3, True, f"port {port}: {error}"), got


def test_an_answer_that_is_not_a_dump_is_its_error(standin):
    pid, port = standin("json", body=b'{"entries": 5, "pg_status": [1]')
    assert fr.live_dump(pid, {}, 0)["error"] == f"port {port}: not valid JSON (JSONDecodeError)"
    pid, port = standin("json", body=b'["not", "a", "dump"]')
    assert fr.live_dump(pid, {}, 0)["error"] == f"port {port}: not a flight-recorder dump (a list, not a dict)"


def test_a_planted_link_or_a_strangers_socket_is_refused(standin, tmp_path):
    path = str(tmp_path / "real.sock")
    pid, _ = standin("json", path, body=rank0_json())
    link = tmp_path / "link.sock"
    link.symlink_to(path)
    got = fr.live_dump(pid, {fr.SOCKET_ENV: str(link)}, 0)
    assert got["error"] == f"{link}: a symbolic link, not a socket: refused", got
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert fr.live_dump(pid, {fr.SOCKET_ENV: str(plain)}, 0)["error"] == f"{plain}: a regular file, not a socket: refused"
    assert fr.live_dump(pid, {fr.SOCKET_ENV: "rank0.sock"}, 0)["error"] == f"{fr.SOCKET_ENV} is not an absolute path"
    if os.geteuid() == 0:
        os.chown(path, 12345, 12345)
        got = fr.live_dump(pid, {fr.SOCKET_ENV: path}, 0)
        assert got["error"] == f"{path}: owned by uid 12345, not the job's: refused", got


def test_live_dumps_are_counted_in_the_flight_recorder_line(standin):
    dumps = []
    for rank in range(4):
        pid, _ = standin("json", body=json.dumps(raw_dump(rank)).encode())
        dumps.append(fr.live_dump(pid, {}, rank))
    findings, lines = stacks_fr.analyse([("trainbox", {"dumps": dumps})])
    assert [f["code"] for f in findings] == ["fr-ranks-diverge"]
    assert lines[0] == "flight recorder: 4 dumps (4 asked of the running ranks), ranks 0-3 on trainbox, format 2.10"

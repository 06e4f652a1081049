"""nccl_ras.py (a client of NCCL's RAS port) against the fake server that mirrors NCCL's side
(tests/fakes/nccl_ras_server.py, built from NVIDIA/nccl's src/ras/; SOURCE.md beside it), and
its parsers against the recorded reports (tests/fixtures/nccl_ras/, README.md there)."""
import json
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.programs import load_module, load_script, script_imports

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "nccl_ras"
SCRIPT = ROOT / "diagnostics" / "scripts" / "nccl_ras.py"

ras = load_script("nccl_ras.py", "mldiag_test_nccl_ras")
fake = load_module(ROOT / "tests" / "fakes" / "nccl_ras_server.py", "mldiag_test_nccl_ras_server")


@pytest.fixture
def server():
    stops = []

    def start(scenario, **kw):
        port, stop = fake.serve(scenario, **kw)
        stops.append(stop)
        return "127.0.0.1:%d" % port

    yield start
    for stop in stops:
        stop()


def codes(found):
    return [f["code"] for f in found]


def run(addr, timeout=5.0, verbose=False, fmt="auto"):
    return ras.run(SimpleNamespace(addr=addr, timeout=timeout, verbose=verbose, format=fmt))


# ------------------------------------------------------------------ the exchange, as NCCL's

def test_the_script_imports_the_standard_library_only_and_reads_as_python_3_8():
    assert script_imports(SCRIPT, module_level=True) <= {"argparse", "json", "os", "re", "socket", "sys",
                                                         "threading", "time"}
    assert "_remote" in script_imports(SCRIPT)


@pytest.mark.parametrize("fmt", ["auto", "text"])
def test_a_healthy_job_has_no_finding(server, fmt):
    result = run(server("healthy"), fmt=fmt)
    assert result["status"] == "ok" and result["findings"] == []
    d = result["data"]
    assert d["format"] == ("json" if fmt == "auto" else "text") and d["server_protocol"] == 2
    assert d["nccl_version"] == "2.30.7" and d["communicators_count"] == 1
    assert (d["job"]["nodes"], d["job"]["processes"], d["job"]["gpus"]) == (2, 8, 8)
    assert result["summary"] == "NCCL 2.30.7: 1 communicator, 8 processes on 2 nodes: healthy"
    json.dumps(result)


def test_the_exchange_is_ncclras_own(server, monkeypatch):
    """What the client sends, line by line, is what NVIDIA's client.cc sends, in its order."""
    sent = []
    real = ras._send
    monkeypatch.setattr(ras, "_send", lambda sock, text, deadline: (sent.append(text), real(sock, text, deadline)))
    r = ras.query(server("healthy"), timeout=10, verbose=True)
    assert sent == ["CLIENT PROTOCOL 2\n", "TIMEOUT 4\n", "SET FORMAT json\n", "VERBOSE STATUS\n"]
    assert r["complete"] and r["error"] is None and r["answer"] == fake.json_report(fake.SCENARIOS["healthy"]())


def test_an_older_nccl_refuses_json_and_the_text_report_is_read(server):
    r = ras.query(server("legacy"))
    assert r["format"] == "text" and r["json_refused"] == "ERROR: Unknown command SET FORMAT json"
    assert r["answer"] == "".join(fake.text_pieces(fake.SCENARIOS["legacy"]()))
    assert " (0.00s)\n" in r["answer"]                 # %.2f before 2.28
    assert run(server("legacy"))["findings"] == []


@pytest.mark.parametrize("fmt", ["auto", "text"])
def test_a_missing_rank_is_a_fail_naming_rank_gpu_process_and_host(server, fmt):
    result = run(server("missing-rank"), fmt=fmt)
    assert result["status"] == "fail"
    missing = [f for f in result["findings"] if f["code"] == "ras-rank-missing"]
    assert len(missing) == 1 and missing[0]["level"] == "fail" and missing[0]["action"] == "app"
    assert "rank 5 (GPU 1, process 4006 on 10.0.0.2)" in missing[0]["message"]
    assert "9e17999afaa87dbb" in missing[0]["message"]
    assert "ras-timeout" in codes(result["findings"])
    if fmt == "text":                                  # the job-level INCOMPLETE section
        assert "ras-process-missing" in codes(result["findings"])


@pytest.mark.parametrize("scenario,fmt", [("rank-behind", "auto"), ("rank-behind", "text"),
                                          ("legacy-rank-behind", "auto")])
def test_a_rank_behind_is_a_warning_naming_it_and_the_counts(server, scenario, fmt):
    result = run(server(scenario), fmt=fmt)
    assert result["status"] == "warn" and codes(result["findings"]) == ["ras-rank-behind"]
    f = result["findings"][0]
    assert f["level"] == "warn" and f["action"] == "monitor" and f["hint"]
    assert "rank 3 (GPU 3, process 4004 on 10.0.0.1) at 990" in f["message"]
    assert "AllReduce" in f["message"] and "7 ranks at 1000" in f["message"]
    comm = result["data"]["communicators"][0]
    assert comm["behind"][0]["rank"] == 3 and comm["op_counts"]["AllReduce"]["reference"] == 1000


@pytest.mark.parametrize("fmt", ["auto", "text"])
def test_a_rank_error_is_a_fail(server, fmt):
    result = run(server("comm-error"), fmt=fmt)
    assert codes(result["findings"]) == ["ras-comm-error"] and result["status"] == "fail"
    assert "rank 6" in result["findings"][0]["message"] and "Remote process error" in result["findings"][0]["message"]


# ------------------------------------------------------------------ a server that misbehaves

def test_nothing_listening_is_info(server):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    t0 = time.monotonic()
    result = run("127.0.0.1:%d" % port)
    assert time.monotonic() - t0 < 2
    assert result["status"] == "ok" and codes(result["findings"]) == ["ras-unreachable"]
    assert result["findings"][0]["level"] == "info" and "nothing listens" in result["findings"][0]["message"]


def test_a_dripping_server_costs_the_deadline_and_no_more(server):
    addr = server("drip", drip_delay=0.02)
    t0 = time.monotonic()
    result = run(addr, timeout=1.5)
    took = time.monotonic() - t0
    assert took < 1.5 + 0.5, took
    assert codes(result["findings"]) == ["ras-no-answer"] and result["status"] == "warn"


def test_a_flooding_server_costs_the_byte_cap_and_no_more(server):
    addr = server("flood")
    t0 = time.monotonic()
    r = ras.query(addr, timeout=5, max_bytes=256 * 1024)
    assert time.monotonic() - t0 < 5.5
    assert r["error"]["kind"] == "too-long" and r["bytes"] <= 256 * 1024 + 65536
    assert len(r["answer"]) <= 256 * 1024
    result = run(addr, timeout=3)
    assert "ras-protocol" in codes(result["findings"]) or "ras-no-answer" in codes(result["findings"])


@pytest.mark.parametrize("scenario,code", [("close-early", "ras-protocol"), ("wrong-greeting", "ras-protocol"),
                                           ("close-mid", "ras-protocol"), ("silent", "ras-no-answer")])
def test_a_server_that_is_not_nccls_is_named_within_the_deadline(server, scenario, code):
    addr = server(scenario)
    t0 = time.monotonic()
    result = run(addr, timeout=2.0, fmt="text")
    assert time.monotonic() - t0 < 2.5
    assert code in codes(result["findings"]) and result["status"] == "warn"
    json.dumps(result)


def test_a_bad_address_is_named_not_raised():
    assert run("not a host:x")["findings"][0]["code"] == "ras-unreachable"
    assert ras.parse_addr("[::1]:28029") == ("::1", 28029)
    assert ras.parse_addr("10.0.0.1") == ("10.0.0.1", 28028)
    assert ras.ras_timeout(10) == 4 and ras.ras_timeout(0.5) == 1


def test_nccl_ras_addr_is_the_default(monkeypatch):
    monkeypatch.setenv("NCCL_RAS_ADDR", "127.0.0.1:1")
    assert ras.parse_addr() == ("127.0.0.1", 1)
    monkeypatch.delenv("NCCL_RAS_ADDR")
    assert ras.parse_addr() == ("localhost", 28028)


# ------------------------------------------------------------------ the recordings

def read(name):
    return (FIX / name).read_text()


def test_issue_1911_two_ranks_ahead_of_thirty():
    p = ras.parse_text(read("nvidia-nccl-issue-1911.txt"))
    assert p["complete"] and p["nccl_version"] == "2.26.2" and p["problems"] == []
    assert (p["job"]["nodes"], p["job"]["processes"], p["job"]["gpus"]) == (4, 32, 32)
    assert p["groups"] == [{"group": 0, "comms": 1, "nodes": 4, "ranks_per_node": "8", "ranks": 32,
                            "ranks_in_group": 32, "status": "RUNNING", "errors": ["MISMATCH"]}]
    comm = p["communicators"][0]
    assert comm["hash"] == "fa93daea854b060b" and [e["rank"] for e in comm["ahead"]] == [12, 13]
    assert comm["ahead"][0]["host"] == "10.137.190.124" and comm["op_counts"]["AllGather"]["reference"] == 640
    f = ras.findings(p)
    assert codes(f) == ["ras-rank-ahead"] and "30 ranks at 640" in f[0]["message"]


def test_issue_1730_a_healthy_256_gpu_job():
    p = ras.parse_text(read("nvidia-nccl-issue-1730.txt"))
    assert p["complete"] and p["collection_seconds"] == 0.01 and p["job"]["gpus"] == 256
    assert ras.findings(p) == []


def test_the_guide_excerpts():
    p = ras.parse_text(read("nccl-docs-incomplete.txt"))
    assert p["missing_processes"] == [{"pid": 3487984, "host": "172.16.64.213", "gpus": "5"}]
    assert p["communicators"][0]["missing"][0]["rank"] == 21 and p["timeouts"] == 2
    assert codes(ras.findings(p)) == ["ras-process-missing", "ras-rank-missing", "ras-timeout"]
    p = ras.parse_text(read("nccl-docs-dead.txt"))
    assert p["dead_process_count"] == 1 and "ras-process-dead" in codes(ras.findings(p))
    p = ras.parse_text(read("nccl-docs-mismatch-2.24.txt"))
    assert [e["rank"] for e in p["communicators"][0]["behind"]] == [0, 2, 3, 4, 5, 7]
    assert p["communicators"][0]["behind"][0]["count"] == 6649
    p = ras.parse_text(read("nccl-docs-finalize-unknown.txt"))
    c = p["communicators"][0]
    assert c["nocomm_total"] == 26 and [e["rank"] for e in c["status_outliers"]] == [0, 8, 16, 24, 4, 20]
    p = ras.parse_text(read("nccl-docs-job-summary.txt"))
    assert (p["job"]["nodes"], p["job"]["processes_per_node"], p["job"]["gpus"]) == (4, 8, 32)


def test_the_guide_json():
    p = ras.parse(read("nccl-docs-json-missing-rank.json"))
    assert p["format"] == "json" and p["complete"] and p["nccl_version"] == "2.29.1"
    c = p["communicators"][0]
    assert c["hash"] == "ae94423cfbb2ef4a" and c["errors"] == ["INCOMPLETE"]
    assert c["missing"] == [{"rank": 1, "host": "172.16.64.245", "pid": 1524345, "gpu": 1, "nvml": 1,
                             "unresponsive": True, "dead": False}]
    assert codes(ras.findings(p)) == ["ras-rank-missing"]


def test_the_fake_text_and_json_say_the_same():
    for name in ("healthy", "missing-rank", "rank-behind", "comm-error"):
        job = fake.SCENARIOS[name]()
        t, j = ras.parse_text("".join(fake.text_pieces(job))), ras.parse_json(fake.json_report(job))
        assert [c["errors"] for c in t["communicators"]] == [c["errors"] for c in j["communicators"]] or name == "healthy"
        assert t["problems"] == [] and j["problems"] == []


# ------------------------------------------------------------------ hostile input

HOSTILE = ["", "{", "[]", "{}", '{"communicators": 5}', '{"communicators": [1, "x", null]}',
           '{"communicators": [{"hash": "0x1", "ranks": [{"rank": -1}, {"rank": true}, {"rank": 1, "host": "a b;rm"}]}]}',
           '{"communicators": [{"hash": "zz", "size": 1e308, "ranks": [{"rank": 0, "collective_counts": {"AllReduce": 1e400}}]}]}',
           "[" * 100000, "\x00" * 1000, "Rank 5 -- GPU 1 managed by process 3 on node x\n" * 100,
           "#0-0 (ffff) MISMATCH\n  Rank 99999999999999999999 has launched up to operation 99999999999999999999999\n",
           "Errors\n======\nINCOMPLETE\n  Process -1 on node \x1b[31m managing GPU 1\n",
           "NCCL version " + "9" * 10000 + " compiled with CUDA 1\n"]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_input_never_raises(text):
    for fn in (ras.parse, ras.parse_text, ras.parse_json):
        p = fn(text)
        f = ras.findings(p)
        json.dumps([p, f])
        assert all(len(x["message"]) <= 700 for x in f)


def test_random_bytes_and_mutated_reports_never_raise():
    rng = random.Random(33)
    base = "".join(fake.text_pieces(fake.SCENARIOS["missing-rank"]())) + fake.json_report(fake.SCENARIOS["rank-behind"]())
    for _ in range(300):
        chars = list(base)
        for _ in range(rng.randint(1, 30)):
            chars[rng.randrange(len(chars))] = chr(rng.choice([0, 10, 32, 45, 48, 57, 123, 125, rng.randrange(0x110000)]))
        text = "".join(chars)
        text = text[rng.randrange(len(text)):] if rng.random() < 0.3 else text
        for fn in (ras.parse_text, ras.parse_json):
            json.dumps(ras.findings(fn(text)))


def test_by_hand_it_prints_json_and_exits_with_the_status(server):
    addr = server("rank-behind")
    r = subprocess.run([sys.executable, str(SCRIPT), "--addr", addr, "--timeout", "5"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stderr
    assert json.loads(r.stdout)["findings"][0]["code"] == "ras-rank-behind"


def test_on_a_real_python_3_8(server):
    """The target's oldest Python: the query, the parsers and the findings, no 3.9+ API."""
    from tests.pythons import require_python
    py38 = require_python("3.8")
    addr = server("missing-rank")
    r = subprocess.run([py38, str(SCRIPT), "--addr", addr, "--timeout", "5", "--format", "text"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "ras-rank-missing" in codes(json.loads(r.stdout)["findings"])
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import nccl_ras as r\n"
            "print(json.dumps([r.findings(r.parse(open(n).read())) for n in sys.argv[2:]]))\n")
    names = sorted(str(p) for p in FIX.iterdir() if p.name != "README.md")
    r = subprocess.run([py38, "-c", code, str(SCRIPT.parent)] + names, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [ras.findings(ras.parse(Path(n).read_text())) for n in names]

"""Every task's ``--json`` against the lab, held against a recorded set: a restructuring of the
client (issue 31: the package laid out by concern) must change no byte a user or a script reads.

The set in ``data/json_recorded.json`` was recorded before the package moved, with

    MLDIAG_RECORD_JSON=1 python -m pytest tests/integration/test_json_unchanged.py

and is compared after: the documents as mldiag printed them, with only what differs between two
runs of the same inputs put in brackets (the seconds a run took, the lab's ports, directories and
start times, the order in which
concurrent tool calls ended; ``normalized`` says which keys and strings). Each task is one case: a difference
names the task and shows the first lines that differ.
"""

import difflib
import json
import os
import re
import socket
import textwrap
from pathlib import Path

import pytest

from tests import programs
from tests.programs import GPU_STATUS_CONTAINERS
from tests.integration.test_diagnostics_remote import ml_hosts  # noqa: F401 (a fixture)

HERE = Path(__file__).resolve().parent
RECORDED = HERE / "data" / "json_recorded.json"
RECORD = os.environ.get("MLDIAG_RECORD_JSON") == "1"

# Keys whose values are measurements or times of this run, not answers (and every key in
# seconds: NAME_s); uid: the lab users' ids, whichever the machine gave them; node-check's
# host.shm_mib: the size of the machine's /dev/shm.
VOLATILE_KEYS = frozenset({"uid", "elapsed_s", "duration_s", "seconds", "started", "finished", "time",
                           "timestamp", "took_s", "wall_s", "at", "when", "age_s",
                           "host.shm_mib"})       # /dev/shm's size: half the machine's memory

try:   # a version pip picked when the venv was made: not mldiag's answer
    import transformers
    TRANSFORMERS = transformers.__version__
except ImportError:
    TRANSFORMERS = "-"

SCRIPT = textwrap.dedent("""\
    import json, sys
    print(json.dumps({"argv": sys.argv[1:], "answer": 42}))
    """)


def volatile(key, value) -> bool:
    if key == "transformers" and isinstance(value, str):
        return value == TRANSFORMERS
    return (key in VOLATILE_KEYS or key.endswith("_s")) and isinstance(value, (int, float, str))


def normalized(value, lab):
    """The document with this run's own values bracketed (see the module docstring)."""
    if isinstance(value, dict):
        return {k: "<volatile>" if volatile(k, v) else normalized(v, lab) for k, v in value.items()}
    if isinstance(value, list):
        items = [normalized(v, lab) for v in value]
        if items and all(isinstance(v, dict) and "argv" in v for v in items):
            # node-check's data.tools: the tools its checks ran side by side, in the order
            # they ended
            items.sort(key=lambda v: json.dumps(v, sort_keys=True))
        return items
    if isinstance(value, str):
        if value == socket.gethostname():   # the lab's sshd hosts are this machine
            return "<hostname>"
        text = value.replace(os.uname().release, "<kernel>")
        text = text.replace(f"transformers {TRANSFORMERS}", "transformers <version>")
        text = text.replace(str(lab.fixtures_dir), "<fixtures>").replace(str(lab.dir), "<lab>")
        # the lab replays its kernel logs as "10 minutes ago"
        text = re.sub(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d([.,]\d+)?([+-]\d\d:?\d\d|Z)?", "<time>", text)
        text = re.sub(r"/hosts\d+-[A-Za-z0-9_]+/", "/<hostsdir>/", text)
        text = re.sub(r"/tmp/mldiag-[A-Za-z0-9_.-]+", "/tmp/mldiag-<private>", text)
        text = re.sub(r"/ml/models/[0-9a-f]+/", "/ml/models/<session>/", text)
        text = re.sub(r"[0-9.]+it/s", "<rate>it/s", text)   # tqdm's progress, in a log line
        text = re.sub(r"\b(port[ =:]*|:)(\d{4,5})\b", lambda m: m.group(1) + "<port>", text)
        text = re.sub(r"\d+(\.\d+)?\s?(ms|s)\b", "<dur>", text)
        return text
    return value


# the fake-GPU targets of CT 200, indented under this file's `containers:`
GPU_CONTAINERS = textwrap.indent(GPU_STATUS_CONTAINERS, "        ").rstrip("\n")


@pytest.fixture(scope="module")
def hosts_file(lab, node_cts):
    ct = {"runtime": "pct", "python": "/usr/bin/python3",
          "expect": {"gpus": 8, "ib_ports": 8, "ib_rate": 400, "nvlinks_per_gpu": 18,
                     "pcie_width": 16, "pcie_gen": 5},
          "env": {"MLDIAG_FAKE_NVIDIA_SMI": "derived__h200x8__healthy"}}
    return lab.hosts_yaml(textwrap.dedent(f"""\
        defaults: {{connect_timeout: 3, timeout: 90}}
        hosts:
          main: {{}}
          pve:
            address: main
            become: sudo
            containers:
{GPU_CONTAINERS}
              h200-ok: {json.dumps({**ct, "id": "210"})}
              h200-bad: {json.dumps({**ct, "id": "211"})}
        groups:
          fleet: [trainbox, sickbox]
        """))


@pytest.fixture(scope="module")
def script_file(lab):
    path = lab.hosts_yaml("x").parent / "answer.py"
    path.write_text(SCRIPT)
    return path


@pytest.fixture(scope="module")
def runbook_dir(lab):
    d = lab.hosts_yaml("x").parent / "runbooks"
    d.mkdir()
    (d / "triage.yaml").write_text(textwrap.dedent("""\
        name: triage
        description: the GPUs, then the kernel log
        steps:
          - task: gpu-status
          - task: scan-log
            args: {path: /etc/os-release}
        """))
    return d


def cases(lab, hosts_file, script_file, runbook_dir):
    log = lab.fixtures_dir / "logs" / "dmesg_fallen_off_bus.log"
    common = ("--hosts-file", str(hosts_file), "--json")
    return {
        "hosts": ("hosts", *common),
        "ping": ("ping", *common, "-H", "main,trainbox"),
        "gpu-status": ("gpu-status", *common, "-g", "fleet", "-H", "consumer"),
        "env-report": ("env-report", *common, "-H", "trainbox"),
        "scan-log": ("scan-log", *common, "-H", "trainbox", str(log)),
        "node-check": ("node-check", *common, "-H", "h200-ok,h200-bad", "--no-dcgm"),
        "run-script": ("run-script", *common, "-H", "trainbox,main", str(script_file), "--arg", "x y"),
        "runbook": ("runbook", "triage", "--runbooks-dir", str(runbook_dir), "--format", "json",
                    "--hosts-file", str(hosts_file), "-H", "trainbox"),
        "unknown-target": ("gpu-status", *common, "-H", "nosuchhost"),
    }


CASE_NAMES = ("hosts", "ping", "gpu-status", "env-report", "scan-log", "node-check", "run-script",
              "runbook", "unknown-target")
# torch and transformers in the CT, tiny models saved with a fixed seed (test_diagnostics_remote.py)
ML_CASES = {
    "check-attn": ("check-attn", "-H", "llama,qwen3next", "--json"),
    "extract-smoke": ("extract-smoke", "-H", "llama,qwen3next", "--json", "--backend", "transformers",
                      "--device", "cpu", "--max-tokens", "16", "--samples", "2"),
}
# Not here: stacks, whose answer is a live job's PIDs and stack lines (tests/integration/
# test_stacks.py checks its JSON field by field).


def run_case(argv, lab):
    proc = programs.mldiag(*argv, timeout=240)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        doc = {"stdout": proc.stdout}
    got = {"rc": proc.returncode, "stdout": normalized(doc, lab)}
    if proc.returncode >= 3:   # an error or bad input: what it said is the answer too
        got["stderr"] = normalized(proc.stderr, lab)
    return got


def test_every_case_is_recorded():
    if RECORD:
        pytest.skip("recording")
    recorded = json.loads(RECORDED.read_text())
    assert sorted(recorded) == sorted(CASE_NAMES + tuple(ML_CASES))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_json_as_recorded(name, lab, hosts_file, script_file, runbook_dir):
    check(name, run_case(cases(lab, hosts_file, script_file, runbook_dir)[name], lab))


@pytest.mark.parametrize("name", sorted(ML_CASES))
def test_ml_json_as_recorded(name, lab, ml_hosts):  # noqa: F811 (the imported fixture)
    argv = ML_CASES[name]
    check(name, run_case((argv[0], "--hosts-file", str(ml_hosts[0]), *argv[1:]), lab))


def check(name, got):
    if RECORD:
        recorded = json.loads(RECORDED.read_text()) if RECORDED.exists() else {}
        recorded[name] = got
        RECORDED.parent.mkdir(exist_ok=True)
        RECORDED.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        return
    want = json.loads(RECORDED.read_text())[name]
    if got != want:
        a = json.dumps(want, indent=1, sort_keys=True).splitlines()
        b = json.dumps(got, indent=1, sort_keys=True).splitlines()
        diff = "\n".join(list(difflib.unified_diff(a, b, "recorded", "now", lineterm=""))[:60])
        pytest.fail(f"mldiag {name} --json changed:\n{diff}", pytrace=False)

"""node-check end to end through the real lab (issue 12, "How it must be shown"): `mldiag
node-check` / `inv node-check` (a subprocess, as a user runs it) → ssh main (the lab's sshd,
user mlsh) → sudo → pct 210/211 (LXC) → /usr/bin/python3, on two H200-like nodes whose
hardware is recordings (tests/lab/nodecheck.py):

- /sys/class/infiniband: leptonai/gpud's recorded tree of an H100 host, bind-mounted at its real
  path (an lxc.mount.entry); the faulty node's copy has mlx5_5/1 down and mlx5_7/1 at 200 Gb/s.
- /sys/bus/pci/devices: 8 H200 GPUs and 8 ConnectX-7, gen 5 x16; the faulty node's GPU 5 at x8.
- nvidia-smi: the fake, answering the 8x H200 capture the target's `env:` names.
- the kernel log: saved real logs in /var/log/mldiag-lab/ replayed by the fake journalctl (CT 210
  only) and dmesg (both) with their timestamps moved to "10 minutes ago"; `--kernel-log-file`
  reads one of them directly.
- dcgmi: the fake on CT 210 only.

The lab's own part (the CTs and the fakes in them) is checked first, without mldiag.
"""

import json
import re
import textwrap
import time
from functools import partial

import pytest

from tests import programs
from tests.lab import nodecheck

PY = "/usr/bin/python3"
LOGS = "/var/log/mldiag-lab"
XID48_LOG = f"{LOGS}/gpud-dmesg-time-format-iso.log"     # Xid 48 + 63 + 94 (GPU 0000:19:00)
XID79_LOG = f"{LOGS}/gpud-sxid-README.xid79-sxid20034.excerpt.md"
H200 = "derived__h200x8__healthy"
EXPECT = {"gpus": 8, "ib_ports": 8, "ib_rate": 400, "nvlinks_per_gpu": 18, "pcie_width": 16, "pcie_gen": 5}
ACTIONS = ("none", "monitor", "app", "reset-gpu", "reboot", "drain", "rma")
LEVELS = ("info", "warn", "fail")

# the fake nvidia-smi's NVLink/fabric faults (another branch of issue 12): the faulty CT's GPUs
# have them only where the fake knows them
LINK_FAULTS = nodecheck.fake_knows_link_faults(nodecheck.REPO / "tests" / "fakes")

mldiag = partial(programs.mldiag, timeout=180)
inv = partial(programs.inv, timeout=180)


def ct(name, vmid, capture=H200, **env):
    fields = {"runtime": "pct", "id": str(vmid), "python": PY, "expect": EXPECT,
              "env": {"MLDIAG_FAKE_NVIDIA_SMI": capture, **env}}
    return f"      {name}: {json.dumps(fields)}\n"


@pytest.fixture(scope="module")
def nodes(node_cts):
    return node_cts


@pytest.fixture(scope="module")
def hosts(lab, nodes):
    return lab.hosts_yaml(textwrap.dedent("""\
        defaults: {connect_timeout: 5, timeout: 120}
        hosts:
          pve:
            address: main
            become: sudo
            containers:
        """) + "".join([
        ct("h200-ok", 210),
        ct("h200-bad", 211, capture=nodecheck.FAULTY_CAPTURE),
        # CT 210 again, its live kernel log (journalctl) now the Xid 48/63/94 one
        ct("h200-xid", 210, MLDIAG_FAKE_KLOG="gpud-dmesg-time-format-iso.log",
           MLDIAG_FAKE_KLOG_LOG="/run/mldiag-klog-argv.jsonl"),
        # the same log, 3 days old: outside the default 24 h window
        ct("h200-old-xid", 210, MLDIAG_FAKE_KLOG="gpud-dmesg-time-format-iso.log",
           MLDIAG_FAKE_KLOG_AGE="259200"),
        ct("h200-hung", 210, MLDIAG_FAKE_NVIDIA_SMI_HANG="60"),
        # CT 210's dcgmi answering a failed level-2 diagnostic (tests/fixtures/dcgm/README.md)
        ct("h200-dcgm-bad", 210, MLDIAG_FAKE_DCGMI="derived__dcgm4-h200x8__r2-failing.json",
           MLDIAG_FAKE_DCGMI_LOG="/run/mldiag-dcgmi-argv.jsonl"),
    ]))


def pct(lab, vmid, script):
    return lab.ssh("main", "sudo", "-n", "pct", "exec", str(vmid), "--", "/bin/sh", "-c",
                   "'" + script.replace("'", "'\\''") + "'")


def docs_of(r):
    assert "Traceback" not in r.stderr, r.stderr
    docs = {d["target"]: d for d in json.loads(r.stdout)}
    for d in docs.values():
        check_shape(d)
    return docs


def check_shape(doc):
    """The node-check result contract (NODECHECK.md): every finding has a level, a code, a
    one-line message, an action and a check; data has facts (flat, scalar), checks, gpus."""
    assert doc["diagnostic"] == "node-check", doc
    for f in doc["findings"]:
        assert f["level"] in LEVELS and f["action"] in ACTIONS and f["code"], f
        assert "\n" not in f["message"], f
        assert f["check"] in ("xid", "nvlink", "fabric", "pcie", "ib", "dcgm", "gpu", "baseline"), f
    data = doc["data"]
    assert isinstance(data["facts"], dict) and isinstance(data["checks"], dict), data.keys()
    for k, v in data["facts"].items():
        assert isinstance(v, (str, int, float, bool, type(None))), (k, v)
    for name, c in data["checks"].items():
        assert c["status"] in ("ok", "warn", "fail", "skipped", "hung"), (name, c)
        assert isinstance(c["seconds"], (int, float)), (name, c)
    worst = max((ACTIONS.index(f["action"]) for f in doc["findings"]), default=0)
    assert data["worst_action"] == ACTIONS[worst], (data["worst_action"], doc["findings"])


def facts_of(doc):
    return doc["data"]["facts"]


def non_info(doc):
    return [f for f in doc["findings"] if f["level"] != "info"]


def by_check(doc, check):
    return [f for f in doc["findings"] if f["check"] == check]


# ------------------------------------------------------------------ the lab's part, no mldiag


def test_node_cts_see_the_recorded_sysfs_at_its_real_paths(lab, nodes):
    # NOTE: the recorded files have no trailing newline (gpud's copy): $(cat) evens that out
    read = ("for f in /sys/class/infiniband/mlx5_0/ports/1/state /sys/class/infiniband/mlx5_5/ports/1/state "
            "/sys/class/infiniband/mlx5_7/ports/1/rate /sys/class/infiniband/mlx5_1/ports/1/counters/link_downed "
            "/sys/bus/pci/devices/0000:ab:00.0/device /sys/bus/pci/devices/0000:ab:00.0/current_link_width "
            "/sys/bus/pci/devices/0000:ab:00.0/max_link_speed; do printf '%s\\n' \"$(cat $f)\"; done; "
            "ls /sys/class/infiniband | tr '\\n' ' '; echo; ls /sys/bus/pci/devices | wc -l")
    ok = pct(lab, 210, read)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == [
        "4: ACTIVE", "4: ACTIVE", "400 Gb/sec (4X NDR)", "255", "0x2335", "16", "32.0 GT/s PCIe",
        "mlx5_0 mlx5_1 mlx5_4 mlx5_5 mlx5_6 mlx5_7 mlx5_8 mlx5_9 mlx5_bond_0 ", "16"]
    bad = pct(lab, 211, read)
    assert bad.returncode == 0, bad.stderr
    assert bad.stdout.splitlines()[:7] == [
        "4: ACTIVE", "1: DOWN", "200 Gb/sec (4X HDR)", "255", "0x2335", "8", "32.0 GT/s PCIe"]
    # read-only, as sysfs is to a diagnostic
    assert pct(lab, 210, "echo 1 > /sys/class/infiniband/mlx5_0/ports/1/state").returncode != 0


def test_node_cts_tools_and_kernel_logs(lab, nodes):
    r = pct(lab, 210, "for t in nvidia-smi journalctl dmesg; do command -v $t; done; "
                      "basename \"$(readlink /usr/bin/dcgmi)\"; "
                      "journalctl -k --since=-24h -o short-iso --no-pager -q | tail -1; "
                      "MLDIAG_FAKE_KLOG=gpud-dmesg-time-format-iso.log journalctl -k --since=-1h "
                      "-o short-iso --no-pager -q --grep 'NVRM: Xid' | wc -l")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # pct exec's PATH starts with /bin (merged /usr: the links in /usr/bin)
    # (dcgmi: the link to tests/fakes/dcgmi, which another branch of issue 12 writes)
    assert lines[:4] == ["/bin/nvidia-smi", "/bin/journalctl", "/bin/dmesg", "dcgmi"]
    # journalctl's short-iso: time (systemd >= 250 offset), host, "kernel:", the saved message
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00 h200-ok kernel: IPv6: ADDRCONF\(NETDEV_CHANGE\): "
                        r"cali5be35fabd3e: link becomes ready", lines[4]), lines[4]
    assert lines[5] == "11"  # the log's Xid lines, all in the last hour: 48, 63, 9x 94
    r = pct(lab, 211, f"MLDIAG_FAKE_NVIDIA_SMI={nodecheck.FAULTY_CAPTURE} nvidia-smi -L | wc -l; "
                      f"MLDIAG_FAKE_NVIDIA_SMI={nodecheck.FAULTY_CAPTURE} nvidia-smi nvlink -s -i 5 | "
                      "while read -r line; do case $line in *inactive*) echo \"$line\";; esac; done; "
                      "command -v journalctl dcgmi; dmesg --level err | wc -l; "
                      "MLDIAG_FAKE_DMESG_RESTRICT=1 dmesg; echo rc=$?")
    # Xid 79, "GPU has fallen off the bus", 8 NVSwitch SXid lines
    inactive = ["Link 4: <inactive>", "Link 11: <inactive>"] if LINK_FAULTS else []
    assert r.stdout.splitlines() == ["8", *inactive, "10", "rc=1"], r.stdout
    assert r.stderr.strip() == "dmesg: read kernel buffer failed: Operation not permitted"


# ------------------------------------------------------------------ node-check through mldiag


def test_healthy_node_is_ok_and_fast(hosts):
    t = time.monotonic()
    r = inv("node-check", "--hosts-file", str(hosts), "-H", "h200-ok", "--no-dcgm", "--json")
    wall = time.monotonic() - t
    assert r.returncode == 0, r.stdout + r.stderr
    doc = docs_of(r)["h200-ok"]
    assert doc["status"] == "ok", doc
    assert non_info(doc) == [], doc["findings"]
    assert doc["data"]["worst_action"] == "none"
    facts = doc["data"]["facts"]
    assert facts["gpu.count"] == 8 and facts["gpu.model"] == "NVIDIA H200", facts
    assert facts["driver"] == "590.48.01"
    assert facts["ib.mlx5_0/1.rate"] == 400 and facts["ib.mlx5_0/1.state"] == "ACTIVE", facts
    assert facts["ib.mlx5_0.fw"] == "28.41.1000"
    assert facts["pcie.gpu0.width"] == 16 and facts["pcie.gpu0.max_width"] == 16, facts
    assert facts["pcie.gpu0.gen"] == 5
    checks = doc["data"]["checks"]
    for name in ("xid", "pcie", "ib"):
        assert checks[name]["status"] == "ok", checks
    assert checks["dcgm"]["status"] == "skipped", checks          # --no-dcgm
    assert doc["data"]["kernel_log"]["source"] == "journalctl", doc["data"].get("kernel_log")
    # issue 12: a healthy 8-GPU node without DCGM in <= 3 s (on the node; the ssh hop besides)
    node_s = max(c["seconds"] for c in checks.values())
    print(f"node-check h200-ok: {doc['duration_s']:.2f} s (checks: max {node_s:.2f} s; "
          f"the whole inv run {wall:.2f} s)")
    assert doc["duration_s"] <= 3.0, doc["duration_s"]


def test_healthy_node_with_dcgm(hosts):
    r = mldiag("node-check", "--hosts-file", hosts, "-H", "h200-ok", "--json")
    doc = docs_of(r)["h200-ok"]
    assert r.returncode == 0, r.stdout + r.stderr
    assert doc["data"]["checks"]["dcgm"]["status"] == "ok", doc["data"]["checks"]
    assert "dcgm.version" in doc["data"]["facts"], doc["data"]["facts"]


def test_dcgm_level_2_failures_per_test_and_gpu(lab, hosts):
    r = mldiag("node-check", "--hosts-file", hosts, "-H", "h200-dcgm-bad", "--dcgm-level", "2", "--json")
    doc = docs_of(r)["h200-dcgm-bad"]
    assert r.returncode == 2, r.stdout + r.stderr
    assert doc["data"]["checks"]["dcgm"]["status"] == "fail", doc["data"]["checks"]
    dcgm = [f for f in by_check(doc, "dcgm") if f["level"] != "info"]
    # software fails on all 8 GPUs (persistence mode: one folded finding), memory on GPU 2
    # (volatile DBEs), pcie on GPU 5 (low bandwidth)
    gpus = sorted(tuple(f.get("gpus") or ()) for f in dcgm)
    assert gpus == [(0, 1, 2, 3, 4, 5, 6, 7), (2,), (5,)], dcgm
    root = f"/proc/{lab.container_pids(210, include_init=True)[0]}/root"
    calls = [json.loads(line) for line in open(f"{root}/run/mldiag-dcgmi-argv.jsonl")]
    call = calls[-1]
    assert "diag" in call and "-j" in call and call[call.index("-r") + 1] == "2", calls


def test_faulty_node(hosts):
    r = mldiag("node-check", "--hosts-file", hosts, "-H", "h200-bad", "--json")
    assert r.returncode == 2, r.stdout + r.stderr
    doc = docs_of(r)["h200-bad"]
    assert doc["status"] == "fail", doc
    # no journalctl on this node: the live kernel log came from dmesg
    assert doc["data"]["kernel_log"]["source"] == "dmesg", doc["data"].get("kernel_log")
    ib = {tuple(f.get("ports") or ()): f for f in by_check(doc, "ib") if f["level"] != "info"}
    assert ib[("mlx5_5/1",)]["level"] == "fail", ib
    assert "mlx5_7/1: rate 200 Gb/s, expected 400" in ib[("mlx5_7/1",)]["message"], ib
    pcie = [f for f in by_check(doc, "pcie") if f["level"] != "info"]
    assert [f["gpus"] for f in pcie] == [[5]], pcie
    assert "x8" in pcie[0]["message"] and "16" in pcie[0]["message"], pcie
    xid = [f for f in by_check(doc, "xid") if f["level"] != "info"]
    assert any("79" in f["code"] or "Xid 79" in f["message"] for f in xid), xid
    assert any(f["action"] in ("reboot", "drain", "rma") for f in xid), xid
    assert any("20034" in f["code"] or "SXid 20034" in f["message"] for f in doc["findings"]), doc["findings"]
    # no dcgmi here: an info finding with a hint, not a failure
    dcgm = by_check(doc, "dcgm")
    assert [(f["level"], bool(f.get("hint"))) for f in dcgm] == [("info", True)], dcgm
    assert doc["data"]["checks"]["dcgm"]["status"] == "skipped"
    facts = doc["data"]["facts"]
    if LINK_FAULTS:
        nvlink = [f for f in by_check(doc, "nvlink") if f["level"] != "info"]
        assert [f["gpus"] for f in nvlink] == [[5]], nvlink
        assert "16 of 18" in nvlink[0]["message"], nvlink
        fabric = [f for f in by_check(doc, "fabric") if f["level"] != "info"]
        assert fabric and fabric[0]["level"] == "fail", fabric
        assert facts_of(doc)["nvlink.gpu5.active"] == 16 and facts_of(doc)["nvlink.gpu0.active"] == 18
        assert facts_of(doc)["fabric.gpu0.state"] == "In Progress"
    facts = doc["data"]["facts"]
    assert facts["ib.mlx5_5/1.state"] != "ACTIVE" and facts["ib.mlx5_7/1.rate"] == 200, facts
    assert facts["pcie.gpu5.width"] == 8 and facts["pcie.gpu5.max_width"] == 16, facts
    assert ACTIONS.index(doc["data"]["worst_action"]) >= ACTIONS.index("reboot"), doc["data"]["worst_action"]


def test_kernel_log_file_inside_the_ct(hosts):
    r = mldiag("node-check", "--hosts-file", hosts, "-H", "h200-ok", "--no-dcgm",
               "--kernel-log-file", XID48_LOG, "--json")
    doc = docs_of(r)["h200-ok"]
    assert doc["data"]["kernel_log"]["source"] == f"file:{XID48_LOG}", doc["data"]["kernel_log"]
    codes = {f["code"]: f for f in by_check(doc, "xid")}
    msgs = " | ".join(f["message"] for f in by_check(doc, "xid"))
    for xid in ("48", "63", "94"):
        assert any(xid in c for c in codes) or f"Xid {xid}" in msgs, (xid, codes)
    # an uncorrectable DBE (48) wants the GPU reset at least; the log's GPU 0000:19:00 is not one
    # of this node's GPUs (the log is another machine's): no GPU index is made up for it
    assert ACTIONS.index(doc["data"]["worst_action"]) >= ACTIONS.index("reset-gpu"), doc["findings"]
    assert r.returncode == 2, r.stdout + r.stderr


def test_live_kernel_log_through_journalctl(lab, hosts):
    r = mldiag("node-check", "--hosts-file", hosts, "-H", "h200-xid", "--no-dcgm", "--json")
    doc = docs_of(r)["h200-xid"]
    assert doc["data"]["kernel_log"]["source"] == "journalctl", doc["data"]["kernel_log"]
    msgs = " | ".join(f["code"] + " " + f["message"] for f in by_check(doc, "xid"))
    for xid in ("48", "63", "94"):
        assert xid in msgs, msgs
    # journalctl was asked for the kernel log of a window, in a format with the year
    root = f"/proc/{lab.container_pids(210, include_init=True)[0]}/root"
    calls = [json.loads(line) for line in open(f"{root}/run/mldiag-klog-argv.jsonl")]
    jc = [c for c in calls if c[0] == "journalctl"]
    assert jc, calls
    assert any(a in ("-k", "--dmesg") for a in jc[-1]), jc[-1]
    assert any(a.startswith(("--since", "-S")) for a in jc[-1]), jc[-1]


def test_journal_window(hosts):
    # the same Xid log, 3 days old: outside the default 24 h, inside --since 96h
    r = mldiag("node-check", "--hosts-file", hosts, "-H", "h200-old-xid", "--no-dcgm", "--json")
    doc = docs_of(r)["h200-old-xid"]
    assert [f for f in by_check(doc, "xid") if f["level"] != "info"] == [], doc["findings"]
    r = mldiag("node-check", "--hosts-file", hosts, "-H", "h200-old-xid", "--no-dcgm", "--since", "96h", "--json")
    doc = docs_of(r)["h200-old-xid"]
    assert [f for f in by_check(doc, "xid") if f["level"] != "info"], doc["findings"]


def test_hung_nvidia_smi_is_a_finding_not_a_hung_run(lab, hosts):
    t = time.monotonic()
    r = mldiag("node-check", "--hosts-file", hosts, "-H", "h200-hung", "--no-dcgm", "--json")
    took = time.monotonic() - t
    doc = docs_of(r)["h200-hung"]
    hung = [f for f in doc["findings"] if f["code"] == "tool-hung"]
    assert len(hung) == 1 and hung[0]["level"] == "fail" and hung[0]["action"] == "reboot", doc["findings"]
    assert "nvidia-smi" in hung[0]["message"] and "did not answer within" in hung[0]["message"], hung
    # nvidia-smi is not called again after it hung: the others say so (not-checked), none waits
    assert any(c["status"] == "hung" for c in doc["data"]["checks"].values()), doc["data"]["checks"]
    assert took < 40, took   # one 10 s tool timeout, not one per check, nor the fake's 60 s
    # the other checks still ran on the sysfs
    assert doc["data"]["checks"]["ib"]["status"] == "ok", doc["data"]["checks"]
    assert r.returncode == 2
    # and the hung fake is gone from the CT
    time.sleep(0.5)
    left = [c for c in lab.container_cmdlines(210) if any("nvidia-smi" in a for a in c)]
    assert left == [], left


def test_two_nodes_folded_grouped_by_action(hosts):
    r = mldiag("node-check", "--hosts-file", hosts, "-H", "h200-ok,h200-bad", "--no-dcgm")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    out = r.stdout
    assert "h200-ok" in out and "h200-bad" in out, out
    # grouped by action: the failing node's group (its worst action) comes before the healthy one's
    bad_at, ok_at = out.index("h200-bad"), out.index("h200-ok")
    assert bad_at < ok_at, out
    j = mldiag("node-check", "--hosts-file", hosts, "-H", "h200-ok,h200-bad", "--no-dcgm", "--json")
    docs = docs_of(j)
    assert set(docs) == {"h200-ok", "h200-bad"}
    assert docs["h200-ok"]["data"]["worst_action"] == "none"
    assert docs["h200-bad"]["data"]["worst_action"] in out, out

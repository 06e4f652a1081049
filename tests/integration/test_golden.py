"""The golden configuration on the lab's fleet (issue 34 item 4, "How it must be shown": written
from the lab fleet, a node changed, the drift named by fact).

`mldiag baseline-init` / `baseline-diff` / `node-check` as a user runs them (subprocesses) →
ssh main (the lab's sshd) → sudo → pct 210/211 (LXC) → /usr/bin/python3, on the node-check CTs
(tests/lab/nodecheck.py): recorded /sys/class/infiniband and PCI trees, the fake nvidia-smi
answering the 8x H200 capture. Three targets run on CT 210 (the healthy node), one on CT 211
(its recorded faults: GPU 5 at x8, mlx5_5/1 down, mlx5_7/1 at 200 Gb/s, GPU 5's NVLinks 4 and 11
down, the fabric "In Progress"). The change: one healthy node's nvidia-smi answers
tests/fixtures/nvidia-smi/derived__h200x8__ecc-off-gpu3.txt (ECC turned off on GPU 3).
"""

import json
import textwrap
from functools import partial

import yaml

from tests import programs
from tests.lab import nodecheck

PY = "/usr/bin/python3"
H200 = "derived__h200x8__healthy"
ECC_OFF = "derived__h200x8__ecc-off-gpu3"
mldiag = partial(programs.mldiag, timeout=180)


def ct(name, vmid, capture):
    fields = {"runtime": "pct", "id": str(vmid), "python": PY,
              "env": {"MLDIAG_FAKE_NVIDIA_SMI": capture}}
    return f"      {name}: {json.dumps(fields)}\n"


def write_hosts(path, c_capture=H200, defaults=""):
    path.write_text(textwrap.dedent(f"""\
        defaults: {{connect_timeout: 5, timeout: 120{defaults}}}
        hosts:
          pve:
            address: main
            become: sudo
            containers:
        """) + ct("gold1", 210, H200) + ct("gold2", 210, H200) + ct("gold3", 210, c_capture)
        + ct("gold-bad", 211, nodecheck.FAULTY_CAPTURE) + textwrap.dedent("""\
        groups:
          fleet: [gold1, gold2, gold3]
          lab: [fleet, gold-bad]
        """))
    return path


def test_golden_written_from_the_lab_fleet_a_node_changed_the_drift_named_by_fact(lab, node_cts):
    hosts = lab.hosts_yaml("")
    write_hosts(hosts)
    golden = hosts.parent / "golden.yaml"

    r = mldiag("baseline-init", "-g", "lab", "--out", golden, "--hosts-file", hosts)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "from 4 node(s) (gold[1-3],gold-bad)" in r.stdout, r.stdout
    text = golden.read_text()
    print(text)
    doc = yaml.safe_load(text)
    facts = doc["facts"]
    # the majority (CT 210 three times) is the golden value; CT 211's recorded faults are named
    # beside it for the reviewer
    assert facts["gpu.gpu3.ecc_mode"] == "Enabled" and facts["gpu.count"] == 8
    assert facts["gpu.model"] == "NVIDIA H200" and facts["driver"] == "590.48.01"
    assert facts["pcie.gpu5.width"] == 16 and facts["nvlink.gpu5.active"] == 18
    assert facts["ib.mlx5_7/1.rate"] == 400
    assert "  pcie.gpu5.width: 16   # differs: 8 on gold-bad" in text.splitlines()
    assert "  nvlink.gpu5.active: 18   # differs: 16 on gold-bad" in text.splitlines()
    assert "groups" not in doc      # no group's majority differs from the fleet's
    for key, value in facts.items():
        assert isinstance(value, (str, int, float, bool, type(None))), (key, value)

    r = mldiag("baseline-diff", golden, "-g", "fleet", "--hosts-file", hosts)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[1:] == ["no drift: gold[1-3]"], r.stdout

    # CT 211 drifts in exactly the facts its recordings change
    r = mldiag("baseline-diff", golden, "-H", "gold-bad", "--hosts-file", hosts, "--json")
    assert r.returncode == 2, r.stdout + r.stderr
    (bad,) = json.loads(r.stdout)
    drifted = {d["fact"]: (d["golden"], d["now"]) for d in bad["drift"]}
    assert drifted["pcie.gpu5.width"] == (16, 8) and drifted["nvlink.gpu5.active"] == (18, 16)
    assert drifted["ib.mlx5_7/1.rate"] == (400, 200), drifted
    assert drifted["fabric.gpu0.state"] == ("Completed", "In Progress"), drifted
    families = {k.split(".")[0] + "." + k.split(".")[1] for k in drifted}
    assert families <= {"pcie.gpu5", "nvlink.gpu5", "ib.mlx5_5/1", "ib.mlx5_7/1", "ib.ports",
                        *(f"fabric.gpu{i}" for i in range(8))} | {"gpu.vbios"}, drifted

    # one healthy node changed: its nvidia-smi now reports ECC off on GPU 3
    write_hosts(hosts, c_capture=ECC_OFF)
    r = mldiag("baseline-diff", golden, "-g", "fleet", "--hosts-file", hosts, "--json")
    assert r.returncode == 2, r.stdout + r.stderr
    assert {d["target"]: d["drift"] for d in json.loads(r.stdout)} == {
        "gold1": [], "gold2": [],
        "gold3": [{"fact": "gpu.gpu3.ecc_mode", "golden": "Enabled", "now": "Disabled",
                    "missing": False, "from": "facts"}]}
    r = mldiag("baseline-diff", golden, "-g", "fleet", "--hosts-file", hosts)
    lines = r.stdout.splitlines()
    assert [ln.split() for ln in lines[1:3]] == [
        ["TARGET", "FACT", "GOLDEN", "NOW", "FROM"],
        ["gold3", "gpu.gpu3.ecc_mode", "Enabled", "Disabled", "facts"]], r.stdout
    assert lines[3:] == ["no drift: gold[1-2]"], r.stdout

    # hosts.yaml names the golden file: node-check itself holds every node to it
    write_hosts(hosts, c_capture=ECC_OFF, defaults=", baseline: golden.yaml")
    r = mldiag("node-check", "-g", "fleet", "--no-dcgm", "--json", "--hosts-file", hosts)
    docs = {d["target"]: d for d in json.loads(r.stdout)}
    found = {t: [(f["level"], f["action"], f["code"], f["message"], f.get("gpus"))
                 for f in d["findings"] if f["check"] == "baseline"] for t, d in docs.items()}
    assert found == {"gold1": [], "gold2": [], "gold3": [
        ("warn", "monitor", "baseline-deviation", "gpu.gpu3.ecc_mode: Disabled, golden Enabled", [3])]}

"""node-check --taint / --condition / --untaint (diagnostics/builtin/node_check/taint.py, issue 34
item 3): the plan from hand-made results, and the commands at argv level against a stand-in
kubectl (tests/fakes/kubectl.py, kubectl's own output and messages: kubectl.SOURCE.md) run
through the real local transport: a drain-level finding taints the pod's node, a healthy one
removes only mldiag's taint and condition, someone else's taint stays, a dry run changes
nothing, a node name kubectl gives that Kubernetes would not is refused. The stand-in itself is
held against the real kubectl (this machine kind has it), run against a loopback API server
(tests/fakes/kubectl_apiserver.py): same commands, same bytes."""

import datetime
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from diagnostics.builtin.node_check import run as node_check_run, taint
from diagnostics.core.errors import EXIT_ERROR
from diagnostics.core.outcome import Outcome
from diagnostics.core.results import Result
from diagnostics.engine import execute
from diagnostics.inventory.topology import Container, SshHost, Target
from diagnostics.transport.base import ProcessOutput
from diagnostics.transport.local import LocalTransport
from tests.programs import REPO, node_check_finding as finding, node_check_result as result

FAKE = Path(REPO) / "tests" / "fakes" / "kubectl.py"
NOW = datetime.datetime(2026, 12, 1, 10, 0, 27, tzinfo=datetime.timezone.utc)
OURS = {"key": taint.KEY, "effect": "NoSchedule"}
CORDON = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule",
          "timeAdded": "2026-11-30T08:00:00Z"}
TEAM = {"key": "team-b.example.com/reserved", "value": "llm", "effect": "NoSchedule"}
BY_HAND = {"key": taint.KEY, "effect": "NoExecute", "timeAdded": "2026-11-30T08:00:00Z"}
GPU = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def pod_target(name, pod=None, namespace="ml", **more):
    return Target(name=name, local=True, container=Container("kubectl", pod or name,
                                                             namespace=namespace), **more)


TARGETS = [pod_target("trainer-0"), pod_target("trainer-1"), pod_target("trainer-2"),
           pod_target("deploy", "deploy/trainer"),
           Target(name="b200", host=SshHost(name="b200", address="10.1.230.174"))]


def pod_json(name, namespace, node):
    """A Pod as `kubectl get pods -o json` gives it (the fields read, and a few beside them)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "labels": {"app": "trainer"}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "pytorch:24.12"}],
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                      "effect": "NoSchedule"}]},
            "status": {"phase": "Running", "hostIP": "10.0.0.7"}}


def node_json(name, taints=(), conditions=()):
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "message": "kubelet is posting ready status",
             "lastHeartbeatTime": "2026-12-01T09:59:00Z", "lastTransitionTime": "2026-11-01T00:00:00Z"}
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"podCIDR": "10.244.7.0/24"},
            "status": {"conditions": [ready, *conditions],
                       "capacity": {"nvidia.com/gpu": "8"},
                       "images": [{"names": ["pytorch:24.12"], "sizeBytes": 9876543210}]}}
    if taints:
        node["spec"]["taints"] = [dict(t) for t in taints]
    return node


OUR_CONDITION = {"type": taint.CONDITION, "status": "True", "reason": taint.REASON,
                 "message": "mldiag: xid-79 (node-check of ml/trainer-0 2026-11-30T10:00Z)",
                 "lastHeartbeatTime": "2026-11-30T10:00:00Z",
                 "lastTransitionTime": "2026-11-30T10:00:00Z"}


class Kube:
    """The stand-in kubectl first on PATH, its cluster a JSON file, its calls logged."""

    def __init__(self, tmp_path, monkeypatch):
        bindir = tmp_path / "kubectl-bin"
        bindir.mkdir()
        (bindir / "kubectl").write_text(f'#!/bin/sh\nexec "{sys.executable}" -I "{FAKE}" "$@"\n')
        (bindir / "kubectl").chmod(0o755)
        self.state_path = tmp_path / "cluster.json"
        self.log = tmp_path / "kubectl.log"
        monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("MLDIAG_FAKE_KUBECTL_STATE", str(self.state_path))
        monkeypatch.setenv("MLDIAG_FAKE_KUBECTL_LOG", str(self.log))
        self.set({}, {})

    def set(self, pods, nodes):
        self.state_path.write_text(json.dumps({"namespace": "default", "pods": pods,
                                               "nodes": nodes}))

    @property
    def nodes(self):
        return json.loads(self.state_path.read_text())["nodes"]

    def taints(self, node):
        return self.nodes[node]["spec"].get("taints", [])

    def conditions(self, node):
        return {c["type"]: c for c in self.nodes[node]["status"]["conditions"]}

    def calls(self):
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def patches(self):
        path = Path(str(self.log) + ".patches")
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def kube(tmp_path, monkeypatch):
    return Kube(tmp_path, monkeypatch)


def local(target):
    return LocalTransport()


def run(steps, **flags):
    return taint.run(steps, transport=local, now=NOW, **flags)


GET_POD = ["get", "pods", "-n", "ml", "trainer-0", "-o", "json"]
GET_NODE = ["get", "nodes", "gpu-7", "-o", "json"]
TAINT = ["taint", "node", "gpu-7", "mldiag.io/unhealthy:NoSchedule"]
UNTAINT = ["taint", "node", "gpu-7", "mldiag.io/unhealthy:NoSchedule-"]
SET_PATCH = {"status": {"conditions": [{
    "type": "MldiagUnhealthy", "status": "True", "reason": "NodeCheckFailed",
    "message": "mldiag: xid-79, nvlink-down (node-check of ml/trainer-0 2026-12-01T10:00Z)",
    "lastHeartbeatTime": "2026-12-01T10:00:27Z", "lastTransitionTime": "2026-12-01T10:00:27Z"}]}}
SET_SHOWN = ("kubectl patch node gpu-7 --subresource status --type strategic -p "
             "'" + json.dumps(SET_PATCH, separators=(",", ":")) + "'")
DELETE_SHOWN = ("kubectl patch node gpu-7 --subresource status --type strategic -p "
                "'{\"status\":{\"conditions\":[{\"$patch\":\"delete\",\"type\":\"MldiagUnhealthy\"}]}}'")


def failing(target="trainer-0"):
    return result(target, "fail", finding("nvlink-down", "drain"), finding("xid-79", "rma"),
                  finding("pcie-width", "reboot"))


# ------------------------------------------------------------------ plan (pure)

def test_plan_taints_drain_or_worse_untaints_what_passes_and_skips_what_is_not_a_pod():
    results = [failing(), result("trainer-1", "fail", finding("xid-48", "reset-gpu")),
               result("trainer-2", "warn", finding("ib-errors", "monitor", "warn")),
               result("deploy", "ok"), result("b200", "fail", finding("xid-79", "rma")),
               Result.failure("node-check", "trainer-1", "container", "kubectl exec: not found")]
    steps = taint.plan(results, TARGETS, now=NOW)
    assert [(s.target, s.want) for s in steps] == [
        ("trainer-0", "taint"), ("trainer-1", "keep"), ("trainer-2", "untaint"),
        ("deploy", "skip"), ("b200", "skip"), ("trainer-1", "keep")]
    assert steps[0].codes == ("xid-79", "nvlink-down") and steps[0].when == "2026-12-01T10:00Z"
    assert steps[1].why == "still failing (worst action reset-gpu)"
    assert steps[3].why.startswith("not a plain pod name")
    assert steps[4].why == "not a Kubernetes pod"
    assert steps[5].why == "not checked (container)"


def test_pods_on_one_node_decide_together():
    pod = TARGETS[0]
    taint_a = taint.TaintStep("a", "taint", pod, codes=("xid-79",), when="w")
    taint_b = taint.TaintStep("b", "taint", pod, codes=("nvlink-down", "xid-79"), when="w")
    keep = taint.TaintStep("c", "keep", pod, why="not checked (timeout)")
    ok = taint.TaintStep("d", "untaint", pod)
    assert taint.merged([ok, taint_a, keep, taint_b]).codes == ("xid-79", "nvlink-down")
    assert taint.merged([ok, keep]).want == "keep"
    assert taint.merged([ok, ok]).want == "untaint"


def test_the_condition_message_names_the_codes_and_pods_and_is_bounded():
    assert taint.condition_message(["xid-79"], ["ml/trainer-0", "ml/trainer-1"], "T") == \
        "mldiag: xid-79 (node-check of ml/trainer-[0-1] T)"
    many = taint.condition_message([f"code-number-{i:02d}" for i in range(40)], ["ml/p"], "T")
    assert len(many) <= taint.MESSAGE_MAX and many.endswith(", +27 more (node-check of ml/p T)")


@pytest.mark.parametrize("name, ok", [
    ("gpu-7", True), ("ip-10-0-0-7.ec2.internal", True), ("a" * 253, True), ("a" * 254, False),
    ("-all", False), ("--all", False), ("gpu-7 --all", False), ("gpu-7;id", False),
    ("GPU-7", False), ("gpu_7", False), ("gpu-7.", False), ("", False), ("gpu-7\n", False),
    ("gpu-7/status", False), (7, False), (None, False)])
def test_a_node_name_is_a_dns_1123_subdomain(name, ok):
    assert taint.is_subdomain(name) is ok


def test_become_sudo_prefixes_every_kubectl_command():
    pod = pod_target("trainer-0", become="sudo")
    assert taint.get_pods_argv(pod, ["trainer-0"]) == ["sudo", "-n", "--", "kubectl", *GET_POD]
    assert taint.taint_argv(pod, "gpu-7") == ["sudo", "-n", "--", "kubectl", *TAINT]
    with pytest.raises(ValueError):
        taint.taint_argv(pod, "gpu-7 --all")
    with pytest.raises(ValueError):
        taint.patch_argv(pod, "-all", "/tmp/x.json")


def test_kubectls_answers_are_read_field_by_field():
    pods = json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        pod_json("trainer-0", "ml", "gpu-7"), pod_json("trainer-1", "other", "gpu-9"),
        {"kind": "Pod", "metadata": {"name": "trainer-2", "namespace": "ml"}, "spec": {}},
        {"kind": "Pod", "metadata": {"name": 5}}, "junk"]})
    assert taint.parse_pods(pods, "ml") == {"trainer-0": "gpu-7", "trainer-2": ""}
    assert taint.parse_pods("not json", "ml") == {} and taint.parse_pods("[1]", "ml") == {}
    node = node_json("gpu-7", [OURS, CORDON, {"key": 5, "effect": None}], [OUR_CONDITION])
    [state] = taint.parse_nodes(json.dumps(node)).values()
    assert state.tainted and state.flagged
    assert state.others == ["node.kubernetes.io/unschedulable:NoSchedule", "?:?"]
    assert state.condition == ("True", OUR_CONDITION["message"])
    assert not taint.parse_nodes(json.dumps(node_json("n", [BY_HAND, TEAM])))["n"].tainted


# ------------------------------------------------------------------ against the stand-in kubectl

def test_a_drain_level_finding_taints_the_pods_node(kube):
    kube.set({"ml/trainer-0": pod_json("trainer-0", "ml", "gpu-7")},
             {"gpu-7": node_json("gpu-7", [GPU, CORDON])})
    outcomes = run(taint.plan([failing()], TARGETS, now=NOW), taint=True)
    assert kube.calls() == [GET_POD, GET_NODE, TAINT, GET_NODE]
    assert kube.taints("gpu-7") == [OURS, GPU, CORDON]     # kubectl's order: the new one first
    assert taint.lines(outcomes) == [
        "trainer-0 (node gpu-7): tainted (now Taints=mldiag.io/unhealthy:NoSchedule,"
        "nvidia.com/gpu=present:NoSchedule,node.kubernetes.io/unschedulable:NoSchedule): "
        "kubectl taint node gpu-7 mldiag.io/unhealthy:NoSchedule",
        f"trainer-0 (node gpu-7): --condition would run: {SET_SHOWN}"]
    assert not taint.failed(outcomes)


def test_condition_sets_mldiags_condition_through_a_patch_file_it_removes(kube):
    kube.set({"ml/trainer-0": pod_json("trainer-0", "ml", "gpu-7")}, {"gpu-7": node_json("gpu-7")})
    outcomes = run(taint.plan([failing()], TARGETS, now=NOW), condition=True)
    calls = kube.calls()
    assert calls[:2] == [GET_POD, GET_NODE] and calls[3] == GET_NODE and len(calls) == 4
    *patch, path = calls[2]
    assert patch == ["patch", "node", "gpu-7", "--subresource", "status", "--type", "strategic",
                     "--patch-file"]
    assert path.startswith("/tmp/mldiag-node-condition-") and not os.path.exists(path)
    assert kube.patches() == [SET_PATCH]
    assert kube.conditions("gpu-7")[taint.CONDITION] == SET_PATCH["status"]["conditions"][0]
    assert kube.conditions("gpu-7")["Ready"]["status"] == "True"
    assert "kubectl taint" not in json.dumps(calls)                  # no --taint: not tainted
    assert taint.lines(outcomes)[1] == (
        f"trainer-0 (node gpu-7): {taint.CONDITION} set (now Taints=<none>, "
        f"{taint.CONDITION}=True): {SET_SHOWN}")


def test_a_healthy_pod_removes_only_mldiags_taint_and_condition(kube):
    others = [GPU, CORDON, TEAM, BY_HAND]
    kube.set({"ml/trainer-0": pod_json("trainer-0", "ml", "gpu-7")},
             {"gpu-7": node_json("gpu-7", [OURS, *others], [OUR_CONDITION])})
    outcomes = run(taint.plan([result("trainer-0")], TARGETS, now=NOW), untaint=True)
    assert kube.calls()[2] == UNTAINT
    assert kube.taints("gpu-7") == others                       # someone else's: all there
    assert set(kube.conditions("gpu-7")) == {"Ready"}
    assert kube.patches() == [{"status": {"conditions": [{"$patch": "delete",
                                                          "type": taint.CONDITION}]}}]
    assert taint.lines(outcomes) == [
        "trainer-0 (node gpu-7): untainted (now Taints=nvidia.com/gpu=present:NoSchedule,"
        "node.kubernetes.io/unschedulable:NoSchedule,team-b.example.com/reserved=llm:NoSchedule,"
        "mldiag.io/unhealthy:NoExecute): kubectl taint node gpu-7 mldiag.io/unhealthy:NoSchedule-; "
        "left alone: nvidia.com/gpu=present:NoSchedule, node.kubernetes.io/unschedulable:NoSchedule, "
        "team-b.example.com/reserved=llm:NoSchedule, mldiag.io/unhealthy:NoExecute (not mldiag's)",
        f"trainer-0 (node gpu-7): {taint.CONDITION} removed (now Taints=nvidia.com/gpu=present:"
        "NoSchedule,node.kubernetes.io/unschedulable:NoSchedule,team-b.example.com/reserved=llm:"
        f"NoSchedule,mldiag.io/unhealthy:NoExecute): {DELETE_SHOWN}"]


def test_a_healthy_pod_on_a_node_without_mldiags_marks_changes_nothing(kube):
    kube.set({"ml/trainer-0": pod_json("trainer-0", "ml", "gpu-7")},
             {"gpu-7": node_json("gpu-7", [CORDON, TEAM])})
    outcomes = run(taint.plan([result("trainer-0")], TARGETS, now=NOW), untaint=True, taint=True,
                   condition=True)
    assert kube.calls() == [GET_POD, GET_NODE]
    assert kube.taints("gpu-7") == [CORDON, TEAM]
    assert taint.lines(outcomes) == ["Kubernetes: nothing to taint or untaint"]


def test_a_node_still_failing_below_drain_keeps_mldiags_taint(kube):
    kube.set({"ml/trainer-1": pod_json("trainer-1", "ml", "gpu-7")},
             {"gpu-7": node_json("gpu-7", [OURS])})
    outcomes = run(taint.plan([result("trainer-1", "fail", finding("xid-48", "reset-gpu"))],
                              TARGETS, now=NOW), untaint=True)
    assert kube.calls() == [["get", "pods", "-n", "ml", "trainer-1", "-o", "json"], GET_NODE]
    assert kube.taints("gpu-7") == [OURS]
    assert taint.lines(outcomes) == [
        "Kubernetes: nothing to taint or untaint",
        "trainer-1 (node gpu-7): stays as it is: still failing (worst action reset-gpu) "
        "(Taints=mldiag.io/unhealthy:NoSchedule)"]


def test_one_failing_pod_taints_a_node_its_healthy_neighbours_share(kube):
    kube.set({f"ml/trainer-{i}": pod_json(f"trainer-{i}", "ml", "gpu-7") for i in range(3)},
             {"gpu-7": node_json("gpu-7", [OURS])})
    results = [result("trainer-0"), failing("trainer-1"), result("trainer-2")]
    outcomes = run(taint.plan(results, TARGETS, now=NOW), untaint=True)
    assert kube.calls() == [["get", "pods", "-n", "ml", "trainer-0", "trainer-1", "trainer-2",
                             "-o", "json"], GET_NODE]              # one call each, no untaint
    assert taint.lines(outcomes) == [
        "trainer-[0-2] (node gpu-7): already tainted mldiag.io/unhealthy:NoSchedule",
        "trainer-[0-2] (node gpu-7): --condition would run: kubectl patch node gpu-7 "
        "--subresource status --type strategic -p '" + json.dumps(taint.set_patch(
            "mldiag: xid-79, nvlink-down (node-check of ml/trainer-1 2026-12-01T10:00Z)", NOW),
            separators=(",", ":")) + "'"]


def test_a_dry_run_reads_and_changes_nothing(kube):
    kube.set({"ml/trainer-0": pod_json("trainer-0", "ml", "gpu-7"),
              "ml/trainer-2": pod_json("trainer-2", "ml", "gpu-9")},
             {"gpu-7": node_json("gpu-7", [CORDON]),
              "gpu-9": node_json("gpu-9", [OURS, TEAM], [OUR_CONDITION])})
    before = kube.state_path.read_bytes()
    steps = taint.plan([failing(), result("trainer-2"), result("b200")], TARGETS, now=NOW)
    outcomes = run(steps)
    assert kube.calls() == [["get", "pods", "-n", "ml", "trainer-0", "trainer-2", "-o", "json"],
                            ["get", "nodes", "gpu-7", "gpu-9", "-o", "json"]]
    assert kube.state_path.read_bytes() == before
    assert taint.commands(outcomes) == [
        "kubectl taint node gpu-7 mldiag.io/unhealthy:NoSchedule", SET_SHOWN,
        "kubectl taint node gpu-9 mldiag.io/unhealthy:NoSchedule-",
        DELETE_SHOWN.replace("gpu-7", "gpu-9")]
    assert taint.lines(outcomes) == [
        "trainer-0 (node gpu-7): --taint would run: kubectl taint node gpu-7 "
        "mldiag.io/unhealthy:NoSchedule",
        f"trainer-0 (node gpu-7): --condition would run: {SET_SHOWN}",
        "trainer-2 (node gpu-9): --untaint would run: kubectl taint node gpu-9 "
        "mldiag.io/unhealthy:NoSchedule-; left alone: team-b.example.com/reserved=llm:NoSchedule "
        "(not mldiag's)",
        f"trainer-2 (node gpu-9): --untaint would run: {DELETE_SHOWN.replace('gpu-7', 'gpu-9')}",
        "not a Kubernetes pod: skipped: b200"]
    assert not taint.failed(outcomes)
    # each line shown is a shell command doing the same: the patch one sends with -p the patch
    # mldiag puts in its --patch-file
    assert json.loads(shlex.split(taint.commands(outcomes)[1])[-1]) == SET_PATCH
    assert shlex.split(taint.commands(outcomes)[0]) == ["kubectl", *TAINT]


@pytest.mark.parametrize("hostile", ["gpu-7 --all", "--all", "-l", "gpu-7;id", "GPU-7",
                                     "gpu-7\x1b[2J", "a" * 254, "gpu-7/../x", ""])
def test_a_node_name_kubernetes_would_not_allow_is_refused(kube, hostile):
    kube.set({"ml/trainer-0": pod_json("trainer-0", "ml", hostile)},
             {"gpu-7": node_json("gpu-7")})
    outcomes = run(taint.plan([failing()], TARGETS, now=NOW), taint=True, condition=True)
    assert kube.calls() == [GET_POD]                       # nothing more was sent
    [o] = outcomes
    assert o.status == "error" and taint.failed(outcomes)
    [line] = taint.lines(outcomes)
    if hostile:
        assert line.startswith("trainer-0: pod ml/trainer-0: refused: kubectl says it runs on "
                               "node '"), line
        assert line.endswith("which is not a Kubernetes node name (a DNS-1123 subdomain)"), line
        assert "\x1b" not in line
    else:
        assert line == "trainer-0: pod ml/trainer-0 is not scheduled on a node (no .spec.nodeName)"


def test_a_pod_kubectl_does_not_know_is_an_error_with_kubectls_words(kube):
    kube.set({"ml/trainer-2": pod_json("trainer-2", "ml", "gpu-9")}, {"gpu-9": node_json("gpu-9")})
    outcomes = run(taint.plan([failing(), result("trainer-2")], TARGETS, now=NOW), taint=True)
    assert taint.lines(outcomes) == [
        'trainer-0: pod ml/trainer-0: kubectl get pods: exit 1: Error from server (NotFound): '
        'pods "trainer-0" not found']
    assert taint.failed(outcomes)


def test_a_node_tainted_meanwhile_or_untainted_meanwhile_is_no_failure(kube):
    """Between the read and the change someone did it already: kubectl's refusal for an
    existing taint, or its 'not found' for a missing one, means the node is as wanted."""
    kube.set({"ml/trainer-0": pod_json("trainer-0", "ml", "gpu-7")}, {"gpu-7": node_json("gpu-7")})

    class Meanwhile(LocalTransport):
        def run(self, argv, payload, deadline, **kw):
            if argv[1] == "taint":          # someone else gets there first
                nodes = kube.nodes
                nodes["gpu-7"]["spec"]["taints"] = [] if argv[-1].endswith("-") else [OURS]
                kube.set({"ml/trainer-0": pod_json("trainer-0", "ml", "gpu-7")}, nodes)
            return super().run(argv, payload, deadline, **kw)

    steps = taint.plan([failing()], TARGETS, now=NOW)
    [o, _] = taint.run(steps, taint=True, transport=lambda t: Meanwhile(), now=NOW)
    assert (o.status, o.message) == ("nothing", "already tainted")
    kube.set({"ml/trainer-0": pod_json("trainer-0", "ml", "gpu-7")},
             {"gpu-7": node_json("gpu-7", [OURS])})
    steps = taint.plan([result("trainer-0")], TARGETS, now=NOW)
    [o] = taint.run(steps, untaint=True, transport=lambda t: Meanwhile(), now=NOW)
    assert (o.status, o.message) == ("nothing", "already untainted")


def test_a_failed_change_is_a_failure_with_kubectls_words(kube):
    kube.set({"ml/trainer-0": pod_json("trainer-0", "ml", "gpu-7")}, {"gpu-7": node_json("gpu-7")})

    class Forbidden(LocalTransport):
        def run(self, argv, payload, deadline, **kw):
            if argv[1] == "taint":      # what the API server says to a user without the right
                return ProcessOutput(b"", b'Error from server (Forbidden): nodes "gpu-7" is '
                                     b'forbidden: User "alice" cannot patch resource "nodes" in '
                                     b'API group "" at the cluster scope\n', 1)
            return super().run(argv, payload, deadline, **kw)

    [o, _] = taint.run(taint.plan([failing()], TARGETS, now=NOW), taint=True,
                       transport=lambda t: Forbidden(), now=NOW)
    assert o.status == "failed" and taint.failed([o])
    assert taint.lines([o]) == [
        'trainer-0 (node gpu-7): kubectl failed (exit 1: Error from server (Forbidden): nodes '
        '"gpu-7" is forbidden: User "alice" cannot patch resource "nodes" in API group "" at the '
        'cluster scope): kubectl taint node gpu-7 mldiag.io/unhealthy:NoSchedule']


# ------------------------------------------------------------------ the task's step

@pytest.fixture
def pods_file(tmp_path):
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n  here:\n    local: true\n    containers:\n"
                    "      trainer-0: {runtime: kubectl, id: trainer-0, namespace: ml}\n"
                    "      trainer-2: {runtime: kubectl, id: trainer-2, namespace: ml}\n")
    return path


def finish(path, results, **flags):
    out = io.StringIO()
    outcome = node_check_run.finish(execute.Options(host=["here,trainer-0,trainer-2"],
                                                    hosts_file=str(path), no_color=True),
                                    Outcome(results), None, None, out=out, **flags)
    return outcome, out.getvalue()


def test_node_check_taints_and_untaints_under_a_kubernetes_heading(kube, pods_file):
    kube.set({"ml/trainer-0": pod_json("trainer-0", "ml", "gpu-7"),
              "ml/trainer-2": pod_json("trainer-2", "ml", "gpu-9")},
             {"gpu-7": node_json("gpu-7"), "gpu-9": node_json("gpu-9", [OURS, CORDON])})
    outcome, out = finish(pods_file, [result("here"), failing(), result("trainer-2")],
                          taint=True, untaint=True)
    assert outcome.exit_code == 0 and not outcome.messages
    assert kube.taints("gpu-7") == [OURS] and kube.taints("gpu-9") == [CORDON]
    text = out.split("\nKubernetes:\n", 1)[1]
    assert text.splitlines()[0].startswith("  trainer-0 (node gpu-7): tainted (now Taints=")
    assert "  not a Kubernetes pod: skipped: here\n" in text
    assert "Slurm" not in out


def test_without_a_flag_the_step_reads_only_and_an_unreachable_cluster_is_no_error(
        kube, pods_file, monkeypatch):
    monkeypatch.delenv("MLDIAG_FAKE_KUBECTL_STATE")       # kubectl with no cluster to reach
    outcome, out = finish(pods_file, [result("here"), failing()])
    assert outcome.exit_code == 0
    assert ("trainer-0: pod ml/trainer-0: kubectl get pods: exit 1: The connection to the server "
            "localhost:8080 was refused - did you specify the right host or port?") in out
    outcome, _ = finish(pods_file, [result("here"), failing()], taint=True)
    assert outcome.exit_code == EXIT_ERROR                # asked for, and it did not happen


def test_a_flag_with_no_pod_checked_is_an_error_that_keeps_the_results(kube, pods_file):
    outcome, out = finish(pods_file, [result("here")], untaint=True)
    assert outcome.exit_code == EXIT_ERROR
    assert outcome.messages == ("--taint/--condition/--untaint: no Kubernetes pod was checked",)
    assert kube.calls() == []
    outcome, out = finish(pods_file, [result("here")])
    assert outcome.exit_code == 0 and "Kubernetes" not in out


def test_with_json_the_lines_go_to_the_messages(kube, pods_file):
    kube.set({"ml/trainer-0": pod_json("trainer-0", "ml", "gpu-7")}, {"gpu-7": node_json("gpu-7")})
    out = io.StringIO()
    outcome = node_check_run.finish(execute.Options(host=["trainer-0"], hosts_file=str(pods_file),
                                                    json=True),
                                    Outcome([failing()]), None, None, out=out)
    assert out.getvalue() == ""
    assert outcome.messages[0] == ("trainer-0 (node gpu-7): --taint would run: kubectl taint "
                                   "node gpu-7 mldiag.io/unhealthy:NoSchedule")


def test_the_flags_are_node_checks_and_no_runbook_step_takes_them():
    from diagnostics.builtin import BUILTINS
    [spec] = [s for s in BUILTINS if s.name == "node-check"]
    args = {a.name: a for a in spec.args}
    for name in ("taint", "condition", "untaint"):
        assert args[name].kind == "bool" and args[name].client
        assert args[name].not_in_runbook.startswith("a runbook reports and changes no node")


# ------------------------------------------------------------------ the stand-in's own words

def fake(state, *argv):
    env = {**os.environ, "MLDIAG_FAKE_KUBECTL_STATE": str(state)}
    env.pop("MLDIAG_FAKE_KUBECTL_LOG", None)
    r = subprocess.run([sys.executable, "-I", str(FAKE), *argv], capture_output=True, text=True,
                       env=env, timeout=60)
    return r.returncode, r.stdout, r.stderr


def test_the_stand_in_says_what_kubectl_says(tmp_path):
    state = tmp_path / "cluster.json"
    state.write_text(json.dumps({"nodes": {"gpu-7": node_json("gpu-7", [CORDON])}, "pods": {}}))
    assert fake(state, "taint", "node", "gpu-7", "mldiag.io/unhealthy:NoSchedule") == \
        (0, "node/gpu-7 tainted\n", "")
    assert fake(state, "taint", "node", "gpu-7", "mldiag.io/unhealthy:NoSchedule") == \
        (1, "", "error: node gpu-7 already has mldiag.io/unhealthy taint(s) with same effect(s) "
                "and --overwrite is false\n")
    assert fake(state, "taint", "node", "gpu-7", "mldiag.io/unhealthy:NoSchedule-") == \
        (0, "node/gpu-7 untainted\n", "")
    assert fake(state, "taint", "node", "gpu-7", "mldiag.io/unhealthy:NoSchedule-") == \
        (1, "", 'error: taint "mldiag.io/unhealthy:NoSchedule" not found\n')
    assert fake(state, "taint", "node", "gpu-8", "mldiag.io/unhealthy:NoSchedule") == \
        (1, "", 'Error from server (NotFound): nodes "gpu-8" not found\n')
    code, out, err = fake(state, "get", "nodes", "gpu-7", "gpu-8", "-o", "json")
    assert (code, err) == (1, 'Error from server (NotFound): nodes "gpu-8" not found\n')
    assert json.loads(out)["kind"] == "List" and out.startswith('{\n    "apiVersion": "v1",\n')
    assert fake(state, "get", "nodes", "gpu-8", "-o", "json") == \
        (1, "", 'Error from server (NotFound): nodes "gpu-8" not found\n')
    patch = '{"status":{"conditions":[{"type":"X","status":"True"}]}}'
    args = ("patch", "node", "gpu-7", "--subresource", "status", "--type", "strategic", "-p")
    assert fake(state, *args, patch) == (0, "node/gpu-7 patched\n", "")
    assert fake(state, *args, patch) == (0, "node/gpu-7 patched (no change)\n", "")


def test_the_stand_in_and_the_real_kubectl_say_the_same(tmp_path):
    """The same commands through the real kubectl (against tests/fakes/kubectl_apiserver.py on
    loopback) and through the stand-in, from the same cluster: the same exit code, stdout and
    stderr, byte for byte, and the same cluster after."""
    import shutil
    from tests.fakes import kubectl_apiserver
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is not installed: this machine kind has it (the test needs the "
                    "real CLI's own output)")
    cluster = {"namespace": "ml",
               "pods": {"ml/trainer-0": pod_json("trainer-0", "ml", "gpu-7")},
               "nodes": {"gpu-7": node_json("gpu-7", [GPU, CORDON], [OUR_CONDITION])}}
    served = json.loads(json.dumps(cluster))
    server, url = kubectl_apiserver.serve(served)
    config = tmp_path / "kubeconfig"
    config.write_text(f"apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                      f"clusters: [{{name: k, cluster: {{server: '{url}'}}}}]\n"
                      f"contexts: [{{name: c, context: {{cluster: k, user: u, namespace: ml}}}}]\n"
                      f"users: [{{name: u, user: {{}}}}]\n")
    state = tmp_path / "cluster.json"
    state.write_text(json.dumps(cluster))
    patch_file = tmp_path / "patch.json"
    patch_file.write_bytes(taint.patch_bytes(SET_PATCH))
    patch = ["patch", "node", "gpu-7", "--subresource", "status", "--type", "strategic"]
    commands = [
        GET_POD, ["get", "pods", "-n", "ml", "trainer-0", "trainer-9", "-o", "json"],
        ["get", "pods", "-n", "ml", "trainer-9", "-o", "json"],
        ["get", "pods", "-n", "other", "trainer-0", "-o", "json"],
        GET_NODE, ["get", "nodes", "gpu-7", "gpu-8", "-o", "json"],
        ["get", "nodes", "gpu-8", "-o", "json"],
        TAINT, TAINT, GET_NODE, UNTAINT, UNTAINT, ["taint", "node", "gpu-8", TAINT[-1]],
        patch + ["-p", taint.patch_bytes(taint.delete_patch()).decode()],
        patch + ["--patch-file", str(patch_file)], patch + ["--patch-file", str(patch_file)],
        patch + ["-p", taint.patch_bytes(taint.delete_patch()).decode()], GET_NODE]
    env = {**os.environ, "KUBECONFIG": str(config), "HOME": str(tmp_path)}
    try:
        for argv in commands:
            real = subprocess.run(["kubectl", *argv], capture_output=True, text=True, env=env,
                                  timeout=60)
            assert fake(state, *argv) == (real.returncode, real.stdout, real.stderr), argv
    finally:
        server.shutdown()
    assert json.loads(state.read_text())["nodes"] == served["nodes"]
    # no cluster to reach: the same words, klog's lines before them (their time and pid aside)
    env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    env["HOME"] = str(tmp_path / "nobody")
    real = subprocess.run(["kubectl", *GET_POD], capture_output=True, text=True, env=env,
                          timeout=60)
    fake_env = {**env, "PATH": os.environ["PATH"]}
    stand_in = subprocess.run([sys.executable, "-I", str(FAKE), *GET_POD], capture_output=True,
                              text=True, env=fake_env, timeout=60)
    when = re.compile(r"^E\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ ", re.M)
    assert (stand_in.returncode, stand_in.stdout, when.sub("E", stand_in.stderr)) == \
        (real.returncode, real.stdout, when.sub("E", real.stderr))


def test_the_flags_reach_the_step_from_the_command_line(hosts):
    """`mldiag node-check --untaint` on a host that is no pod: the check runs, then the step
    says that nothing it was asked for could happen (exit 3)."""
    from tests.programs import mldiag
    path, marker = hosts
    r = mldiag("node-check", "-H", "here", "--no-dcgm", "--untaint", "--json",
               cwd=path.parent, timeout=120)
    assert marker.exists()
    assert r.returncode == EXIT_ERROR, (r.stdout, r.stderr)
    assert "--taint/--condition/--untaint: no Kubernetes pod was checked" in r.stderr

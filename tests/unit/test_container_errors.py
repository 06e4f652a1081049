"""A container runtime whose service cannot be reached is the `container` layer, not `internal`
(issue 11 item 14). The real CLIs (docker, podman, kubectl are on this machine kind; the CI
script installs podman) pointed at a socket or server that is not there, on a local host's
container target, through the real mldiag program."""

import json
import shutil

import pytest

from diagnostics.transport.containers import Docker, Kubectl, Podman
from tests.programs import mldiag

NOWHERE = "unix:///nonexistent/mldiag-test.sock"


def kubeconfig(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                    "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
                    "contexts: [{name: c, context: {cluster: k, user: u, namespace: ml}}]\n"
                    "users: [{name: u, user: {token: not-a-secret-just-a-shape}}]\n")
    return str(path)


CASES = {
    "docker": ({"DOCKER_HOST": NOWHERE}, "Cannot connect to the Docker daemon"),
    "podman": ({"CONTAINER_HOST": NOWHERE}, "Cannot connect to Podman"),
    "kubectl": ({}, "to the server"),
}


@pytest.mark.parametrize("runtime", list(CASES))
def test_a_runtime_without_its_service_is_a_container_error(tmp_path, runtime):
    if shutil.which(runtime) is None:
        pytest.fail(f"{runtime} is not installed: this machine kind has it (the test needs the "
                    "real CLI's own message)")
    env, said = CASES[runtime]
    if runtime == "kubectl":
        env = {"KUBECONFIG": kubeconfig(tmp_path)}
    (tmp_path / "hosts.yaml").write_text(
        f"hosts:\n  here:\n    local: true\n    containers:\n"
        f"      box: {{runtime: {runtime}, id: trainer-0}}\n")
    r = mldiag("ping", "-H", "box,here", "--json", cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 3, (r.stdout, r.stderr)
    rows = {doc["target"]: doc for doc in json.loads(r.stdout)}
    assert rows["here"]["status"] == "ok"
    error = rows["box"]["error"]
    assert error["layer"] == "container", error
    assert "cannot reach its service" in error["message"] and said in error["message"], error


@pytest.mark.parametrize("hop", [Docker("c1"), Podman("c1"), Kubectl("p-0")], ids=lambda h: h.tool)
@pytest.mark.parametrize("stderr", ["sh: 1: {tool}: not found", "bash: {tool}: command not found",
                                    "zsh:1: command not found: {tool}",
                                    "{tool}: No such file or directory"])
def test_a_runtime_that_is_not_installed_is_a_container_error(hop, stderr):
    """What each login shell (and a local exec) says for a missing program."""
    line = stderr.format(tool=hop.tool)
    assert hop.classify(127, line) == ("container", f"{hop.tool} is not installed on the host ({line})")

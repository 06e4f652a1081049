"""hosts.yaml loading (DESIGN.md §2): the documented example, inheritance, every error
with its ``file:line: key:`` prefix, selection, and random documents that may only ever
raise InputError."""

import os
import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagnostics.inventory import topology
from diagnostics.core.errors import EXIT_BAD_INPUT, InputError
from diagnostics.inventory.topology import (LOCAL_TARGET, NAME, Container, SshHost, Slurm, Topology,
                                  is_safe_token, load, loads)

DATA = Path(__file__).parent / "data"
DESIGN_EXAMPLE = DATA / "design_example.yaml"


def doc(text: str) -> str:
    """Dedented YAML whose first line is line 1."""
    return textwrap.dedent(text).lstrip("\n")


def error_of(text: str, path: str = "hosts.yaml") -> InputError:
    with pytest.raises(InputError) as caught:
        loads(doc(text), path)
    return caught.value


# ---------------------------------------------------------------------------- the DESIGN.md example

# Function-scoped (not module): mutmut maps each test to the code it calls, and a shared
# fixture's load would be charged to the first test only, hiding the others' assertions.
@pytest.fixture
def example() -> Topology:
    return load(str(DESIGN_EXAMPLE))


def test_example_targets_in_file_order(example):
    assert list(example.targets) == (
        ["local", "bastion", "pve1", "trainbox", "b200", "dgx01"]
        + [f"gpu{i:02d}" for i in range(1, 17)]
        + ["k8s-node", "trainer", "cluster-a"])
    assert example.path == str(DESIGN_EXAMPLE)


def test_example_local_is_the_files_own(example):
    local = example.targets["local"]
    assert local.local and local.host is None
    assert local.source == (str(DESIGN_EXAMPLE), 8)
    assert example.default_targets == ("local",)


def test_example_defaults_reach_hosts(example):
    b200 = example.targets["b200"]
    assert b200.host == SshHost(name="b200", address="10.1.230.174", user="root",
                                connect_timeout=10.0)
    assert b200.python == "/opt/venv/bin/python" and b200.timeout == 300.0 and b200.gpus == 8


def test_example_jump_and_container(example):
    bastion = SshHost(name="bastion", address="gw.example.org", port=2222, user="ops")
    trainbox = example.targets["trainbox"]
    assert trainbox.host == SshHost(name="pve1", address="10.1.2.6", user="root", jump=bastion)
    assert trainbox.container == Container(runtime="pct", id="200")
    assert trainbox.python == "/root/venv/bin/python"
    assert trainbox.env == (("HF_HOME", "/dev/shm/hf"),)
    assert trainbox.models == (("target", "/dev/shm/Qwen3.6-27B"), ("draft", "/dev/shm/drafter"))
    assert trainbox.default_model == "/dev/shm/Qwen3.6-27B"
    assert trainbox.source == (str(DESIGN_EXAMPLE), 14)
    assert example.targets["pve1"].container is None


def test_tmpdir_is_inherited_defaults_host_container():
    topo = topology.loads("defaults: {tmpdir: /scratch}\nhosts:\n  a: {}\n  b:\n    tmpdir: /b/tmp\n"
                          "    containers:\n      c: {runtime: docker, id: c, tmpdir: /dev/shm}\n"
                          "      d: {runtime: docker, id: d}\n")
    assert [topo.targets[n].tmpdir for n in "abcd"] == ["/scratch", "/b/tmp", "/dev/shm", "/b/tmp"]


def test_example_become_and_activate(example):
    dgx = example.targets["dgx01"]
    assert dgx.become == "sudo" and dgx.host.user == "alice"
    assert dgx.activate == ("/opt/conda/etc/profile.d/conda.sh", "conda", "activate", "train")


def test_example_node_range_pairs_addresses(example):
    for i in range(1, 17):
        target = example.targets[f"gpu{i:02d}"]
        assert target.host.address == f"10.0.0.{i}" and target.gpus == 8
        assert target.source == (str(DESIGN_EXAMPLE), 28)


def test_example_kubectl_and_slurm(example):
    trainer = example.targets["trainer"]
    assert trainer.container == Container(runtime="kubectl", id="trainer-0", namespace="ml",
                                          container="main")
    assert trainer.host.address == "ctl.example.org"
    assert example.targets["cluster-a"].slurm == Slurm(
        partition="gpu", nodes=4, gpus_per_node=8, time="00:10:00", account="ml",
        nodelist="gpu[001-004]")


def test_example_groups(example):
    assert example.groups == {"h200": ("b200",) + tuple(f"gpu{i:02d}" for i in range(1, 9))}


def test_every_command_line_token_of_the_example_is_safe(example):
    for target in example.targets.values():
        tokens = [target.python, *target.activate]
        if target.container:
            tokens += [t for t in (target.container.id, target.container.namespace,
                                   target.container.container, target.container.exec_user) if t]
        assert all(is_safe_token(t) and t[0] not in "-=~" for t in tokens), target


# ---------------------------------------------------------------------------- inheritance

INHERITANCE = doc("""
    defaults:
      user: ops
      port: 2200
      python: /usr/bin/python3
      timeout: 60
      connect_timeout: 3.5
      identity_file: ~/.ssh/id_ops
      host_key_policy: accept-new
      become: sudo
      env: {A: from-defaults, B: from-defaults, PORT: 8000}
      activate: /opt/env.sh
    hosts:
      h:
        address: h.lab
        user: alice
        timeout: 120
        env: {B: from-host, C: from-host}
        models: {big: /m/big, small: /m/small}
        gpus: 4
        containers:
          c:
            runtime: docker
            id: trainer
            exec_user: ml
            python: /venv/bin/python
            env: {C: from-container, D: "1.10"}
          c2: {runtime: podman, id: other, activate: "", models: {only: /m/only}, gpus: 1}
      plain: {address: plain.lab, become: false}
      here: {local: true}
    """)


@pytest.fixture
def inherited() -> Topology:
    return loads(INHERITANCE)


def test_connection_settings_come_from_defaults_then_host(inherited):
    assert inherited.targets["h"].host == SshHost(
        name="h", address="h.lab", port=2200, user="alice", identity_file="~/.ssh/id_ops",
        connect_timeout=3.5, host_key_policy="accept-new")


def test_env_merges_and_everything_else_overrides(inherited):
    host, box = inherited.targets["h"], inherited.targets["c"]
    assert host.env_dict == {"A": "from-defaults", "B": "from-host", "PORT": "8000",
                             "C": "from-host"}
    assert box.env_dict == {"A": "from-defaults", "B": "from-host", "PORT": "8000",
                            "C": "from-container", "D": "1.10"}
    assert (host.python, host.timeout, host.activate) == ("/usr/bin/python3", 120.0,
                                                           ("/opt/env.sh",))
    assert (box.python, box.timeout, box.activate) == ("/venv/bin/python", 120.0,
                                                       ("/opt/env.sh",))
    assert box.models == (("big", "/m/big"), ("small", "/m/small")) and box.gpus == 4
    other = inherited.targets["c2"]
    assert other.activate == () and other.models == (("only", "/m/only"),) and other.gpus == 1


def test_container_runs_on_its_host_with_the_hosts_become(inherited):
    box = inherited.targets["c"]
    assert box.host == inherited.targets["h"].host
    assert box.become == "sudo" and not box.local
    assert box.container == Container(runtime="docker", id="trainer", exec_user="ml")


def test_become_false_turns_inherited_sudo_off(inherited):
    assert inherited.targets["plain"].become is None


def test_local_host_takes_run_settings_but_not_connection_ones(inherited):
    here = inherited.targets["here"]
    assert here.local and here.host is None and here.become is None
    assert here.python == "/usr/bin/python3" and here.timeout == 60.0
    assert here.activate == ("/opt/env.sh",)


def test_embedded_local_takes_run_settings_from_defaults(inherited):
    local = inherited.targets["local"]
    assert local.local and local.source == ("<embedded>", 0) and local.become is None
    assert local.python == "/usr/bin/python3" and local.timeout == 60.0
    assert local.env_dict == {"A": "from-defaults", "B": "from-defaults", "PORT": "8000"}
    assert list(inherited.targets)[0] == "local"


def test_numbers_keep_their_spelling_as_ids_and_env_values():
    topo = loads(doc("""
        hosts:
          h:
            env: {OCTAL: 010, VERSION: 2.10, N: 3, EQUALS: =}
            containers: {c: {runtime: pct, id: 0200}}
        """))
    assert topo.targets["h"].env_dict == {"OCTAL": "010", "VERSION": "2.10", "N": "3",
                                          "EQUALS": "="}
    assert topo.targets["c"].container.id == "0200"


def test_a_sexagesimal_looking_value_is_a_string():
    topo = loads('hosts:\n  c: {slurm: {time: 00:10:00, nodes: 2}}\n')
    assert topo.targets["c"].slurm == Slurm(time="00:10:00", nodes=2)


def test_become_true_means_sudo_and_empty_entries_are_aliases():
    topo = loads("hosts:\n  a: {become: true}\n  b:\n  c: {}\n")
    assert topo.targets["a"].become == "sudo"
    assert topo.targets["b"].host == SshHost(name="b") == SshHost(name="b", address=None)
    assert topo.targets["c"].host.address is None


def test_a_file_with_nothing_but_defaults_has_the_embedded_local():
    topo = loads("defaults: {python: /p/python}\n")
    assert list(topo.targets) == ["local"] and topo.targets["local"].python == "/p/python"


def test_empty_sections_are_allowed():
    topo = loads("defaults:\nhosts:\ngroups:\n")
    assert list(topo.targets) == ["local"] and topo.groups == {}


def test_embedded_local_equals_LOCAL_TARGET_without_defaults():
    assert loads("hosts: {}\n").targets["local"] == LOCAL_TARGET


def test_local_host_may_have_containers():
    topo = loads("hosts:\n  ws: {local: true, containers: {dev: {runtime: docker, id: dev}}}\n")
    dev = topo.targets["dev"]
    assert dev.local and dev.host is None and dev.container == Container("docker", "dev")


def test_a_file_may_define_local_as_an_ssh_host():
    topo = loads("hosts:\n  local: {address: 127.0.0.1}\n")
    assert not topo.targets["local"].local and topo.targets["local"].host.address == "127.0.0.1"


# ---------------------------------------------------------------------------- jumps

def test_jump_chain_resolves_recursively():
    topo = loads(doc("""
        hosts:
          inner: {address: 10.0.0.2, jump: middle}
          middle: {address: 10.0.0.1, jump: bastion}
          bastion: {}
          "n[1-2]": {address: "10.1.0.[1-2]", jump: inner}
        """))
    bastion = SshHost(name="bastion")
    middle = SshHost(name="middle", address="10.0.0.1", jump=bastion)
    inner = SshHost(name="inner", address="10.0.0.2", jump=middle)
    assert topo.targets["inner"].host == inner
    assert topo.targets["n2"].host == SshHost(name="n2", address="10.1.0.2", jump=inner)


@pytest.mark.parametrize("text, prefix", [
    pytest.param("""
        hosts:
          a: {jump: b}
          b: {jump: a}
        """, "hosts.yaml:2: hosts.a.jump: jump cycle: a → b → a", id="two"),
    pytest.param("""
        hosts:
          a: {jump: a}
        """, "hosts.yaml:2: hosts.a.jump: jump cycle: a → a", id="self"),
    pytest.param("""
        hosts:
          x: {jump: b}
          a: {jump: c}
          b: {jump: a}
          c: {jump: b}
        """, "hosts.yaml:3: hosts.a.jump: jump cycle: a → c → b → a", id="entered-from-outside"),
])
def test_jump_cycle_names_the_cycle(text, prefix):
    assert str(error_of(text)) == prefix


@pytest.mark.parametrize("text, prefix", [
    pytest.param("hosts:\n  a: {jump: bastoin}\n  bastion: {}\n",
                 "hosts.yaml:2: hosts.a.jump: unknown host 'bastoin'", id="unknown"),
    pytest.param("hosts:\n  a: {jump: box}\n  h: {containers: {box: {runtime: docker, id: b}}}\n",
                 "hosts.yaml:2: hosts.a.jump: unknown host 'box'", id="container"),
    pytest.param("hosts:\n  a: {jump: here}\n  here: {local: true}\n",
                 "hosts.yaml:2: hosts.a.jump: 'here' is a local host", id="local"),
    pytest.param("hosts:\n  a: {jump: local}\n",
                 "hosts.yaml:2: hosts.a.jump: unknown host 'local'", id="embedded-local"),
    pytest.param("hosts:\n  a: {jump: 'b;c'}\n",
                 "hosts.yaml:2: hosts.a.jump: 'b;c' is not a valid name", id="bad-name"),
])
def test_jump_errors(text, prefix):
    assert str(error_of(text)).startswith(prefix)


def test_unknown_jump_suggests_the_close_name():
    assert "did you mean 'bastion'?" in str(error_of("hosts:\n  a: {jump: bastoin}\n  bastion:\n"))


# ---------------------------------------------------------------------------- node ranges

def test_node_range_without_address_is_ssh_aliases():
    topo = loads('hosts:\n  "n[1-3]": {gpus: 2}\n')
    assert [t.host for t in topo.select(["n[1-3]"])] == [SshHost(name=f"n{i}") for i in (1, 2, 3)]


def test_node_range_of_one_with_a_bracketed_address():
    topo = loads('hosts:\n  "gpu[07]": {address: "10.0.0.[7]"}\n')
    assert topo.targets["gpu07"].host.address == "10.0.0.7"


def test_multidimensional_address_range_pairs_in_clustershell_order():
    topo = loads('hosts:\n  "n[1-4]": {address: "10.[1-2].0.[1-2]"}\n')
    assert [topo.targets[f"n{i}"].host.address for i in range(1, 5)] == [
        "10.1.0.1", "10.1.0.2", "10.2.0.1", "10.2.0.2"]


@pytest.mark.parametrize("text, prefix", [
    pytest.param('hosts:\n  "gpu[1-2]": {address: "10.0.0.[1-3]"}\n',
                 "hosts.yaml:2: hosts.gpu[1-2].address: '10.0.0.[1-3]' expands to 3 addresses "
                 "but 'gpu[1-2]' to 2 hosts", id="count-mismatch"),
    pytest.param('hosts:\n  "gpu[1-2]": {address: 10.0.0.1}\n',
                 "hosts.yaml:2: hosts.gpu[1-2].address: '10.0.0.1' is one address for 2 hosts",
                 id="address-without-range"),
    pytest.param('hosts:\n  "gpu[01-": {}\n',
                 "hosts.yaml:2: hosts.gpu[01-: invalid node set 'gpu[01-': missing bracket",
                 id="bad-key"),
    pytest.param('hosts:\n  "gpu[a-b]": {}\n',
                 "hosts.yaml:2: hosts.gpu[a-b]: invalid node set 'gpu[a-b]': bad range",
                 id="bad-range"),
    pytest.param('hosts:\n  "gpu[1-2]":\n    address: "10.0.0.[2-1"\n',
                 "hosts.yaml:3: hosts.gpu[1-2].address: invalid node set '10.0.0.[2-1'",
                 id="bad-address"),
    pytest.param('hosts:\n  "gpu[1-99999999]": {}\n',
                 "hosts.yaml:2: hosts.gpu[1-99999999]: node set 'gpu[1-99999999]' has up to "
                 "99999999 nodes (at most 100000)", id="too-big"),
    pytest.param('hosts:\n  "n[1-100000]p[1-100000]": {}\n',
                 "hosts.yaml:2: hosts.n[1-100000]p[1-100000]: node set", id="too-big-2d"),
    pytest.param('hosts:\n  "n[1-2]":\n    containers: {c: {runtime: docker, id: c}}\n',
                 "hosts.yaml:3: hosts.n[1-2].containers: a node range (2 hosts) cannot have "
                 "containers", id="containers"),
    pytest.param('hosts:\n  "a[1-2]": {}\n  a2: {}\n',
                 "hosts.yaml:3: hosts.a2: duplicate target name 'a2' (first defined at line 2)",
                 id="overlap"),
    pytest.param('hosts:\n  "h[1-2]": {address: "10.0.[1-2].1;x"}\n',
                 "hosts.yaml:2: hosts.h[1-2].address: '10.0.1.1;x' contains characters outside",
                 id="unsafe-expanded-address"),
    pytest.param('hosts:\n  "a;b,c": {}\n',
                 "hosts.yaml:2: hosts.a;b,c: 'a;b' is not a valid name", id="unsafe-name"),
    pytest.param('hosts:\n  "l[1-2]": {local: true}\n',
                 "hosts.yaml:2: hosts.l[1-2]: a local host cannot be a node range (2 hosts)",
                 id="local-range"),
])
def test_node_range_errors(text, prefix):
    assert str(error_of(text)).startswith(prefix)


# ---------------------------------------------------------------------------- groups, default targets

GROUPS = doc("""
    defaults:
      targets: [gpus, "b[1-2]"]
    hosts:
      "gpu[01-04]": {}
      "b[1-3]": {}
    groups:
      all: [gpus, b3, "gpu01,b1"]
      gpus: ["gpu[01-04]", gpu02]
      one: b2
      none:
    """)


def test_groups_expand_members_in_order_without_duplicates():
    topo = loads(GROUPS)
    gpus = ("gpu01", "gpu02", "gpu03", "gpu04")
    assert topo.groups == {"all": gpus + ("b3", "b1"), "gpus": gpus, "one": ("b2",), "none": ()}
    assert topo.default_targets == gpus + ("b1", "b2")


@pytest.mark.parametrize("text, prefix", [
    pytest.param("groups:\n  g:\n    - local\n    - nope\n",
                 "hosts.yaml:4: groups.g[1]: unknown target or group 'nope'", id="unknown"),
    pytest.param('hosts:\n  "n[1-2]": {}\ngroups:\n  g: ["n[1-3]"]\n',
                 "hosts.yaml:4: groups.g[0]: unknown target or group 'n3' (from 'n[1-3]')",
                 id="unknown-in-node-set"),
    pytest.param("groups:\n  a: [b]\n  b: [a]\n",
                 "hosts.yaml:3: groups.b[0]: group cycle: a → b → a", id="cycle"),
    pytest.param("groups:\n  a: [local, a]\n",
                 "hosts.yaml:2: groups.a[1]: group cycle: a → a", id="self"),
    pytest.param("groups:\n  local: [local]\n",
                 "hosts.yaml:2: groups.local: group name 'local' is also a target name",
                 id="name-clash"),
    pytest.param("groups:\n  g: [local, 3]\n",
                 "hosts.yaml:2: groups.g[1]: expected a target or group name, got 3",
                 id="not-a-string"),
    pytest.param("groups:\n  g: {a: b}\n",
                 "hosts.yaml:2: groups.g: expected a list of target or group names, got a mapping",
                 id="not-a-list"),
    pytest.param("groups:\n  'g:1': [local]\n",
                 "hosts.yaml:2: groups.g:1: 'g:1' is not a valid name", id="bad-name"),
    pytest.param("groups:\n  g: ['n[1-']\n",
                 "hosts.yaml:2: groups.g[0]: invalid node set 'n[1-'", id="bad-node-set"),
    pytest.param("groups:\n  g: ['local,']\n",
                 "hosts.yaml:2: groups.g[0]: empty name in 'local,'", id="empty-part"),
    pytest.param("groups: [a]\n", "hosts.yaml:1: groups: expected a mapping, got a list",
                 id="section-not-a-mapping"),
    pytest.param("defaults:\n  targets: [local, nope]\n",
                 "hosts.yaml:2: defaults.targets[1]: unknown target or group 'nope'",
                 id="default-unknown"),
    pytest.param("defaults:\n  targets: []\n",
                 "hosts.yaml:2: defaults.targets: expected at least one target",
                 id="default-empty"),
    pytest.param("defaults:\n  targets: {a: 1}\n",
                 "hosts.yaml:2: defaults.targets: expected a list of target or group names",
                 id="default-mapping"),
])
def test_group_and_default_target_errors(text, prefix):
    assert str(error_of(text)).startswith(prefix)


def test_default_targets_default_to_local_and_may_name_a_string():
    assert loads("hosts: {a: {}}\n").default_targets == ("local",)
    assert loads("defaults: {targets: 'a,local'}\nhosts: {a: {}}\n").default_targets == (
        "a", "local")


# ---------------------------------------------------------------------------- containers

@pytest.mark.parametrize("text, prefix", [
    pytest.param("""
        hosts:
          h1:
            containers:
              box: {runtime: docker, id: x}
          h2:
            containers:
              box: {runtime: docker, id: y}
        """, "hosts.yaml:7: hosts.h2.containers.box: duplicate target name 'box' "
             "(first defined at line 4)", id="duplicate-container"),
    pytest.param("""
        hosts:
          h1:
            containers:
              h2: {runtime: docker, id: x}
          h2: {}
        """, "hosts.yaml:5: hosts.h2: duplicate target name 'h2' (first defined at line 4)",
        id="container-named-like-a-host"),
    pytest.param("""
        hosts:
          h:
            containers:
              box: {runtime: docker, id: x, namespace: ml}
        """, "hosts.yaml:4: hosts.h.containers.box.namespace: only for runtime kubectl "
             "(this one is docker)", id="namespace-not-kubectl"),
    pytest.param("""
        hosts:
          h:
            containers:
              box: {runtime: lxc, id: x, container: main}
        """, "hosts.yaml:4: hosts.h.containers.box.container: only for runtime kubectl",
        id="container-not-kubectl"),
    pytest.param("""
        hosts:
          h:
            containers:
              box: {id: x}
        """, "hosts.yaml:4: hosts.h.containers.box.runtime: required (one of pct, docker, "
             "podman, lxc, kubectl)", id="no-runtime"),
    pytest.param("""
        hosts:
          h:
            containers:
              box:
                runtime: docker
        """, "hosts.yaml:4: hosts.h.containers.box.id: required", id="no-id"),
    pytest.param("""
        hosts:
          h:
            containers:
              box:
                runtime: ptc
                id: 200
        """, "hosts.yaml:5: hosts.h.containers.box.runtime: 'ptc' is not one of pct, docker, "
             "podman, lxc, kubectl", id="bad-runtime"),
    pytest.param("""
        hosts:
          h:
            containers:
              box: {runtime: pct, id: trainbox}
        """, "hosts.yaml:4: hosts.h.containers.box.id: expected a numeric VMID for runtime pct, "
             "got 'trainbox'", id="pct-id"),
    pytest.param("""
        hosts:
          h:
            containers: [a, b]
        """, "hosts.yaml:3: hosts.h.containers: expected a mapping, got a list",
        id="containers-list"),
    pytest.param("""
        hosts:
          h:
            containers:
              box: {runtime: docker, id: true}
        """, "hosts.yaml:4: hosts.h.containers.box.id: expected a string, got true (a boolean)",
        id="id-bool"),
])
def test_container_errors(text, prefix):
    assert str(error_of(text)).startswith(prefix)


# ---------------------------------------------------------------------------- the safe alphabet

UNSAFE = ("contains characters outside [A-Za-z0-9_@%+,./:-] "
          "(shell metacharacters are not allowed here)")


def test_issue_example_message_for_an_unsafe_container_id():
    text = """
        defaults:
          user: root
        hosts:
          bastion: {address: gw.example.org}
          pve1:
            address: 10.1.2.6
            containers:
              trainbox:
                id: '200; rm -rf /'
                runtime: pct
        """
    assert str(error_of(text)) == ("hosts.yaml:9: hosts.pve1.containers.trainbox.id: "
                                   "'200; rm -rf /' " + UNSAFE)


def _container_doc(field: str, value: str, runtime: str = "kubectl") -> str:
    return f"hosts:\n  h:\n    containers:\n      c:\n        runtime: {runtime}\n" \
           f"        id: c\n        {field}: {value}\n"


@pytest.mark.parametrize("text, prefix", [
    pytest.param(_container_doc("namespace", "'ml ns'"),
                 "hosts.yaml:7: hosts.h.containers.c.namespace: 'ml ns' " + UNSAFE, id="namespace"),
    pytest.param(_container_doc("container", "'$(id)'"),
                 "hosts.yaml:7: hosts.h.containers.c.container: '$(id)' " + UNSAFE, id="container"),
    pytest.param(_container_doc("exec_user", "'a`b`'", "docker"),
                 "hosts.yaml:7: hosts.h.containers.c.exec_user: 'a`b`' " + UNSAFE, id="exec-user"),
    pytest.param(_container_doc("python", "'/opt/my venv/bin/python'", "docker"),
                 "hosts.yaml:7: hosts.h.containers.c.python: '/opt/my venv/bin/python' " + UNSAFE,
                 id="python-space"),
    pytest.param(_container_doc("python", "\"/opt/it's/python\"", "docker"),
                 "hosts.yaml:7: hosts.h.containers.c.python: \"/opt/it's/python\" " + UNSAFE,
                 id="python-quote"),
    pytest.param(_container_doc("activate", "'conda activate train && x'", "docker"),
                 "hosts.yaml:7: hosts.h.containers.c.activate: word '&&' " + UNSAFE,
                 id="activate-word"),
    pytest.param(_container_doc("id", "'-it'", "docker").replace("        id: c\n", ""),
                 "hosts.yaml:6: hosts.h.containers.c.id: '-it' must not start with '-' "
                 "(it would be read as an option)", id="id-option"),
    pytest.param("hosts:\n  a: {user: 'al ice'}\n",
                 "hosts.yaml:2: hosts.a.user: 'al ice' " + UNSAFE, id="user"),
    pytest.param("defaults:\n  user: '~root'\n", "hosts.yaml:2: defaults.user: '~root' " + UNSAFE,
                 id="user-tilde"),
    pytest.param("hosts:\n  a: {address: 'h;reboot'}\n",
                 "hosts.yaml:2: hosts.a.address: 'h;reboot' " + UNSAFE, id="address"),
    pytest.param("hosts:\n  a: {address: -oProxyCommand}\n",
                 "hosts.yaml:2: hosts.a.address: '-oProxyCommand' must not start with '-'",
                 id="address-option"),
    pytest.param("hosts:\n  a: {address: root@h}\n",
                 "hosts.yaml:2: hosts.a.address: 'root@h': give the user as user:",
                 id="address-user"),
    pytest.param("hosts:\n  a: {python: '=python3'}\n",
                 "hosts.yaml:2: hosts.a.python: '=python3' " + UNSAFE, id="python-equals"),
    pytest.param("hosts:\n  'cluster-a:n3': {}\n",
                 "hosts.yaml:2: hosts.cluster-a:n3: 'cluster-a:n3' is not a valid name: use "
                 "only [A-Za-z0-9._-], not starting with '.' or '-' (':' is reserved for Slurm "
                 "node rows",
                 id="host-name-colon"),
    pytest.param("hosts:\n  ..: {}\n", "hosts.yaml:2: hosts...: '..' is not a valid name",
                 id="host-name-dots"),
    pytest.param("hosts:\n  h: {containers: {'a b': {runtime: docker, id: x}}}\n",
                 "hosts.yaml:2: hosts.h.containers.a b: 'a b' is not a valid name",
                 id="container-name"),
    pytest.param("hosts:\n  h: {models: {'a/b': /m}}\n",
                 "hosts.yaml:2: hosts.h.models.a/b: 'a/b' is not a valid name", id="model-name"),
    pytest.param("hosts:\n  h: {slurm: {partition: 'gpu;x'}}\n",
                 "hosts.yaml:2: hosts.h.slurm.partition: 'gpu;x' " + UNSAFE, id="partition"),
    pytest.param("hosts:\n  h: {slurm: {nodelist: 'n[1-2];x'}}\n",
                 "hosts.yaml:2: hosts.h.slurm.nodelist: node 'n1;x' " + UNSAFE, id="nodelist"),
])
def test_unsafe_tokens_are_refused(text, prefix):
    assert str(error_of(text)).startswith(prefix)


# ---------------------------------------------------------------------------- keys and types

@pytest.mark.parametrize("text, prefix", [
    pytest.param("hostz: {}\n", "hosts.yaml:1: hostz: unknown key (did you mean 'hosts'?)",
                 id="top"),
    pytest.param("defaults:\n  pyhton: python3\n",
                 "hosts.yaml:2: defaults.pyhton: unknown key (did you mean 'python'?)",
                 id="defaults"),
    pytest.param("defaults:\n  gpus: 8\n", "hosts.yaml:2: defaults.gpus: unknown key",
                 id="defaults-host-only-key"),
    pytest.param("hosts:\n  a:\n    adress: x\n",
                 "hosts.yaml:3: hosts.a.adress: unknown key (did you mean 'address'?)", id="host"),
    pytest.param("hosts:\n  a:\n    frobnicate: 1\n",
                 "hosts.yaml:3: hosts.a.frobnicate: unknown key (expected one of local, address, ",
                 id="host-no-suggestion"),
    pytest.param("hosts:\n  a: {containers: {c: {runtime: docker, id: c, become: sudo}}}\n",
                 "hosts.yaml:2: hosts.a.containers.c.become: unknown key", id="container"),
    pytest.param("hosts:\n  a: {slurm: {partiton: gpu}}\n",
                 "hosts.yaml:2: hosts.a.slurm.partiton: unknown key (did you mean 'partition'?)",
                 id="slurm"),
    pytest.param("hosts:\n  a: {1: x}\n", "hosts.yaml:2: hosts.a.1: unknown key", id="int-key"),
    pytest.param("hosts:\n  123: {}\n", "hosts.yaml:2: hosts.123: expected a host name, got 123",
                 id="int-host-name"),
    pytest.param("hosts: [a, b]\n", "hosts.yaml:1: hosts: expected a mapping, got a list",
                 id="hosts-list"),
    pytest.param("hosts:\n  a: 3\n", "hosts.yaml:2: hosts.a: expected a mapping, got 3",
                 id="host-scalar"),
    pytest.param("defaults: true\n",
                 "hosts.yaml:1: defaults: expected a mapping, got true (a boolean)",
                 id="defaults-scalar"),
])
def test_unknown_keys_and_wrong_shapes(text, prefix):
    assert str(error_of(text)).startswith(prefix)


@pytest.mark.parametrize("field, value, expected", [
    ("port", "abc", "expected an integer, got 'abc'"),
    ("port", "0", "expected an integer from 1 to 65535, got 0"),
    ("port", "65536", "expected an integer from 1 to 65535, got 65536"),
    ("port", "true", "expected an integer, got true (a boolean)"),
    ("port", "22.5", "expected an integer, got 22.5"),
    ("port", "'22'", "expected an integer, got '22'"),
    ("port", "", "expected an integer, got an empty value"),
    ("timeout", "-1", "expected a positive number of seconds, got -1"),
    ("timeout", "0", "expected a positive number of seconds, got 0"),
    ("timeout", "abc", "expected a positive number of seconds, got 'abc'"),
    ("timeout", "yes", "expected a positive number of seconds, got true (a boolean)"),
    ("timeout", ".inf", "expected a positive number of seconds, got inf"),
    ("timeout", ".nan", "expected a positive number of seconds, got nan"),
    ("timeout", "1" + "0" * 400, "expected a positive number of seconds, got 1000000..."),
    ("connect_timeout", "[1]", "expected a positive number of seconds, got a list"),
    ("gpus", "-1", "expected an integer of at least 0, got -1"),
    ("gpus", "1.5", "expected an integer, got 1.5"),
    ("local", "'yes'", "expected true or false, got 'yes'"),
    ("local", "1", "expected true or false, got 1"),
    ("become", "su", "'su' is not one of sudo"),
    ("become", "1", "expected one of sudo, got 1"),
    ("host_key_policy", "no", "expected one of strict, accept-new, got false (a boolean)"),
    ("host_key_policy", "ask", "'ask' is not one of strict, accept-new"),
    ("user", "7", "expected a string, got 7"),
    ("user", "''", "expected a string, got ''"),
    ("python", "{a: 1}", "expected a string, got a mapping"),
    ("identity_file", "[a]", "expected a file path, got a list"),
    ("activate", "[conda, activate]", "expected a string of words, got a list"),
    ("env", "[A]", "expected a mapping, got a list"),
    ("models", "/m/big", "expected a mapping, got '/m/big'"),
    ("slurm", "gpu", "expected a mapping, got 'gpu'"),
    ("jump", "3", "expected a name, got 3"),
    ("address", "8", "expected a string, got 8"),
    ("tmpdir", "scratch/tmp", "expected an absolute path, got 'scratch/tmp'"),
    ("tmpdir", "'/a b'", "'/a b' contains characters outside [A-Za-z0-9_@%+,./:-] "
                         "(shell metacharacters are not allowed here)"),
])
def test_wrong_types_name_the_line_and_key(field, value, expected):
    message = str(error_of(f"hosts:\n  a:\n    {field}: {value}\n"))
    assert message == f"hosts.yaml:3: hosts.a.{field}: {expected}" or (
        expected.endswith("...") and message.startswith(
            f"hosts.yaml:3: hosts.a.{field}: {expected[:-3]}") and message.endswith("..."))


@pytest.mark.parametrize("text, prefix", [
    pytest.param("hosts:\n  a: {env: {A: true}}\n",
                 "hosts.yaml:2: hosts.a.env.A: expected a string or a number, got true "
                 "(a boolean) (quote it to pass it as text)", id="env-bool"),
    pytest.param("hosts:\n  a:\n    env:\n      A: [1]\n",
                 "hosts.yaml:4: hosts.a.env.A: expected a string or a number, got a list",
                 id="env-list"),
    pytest.param("hosts:\n  a:\n    env:\n      A:\n",
                 "hosts.yaml:4: hosts.a.env.A: expected a string or a number, got an empty value",
                 id="env-null"),
    pytest.param("hosts:\n  a: {env: {1A: x}}\n",
                 "hosts.yaml:2: hosts.a.env.1A: '1A' is not an environment variable name",
                 id="env-name"),
    pytest.param("hosts:\n  a: {models: {big: 3}}\n",
                 "hosts.yaml:2: hosts.a.models.big: expected a model path, got 3", id="model-path"),
    pytest.param("hosts:\n  a: {slurm: {nodes: 0}}\n",
                 "hosts.yaml:2: hosts.a.slurm.nodes: expected an integer of at least 1, got 0",
                 id="slurm-nodes"),
    pytest.param("hosts:\n  a: {slurm: {gpus_per_node: x}}\n",
                 "hosts.yaml:2: hosts.a.slurm.gpus_per_node: expected an integer, got 'x'",
                 id="slurm-gpus"),
    pytest.param("hosts:\n  a: {slurm: {time: soon}}\n",
                 "hosts.yaml:2: hosts.a.slurm.time: 'soon' is not a Slurm time", id="slurm-time"),
    pytest.param("hosts:\n  a: {slurm: {nodelist: 'n[1-'}}\n",
                 "hosts.yaml:2: hosts.a.slurm.nodelist: invalid node set 'n[1-': missing bracket",
                 id="slurm-nodelist"),
    pytest.param("hosts:\n  a: {slurm: {account: -x}}\n",
                 "hosts.yaml:2: hosts.a.slurm.account: '-x' must not start with '-'",
                 id="slurm-account"),
    pytest.param("hosts:\n  a: {slurm: {reservation: 'maint; rm'}}\n",
                 "hosts.yaml:2: hosts.a.slurm.reservation: ",
                 id="slurm-reservation"),
])
def test_nested_value_errors(text, prefix):
    assert str(error_of(text)).startswith(prefix)


def test_a_slurm_reservation_is_kept_for_salloc():
    topo = loads("hosts:\n  c: {slurm: {nodes: 2, reservation: maint_0412}}\n")
    assert topo.targets["c"].slurm.reservation == "maint_0412"
    assert loads("hosts:\n  c: {slurm: {nodes: 2}}\n").targets["c"].slurm.reservation is None


def test_slurm_time_in_minutes_and_formats():
    for written, kept in [("10", "10"), ('"1-00:00:00"', "1-00:00:00"), ("UNLIMITED", "UNLIMITED"),
                          ('"30:00"', "30:00")]:
        topo = loads(f"hosts:\n  c: {{slurm: {{time: {written}}}}}\n")
        assert topo.targets["c"].slurm.time == kept


@pytest.mark.parametrize("field", topology.CONNECTION_KEYS)
def test_connection_keys_are_errors_on_a_local_host(field):
    value = {"port": "22", "connect_timeout": "5", "host_key_policy": "strict",
             "jump": "b", "persist": "60"}.get(field, "x")
    assert str(error_of(f"hosts:\n  b: {{}}\n  here:\n    local: true\n    {field}: {value}\n")) \
        == f"hosts.yaml:5: hosts.here.{field}: not allowed on a local host (local: true runs " \
           "without SSH)"


def test_metadata_keys_are_ignored_at_every_level():
    topo = loads(doc("""
        x-top: {anything: [1, 2]}
        defaults: {x-note: 1, python: /p}
        hosts:
          x-not-a-host: {bogus: 1}
          h:
            x-owner: infra
            env: {x-comment: 3, A: a}
            models: {x-hidden: 1, m: /m}
            slurm: {x-why: because, nodes: 2}
            containers:
              x-planned: {}
              c: {runtime: docker, id: c, x-ticket: 42}
        groups:
          x-later: [nope]
          g: [h]
        """))
    assert list(topo.targets) == ["local", "h", "c"]
    assert topo.targets["h"].env == (("A", "a"),) and topo.targets["h"].models == (("m", "/m"),)
    assert topo.groups == {"g": ("h",)}


# ---------------------------------------------------------------------------- YAML itself

def test_merge_keys_work_and_keep_lines():
    text = doc("""
        x-lab: &lab
          user: ops
          port: 2222
        x-bad: &bad
          port: abc
        hosts:
          a:
            <<: *lab
            address: a.lab
          b:
            <<: *lab
            port: 22
        """)
    topo = loads(text)
    assert topo.targets["a"].host == SshHost(name="a", address="a.lab", port=2222, user="ops")
    assert topo.targets["b"].host.port == 22 and topo.targets["b"].host.user == "ops"
    broken = text + "  c:\n    <<: *bad\n"
    assert str(error_of(broken)).startswith("hosts.yaml:5: hosts.c.port: expected an integer")


def test_merge_of_a_list_of_mappings():
    topo = loads("x-a: &a {user: u1, port: 1}\nx-b: &b {user: u2, gpus: 2}\n"
                 "hosts:\n  h: {<<: [*a, *b]}\n")
    assert topo.targets["h"].host.user == "u1" and topo.targets["h"].gpus == 2


@pytest.mark.parametrize("text, prefix", [
    pytest.param("hosts:\n  a: [1, 2\n  b: {}\n", "hosts.yaml:3: invalid YAML: ", id="syntax"),
    pytest.param("hosts:\n  a: {port: 22\n", "hosts.yaml:3: invalid YAML: ", id="unclosed"),
    pytest.param("hosts:\n  a: !!python/object:os.system {}\n",
                 "hosts.yaml:2: invalid YAML: tag 'tag:yaml.org,2002:python/object:os.system' "
                 "is not allowed (plain YAML only)", id="python-object"),
    pytest.param("hosts:\n  a: !!python/name:os.system\n",
                 "hosts.yaml:2: invalid YAML: tag 'tag:yaml.org,2002:python/name:os.system' "
                 "is not allowed", id="python-name"),
    pytest.param("hosts:\n  a: !custom x\n",
                 "hosts.yaml:2: invalid YAML: tag '!custom' is not allowed", id="local-tag"),
    pytest.param("hosts:\n  a: {port: !!int abc}\n",
                 "hosts.yaml:2: invalid YAML: 'abc' is not a valid tag:yaml.org,2002:int",
                 id="bad-int-tag"),
    pytest.param("hosts:\n  a: {port: !!timestamp x}\n",
                 "hosts.yaml:2: invalid YAML: 'x' is not a valid tag:yaml.org,2002:timestamp",
                 id="bad-timestamp-tag"),
    pytest.param("hosts:\n  a: {}\n  a: {}\n",
                 "hosts.yaml:3: hosts.a: duplicate key (first at line 2)", id="duplicate-host"),
    pytest.param("hosts:\n  a:\n    port: 22\n    port: 23\n",
                 "hosts.yaml:4: hosts.a.port: duplicate key (first at line 3)",
                 id="duplicate-nested"),
    pytest.param("hosts: {}\nhosts: {}\n", "hosts.yaml:2: hosts: duplicate key (first at line 1)",
                 id="duplicate-top"),
    pytest.param("groups:\n  g: [{a: 1, a: 2}]\n",
                 "hosts.yaml:2: groups.g[0].a: duplicate key (first at line 2)",
                 id="duplicate-in-list"),
    pytest.param("", "hosts.yaml:1: empty hosts file (expected a mapping with hosts:)", id="empty"),
    pytest.param("# only a comment\n\n", "hosts.yaml:1: empty hosts file", id="comments-only"),
    pytest.param("# a list\n\n- a\n- b\n",
                 "hosts.yaml:3: expected a mapping with hosts:, got a list",
                 id="top-list"),
    pytest.param("hello\n", "hosts.yaml:1: expected a mapping with hosts:, got 'hello'",
                 id="top-scalar"),
    pytest.param("hosts: {}\n---\nhosts: {}\n",
                 "hosts.yaml:2: invalid YAML: expected a single document in the stream",
                 id="two-documents"),
    pytest.param("hosts:\n  a: *nope\n", "hosts.yaml:2: invalid YAML: found undefined alias",
                 id="undefined-alias"),
    pytest.param("hosts:\n  a: {? [1, 2] : x}\n",
                 "hosts.yaml:2: invalid YAML: found unhashable key",
                 id="unhashable-key"),
    pytest.param("hosts:\n  a: {<<: 3}\n",
                 "hosts.yaml:2: invalid YAML: expected a mapping or list of mappings for merging",
                 id="bad-merge"),
    pytest.param("hosts:\n  a: b\x07\n", "hosts.yaml:2: invalid YAML: ", id="control-character"),
    pytest.param("hosts:\n  a: \ud800\n", "hosts.yaml:2: invalid YAML: ", id="lone-surrogate"),
    pytest.param("[" * 20000, "hosts.yaml:1: invalid YAML: ", id="deep-nesting"),
    pytest.param("a: &a [*a]\n", "hosts.yaml:1: a: unknown key", id="recursive-alias"),
])
def test_yaml_errors(text, prefix):
    assert str(error_of(text)).startswith(prefix)


def test_errors_carry_file_line_key_and_exit_code():
    error = error_of("hosts:\n  a: {port: abc}\n", path="conf/lab.yaml")
    assert (error.file, error.line, error.key) == ("conf/lab.yaml", 2, "hosts.a.port")
    assert error.reason == "expected an integer, got 'abc'"
    assert error.exit_code == EXIT_BAD_INPUT


def test_a_byte_order_mark_is_fine():
    assert "a" in loads("\ufeffhosts: {a: {}}\n").targets


# ---------------------------------------------------------------------------- load()

@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(topology.HOSTS_FILE_ENV, raising=False)
    return tmp_path


def test_no_file_anywhere_gives_the_embedded_local(in_tmp):
    topo = load()
    assert topo == Topology(path=None, targets={"local": LOCAL_TARGET})
    assert topo.select() == [LOCAL_TARGET]


def test_hosts_yaml_in_the_current_directory(in_tmp):
    (in_tmp / "hosts.yaml").write_text("hosts: {a: {}}\n")
    topo = load()
    assert topo.path == "hosts.yaml" and "a" in topo.targets


def test_environment_variable_names_the_file(in_tmp, monkeypatch):
    (in_tmp / "hosts.yaml").write_text("hosts: {wrong: {}}\n")
    (in_tmp / "lab.yaml").write_text("hosts: {right: {}}\n")
    monkeypatch.setenv(topology.HOSTS_FILE_ENV, "lab.yaml")
    assert "right" in load().targets
    monkeypatch.setenv(topology.HOSTS_FILE_ENV, "gone.yaml")
    with pytest.raises(InputError, match=r"^gone\.yaml: hosts file not found \(named by "
                                         r"\$MLDIAG_HOSTS_FILE\)$"):
        load()


def test_an_explicit_path_must_exist(in_tmp):
    with pytest.raises(InputError, match=r"^missing\.yaml: hosts file not found$"):
        load("missing.yaml")


def test_a_directory_is_refused(in_tmp):
    (in_tmp / "conf").mkdir()
    with pytest.raises(InputError, match=r"^conf: is a directory"):
        load("conf")
    (in_tmp / "hosts.yaml").mkdir()
    with pytest.raises(InputError, match=r"^hosts\.yaml: is a directory"):
        load()


def test_the_path_is_reported_as_given(in_tmp):
    (in_tmp / "sub").mkdir()
    (in_tmp / "sub" / "h.yaml").write_text("hosts:\n  a: {port: x}\n")
    with pytest.raises(InputError, match=r"^sub/h\.yaml:2: hosts\.a\.port: "):
        load("sub/h.yaml")
    with pytest.raises(InputError, match=r"^\./sub/\.\./sub/h\.yaml:2: "):
        load("./sub/../sub/h.yaml")


def test_non_utf8_bytes_are_refused_with_their_line(in_tmp):
    (in_tmp / "bad.yaml").write_bytes(b"hosts:\n  a: {user: \xff}\n")
    with pytest.raises(InputError, match=r"^bad\.yaml:2: not UTF-8 text \(byte 0xff\)$"):
        load("bad.yaml")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_refused(in_tmp):
    (in_tmp / "secret.yaml").write_text("hosts: {}\n")
    (in_tmp / "secret.yaml").chmod(0)
    with pytest.raises(InputError, match=r"^secret\.yaml: cannot read the hosts file"):
        load("secret.yaml")


def test_a_10_mb_file_is_refused_before_parsing(in_tmp):
    big = in_tmp / "big.yaml"
    big.write_text("hosts:\n" + "".join(f"  h{i}: {{address: 10.0.{i // 250 % 250}.{i % 250}}}\n"
                                         for i in range(330_000)))
    assert big.stat().st_size > 10 * 2**20
    with pytest.raises(InputError) as err:
        load(str(big))
    assert str(err.value) == (f"{big}: larger than 1 MiB, the most a hosts file may be (write node "
                              "ranges such as gpu[001-512] rather than one entry per node)")


def test_a_file_just_under_the_limit_loads():
    text = "hosts:\n" + "".join(f"  h{i}: {{address: 10.0.{i // 250}.{i % 250}, gpus: 8}}\n"
                                for i in range(2000))
    text += '  "n[1-5000]": {address: "10.9.[0-49].[1-100]"}\n'
    text += "# " + "x" * (topology.MAX_FILE_BYTES - len(text.encode()) - 3) + "\n"
    assert len(text.encode()) == topology.MAX_FILE_BYTES
    topo = loads(text)
    assert len(topo.targets) == 7001 and topo.targets["n5000"].host.address == "10.9.49.100"


# ---------------------------------------------------------------------------- select()

@pytest.fixture
def lab() -> Topology:
    return loads(doc("""
        defaults:
          targets: [b200]
        hosts:
          "gpu[01-08]": {}
          b200: {containers: {trainbox: {runtime: pct, id: 200}}}
        groups:
          h200: ["gpu[01-04]"]
          all: [h200, b200]
        """))


def names(targets):
    return [t.name for t in targets]


def test_select_without_hosts_or_groups_gives_the_default_targets(lab):
    assert names(lab.select()) == ["b200"]
    assert names(lab.select([], [])) == ["b200"]


def test_select_expands_comma_lists_and_node_sets_in_order(lab):
    assert names(lab.select(["gpu[03-04],b200", "trainbox", "gpu03"])) == [
        "gpu03", "gpu04", "b200", "trainbox"]
    assert names(lab.select([" gpu01 , gpu02 "])) == ["gpu01", "gpu02"]


def test_select_hosts_then_groups_without_duplicates(lab):
    assert names(lab.select(["gpu02"], ["all", "h200"])) == [
        "gpu02", "gpu01", "gpu03", "gpu04", "b200"]


def test_select_unknown_target_lists_the_known_ones(lab):
    with pytest.raises(InputError) as caught:
        lab.select(["trainbx"])
    assert str(caught.value) == ("unknown target 'trainbx' (did you mean 'trainbox'? known: "
                                 "b200,gpu[01-08],local,trainbox)")
    assert caught.value.exit_code == EXIT_BAD_INPUT


def test_select_node_set_member_must_exist(lab):
    with pytest.raises(InputError, match=r"^unknown target 'gpu09' \(did you mean"):
        lab.select(["gpu[08-09]"])


def test_select_slurm_node_rows_pass_through_unexpanded(lab):
    with pytest.raises(InputError, match=r"^unknown target 'cluster-a:n3' "):
        lab.select(["b200,cluster-a:n3"])


def test_select_invalid_node_set(lab):
    with pytest.raises(InputError, match=r"^--host: invalid node set 'gpu\[01-': missing bracket"):
        lab.select(["gpu[01-"])
    with pytest.raises(InputError, match=r"^--host: empty name in 'b200,'"):
        lab.select(["b200,"])


def test_select_unknown_group(lab):
    with pytest.raises(InputError, match=r"^unknown group 'h100' \(did you mean 'h200'\? known: "
                                         r"all,h200\)$"):
        lab.select([], ["h100"])
    with pytest.raises(InputError, match=r"^unknown group 'g' \(no groups are defined\)$"):
        Topology(path=None, targets={"local": LOCAL_TARGET}).select([], ["g"])


def test_select_truncates_a_long_known_list():
    topo = loads("hosts:\n" + "".join(f"  host-{word}-{i}: {{}}\n"
                                      for i, word in enumerate(["alpha", "beta", "gamma"] * 40)))
    with pytest.raises(InputError) as caught:
        topo.select(["zzz"])
    message = str(caught.value)
    assert message.startswith("unknown target 'zzz' (known: ") and message.endswith(",...)")
    assert len(message) < 260


# ---------------------------------------------------------------------------- random documents

SCHEMA_WORDS = sorted(set(topology.TOP_KEYS + topology.DEFAULTS_KEYS + topology.HOST_KEYS
                          + topology.CONTAINER_KEYS + topology.SLURM_KEYS
                          + ("x-meta", "<<", "local", "b200", "gpu[01-04]", "h200")))
LOOSE_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70000), st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["sudo", "pct", "docker", "kubectl", "strict", "accept-new", "local",
                     "b200", "gpu[01-04]", "10.0.0.[1-4]", "n[1-", "/opt/venv/bin/python",
                     "a;b", "-x", "00:10:00", "conda activate x", "h200", "[1-99999999]"]))
KEYS = st.one_of(st.sampled_from(SCHEMA_WORDS), st.text(max_size=8), st.integers(0, 3))
DOCUMENTS = st.recursive(
    LOOSE_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=25)
HOST_NAMES = ["local", "b200", "gpu[01-04]", "gpu02", "bastion"]
NAMES = st.sampled_from(["local", "local", "b200", "gpu02", "c1", "h200", "gpu[01-02],b200"])


def mostly(valid: st.SearchStrategy) -> st.SearchStrategy:
    """Valid values 19 times in 20, so that documents often get past every check."""
    # hypothesis favours small integers, so the rare branch sits at the top
    return st.integers(0, 19).flatmap(lambda n: LOOSE_SCALARS if n == 19 else valid)


FIELD_VALUES = {
    "user": st.sampled_from(["root", "ops"]), "port": st.integers(1, 65535),
    "python": st.sampled_from(["python3", "/opt/venv/bin/python"]),
    "timeout": st.integers(1, 900) | st.floats(0.5, 900), "connect_timeout": st.integers(1, 30),
    "targets": st.lists(NAMES, min_size=1, max_size=2), "identity_file": st.just("~/.ssh/id"),
    "host_key_policy": st.sampled_from(topology.HOST_KEY_POLICIES),
    "become": st.sampled_from(["sudo", True, False]),
    "env": st.dictionaries(st.sampled_from(["A", "B", "x-c"]), st.text(max_size=5) | st.integers()),
    "activate": st.sampled_from(["", "conda activate x", "/a/b.sh"]),
    "local": st.sampled_from([False, False, True]),
    "address": st.sampled_from(["10.0.0.1", "h.lab", "h2.lab", "10.0.0.[1-4]"]),
    "peer_address": st.sampled_from(["10.1.0.1", "c.lab", "10.1.0.[1-4]", "-x", "a b"]),
    "jump": st.sampled_from(["bastion", "b200", "gpu02"]), "gpus": st.integers(0, 8),
    "models": st.dictionaries(st.sampled_from(["m1", "m2"]), st.just("/m"), max_size=2),
    "runtime": st.sampled_from(topology.RUNTIMES), "id": st.sampled_from(["200", 201]),
    "namespace": st.just("ml"), "container": st.just("main"), "exec_user": st.just("ml"),
    "partition": st.just("gpu"), "nodes": st.integers(1, 4), "gpus_per_node": st.integers(0, 8),
    "time": st.sampled_from(["00:10:00", 10]), "account": st.just("ml"),
    "nodelist": st.just("n[1-4]"), "reservation": st.sampled_from(["maint", "a b"]), "tmpdir": st.sampled_from(["/scratch/tmp", "tmp", "/a b"]),
    "code_cache": st.sampled_from([True, False, "no"]),
    "persist": st.sampled_from([0, 60, 2.5, -1, 4000, "60"]),
    "expect": st.dictionaries(st.sampled_from(["gpus", "ib_ports", "ib_rate", "pcie_gen", "ib_rat"]),
                              st.integers(0, 9) | st.just(400) | st.just("8"), max_size=3),
    "baseline": st.sampled_from(["golden.yaml", "~/g.yaml", "/abs/g.yaml", 3, ""]),
    "paths": st.dictionaries(st.sampled_from(["ckpt", "data", "-x"]), st.sampled_from(
        ["/ckpt", "/my data", "rel", {"path": "/c", "min_free_gb": 5}, {"path": "/c", "min_free_gb": -1},
         {"min_free_gb": 1}, {"path": "/c", "min_gb": 1}]), max_size=2),
}


def fields(keys, required=()) -> st.SearchStrategy:
    return st.fixed_dictionaries({key: mostly(FIELD_VALUES[key]) for key in required},
                                 optional={key: mostly(FIELD_VALUES[key])
                                           for key in keys if key not in required})


CONTAINERS = st.dictionaries(st.sampled_from(["c1", "c2", "b200"]),
                             fields(topology.CONTAINER_KEYS, ("runtime", "id")), max_size=2)
HOSTS = st.dictionaries(st.sampled_from(HOST_NAMES), fields(
    [k for k in topology.HOST_KEYS if k not in ("containers", "slurm")]).flatmap(
        lambda host: st.fixed_dictionaries({}, optional={
            "containers": mostly(CONTAINERS), "slurm": mostly(fields(topology.SLURM_KEYS))}).map(
                lambda extra: {**host, **extra})), max_size=4)
SCHEMA_SHAPED = st.fixed_dictionaries({}, optional={
    "defaults": fields(topology.DEFAULTS_KEYS),
    "hosts": mostly(HOSTS),
    "groups": st.dictionaries(st.sampled_from(["h200", "all"]),
                              st.lists(mostly(NAMES), max_size=3), max_size=2),
})
YAMLISH_TEXT = st.text(alphabet=st.one_of(st.sampled_from(list("{}[]:,-?!&*|>'\"%@`#<=~ \n\t")),
                                          st.characters()), max_size=80)


def check_only_input_errors(text: str) -> None:
    try:
        topo = loads(text)
    except InputError as exc:
        assert str(exc).startswith("hosts.yaml"), str(exc)
        return
    check_invariants(topo)


def check_invariants(topo: Topology) -> None:
    """What every loaded topology guarantees to the hops."""
    assert "local" in topo.targets
    for name, target in topo.targets.items():
        assert name == target.name and NAME.fullmatch(name)
        assert is_safe_token(target.python) and not target.python.startswith("-")
        assert all(is_safe_token(word) for word in target.activate)
        assert target.local == (target.host is None)
        if target.container:
            assert is_safe_token(target.container.id)
        if target.baseline is not None:           # node-check's golden file, read locally
            assert os.path.isabs(target.baseline)
        if target.peer_address is not None:       # it becomes a rendezvous argument
            assert is_safe_token(target.peer_address) and not target.peer_address.startswith("-")
    for members in list(topo.groups.values()) + [topo.default_targets]:
        assert all(member in topo.targets for member in members)
    assert topo.default_targets


SETTINGS = settings(max_examples=75, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(DOCUMENTS)
def test_random_documents_raise_only_input_errors(document):
    check_only_input_errors(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))


@SETTINGS
@given(SCHEMA_SHAPED)
def test_schema_shaped_documents_raise_only_input_errors(document):
    check_only_input_errors(yaml.safe_dump(document, sort_keys=False))


@SETTINGS
@given(st.one_of(st.text(max_size=200), YAMLISH_TEXT))
def test_random_text_raises_only_input_errors(text):
    check_only_input_errors(text)


@SETTINGS
@given(st.text(max_size=40), st.lists(st.text(max_size=10), max_size=3))
def test_random_selections_raise_only_input_errors(host, groups):
    lab = loads('hosts:\n  "gpu[01-04]": {}\n  b200: {}\ngroups:\n  h200: ["gpu[01-02]"]\n')
    try:
        selected = lab.select([host], groups)
    except InputError:
        return
    assert all(target.name in lab.targets for target in selected)


# ---------------------------------------------------------------------------- found by mutation testing
# (setup.cfg, issue 10): edges the tests above left open.

SLURM_LAB = """
    hosts:
      login: {slurm: {partition: gpu, nodes: 4, nodelist: "n[1-4]"}}
      plain: {}
    """


def test_a_slurm_row_is_the_login_target_restricted_to_its_nodes():
    row, = loads(doc(SLURM_LAB)).select(["login:n[2-3]"])
    assert row.name == "login:n[2-3]"
    assert row.slurm == topology.Slurm(partition="gpu", nodes=2, nodelist="n2,n3")


@pytest.mark.parametrize("value,message", [
    ("login:", "unknown target 'login:' "),                 # no nodes: not a row
    ("plain:n1", "unknown target 'plain:n1' "),             # not a Slurm target
    ("login:n:3", "--host: login:n:3: node name 'n:3' is not a plain name"),
    ("login:n[1-", "--host: login:n[1-: invalid node set 'n[1-': missing bracket"),
    # the row counts as its nodes: the part after the first ':' is the node set
    ("login:n[1-100001]:x", "--host: 'login:n[1-100001]:x' names up to 100001 targets "
                            "(at most 100000)"),
])
def test_a_bad_slurm_row_is_an_input_error(value, message):
    with pytest.raises(InputError) as caught:
        loads(doc(SLURM_LAB)).select([value])
    assert str(caught.value).startswith(message)


def test_unknown_group_names_the_file_without_groups():
    with pytest.raises(InputError) as caught:
        loads("hosts:\n  a: {}\n", "my.yaml").select([], ["g"])
    assert str(caught.value) == "unknown group 'g' (no groups are defined in my.yaml)"


def test_expand_selector_splits_at_commas_only():
    assert topology.expand_selector("nX1,b") == ["nX1", "b"]


def test_expand_selector_counts_a_plain_name_once():
    budget = topology.nodeset.Budget(2, "this test")
    assert topology.expand_selector("a,b", budget) == ["a", "b"]
    assert budget.left == 0


def test_expand_selector_allows_exactly_max_nodes():
    names = topology.expand_selector(f"n[1-{topology.MAX_NODES - 1}],a")
    assert len(names) == topology.MAX_NODES


def test_a_long_selector_is_cut_to_80_characters_in_errors():
    exact, longer = "a" * 79 + ",", "a" * 80 + ","
    with pytest.raises(ValueError, match=r"^empty name in '" + "a" * 79 + ",'$"):
        topology.expand_selector(exact)
    with pytest.raises(ValueError, match=r"^empty name in '" + "a" * 80 + r"\.\.\.'$"):
        topology.expand_selector(longer)


WORDS = ["".join(p) for p in __import__("itertools").product("abcdefgh", repeat=4)]


def hint_for(known):
    with pytest.raises(InputError) as caught:
        Topology(path=None, targets=dict.fromkeys(known, LOCAL_TARGET)).select(["zzzz"])
    message = str(caught.value)
    assert message.startswith("unknown target 'zzzz' (known: ") and message.endswith(")")
    return message[len("unknown target 'zzzz' (known: "):-1]


def test_the_known_list_is_cut_past_200_characters_at_a_comma():
    exactly_200 = WORDS[:39] + ["abcde"]
    assert hint_for(exactly_200) == ",".join(exactly_200)
    just_over = WORDS[:39] + ["abcdef"]          # 201 characters: the last name goes
    assert hint_for(just_over) == ",".join(WORDS[:39]) + ",..."
    # the 201st character is a comma: the name ending at 200 is whole, but still cut
    comma_at_200 = ["aaaaa"] + WORDS[1:45]
    assert hint_for(comma_at_200) == ",".join(comma_at_200[:39]) + ",..."


def test_a_file_of_exactly_the_limit_loads(in_tmp):
    text = "hosts:\n  a: {}\n# "
    text += "x" * (topology.MAX_FILE_BYTES - len(text) - 1) + "\n"
    (in_tmp / "h.yaml").write_text(text)
    assert (in_tmp / "h.yaml").stat().st_size == topology.MAX_FILE_BYTES
    assert list(load("h.yaml").targets) == ["local", "a"]


def test_a_file_that_cannot_be_opened_is_refused_with_the_reason(in_tmp):
    name = "h" * 300                                   # ENAMETOOLONG, even for root
    with pytest.raises(InputError) as caught:
        load(name)
    assert str(caught.value) == f"{name}: cannot read the hosts file: File name too long"


@pytest.mark.parametrize("data,line", [
    (b"hosts:\n  a: {user: \xff}\n  b: {}\n  c: {}\n", 2),   # lines after it are not counted
    (b"\n\n\xff: 1\n", 3),                                     # nor a newline as byte 0 twice
])
def test_the_line_of_a_non_utf8_byte(in_tmp, data, line):
    (in_tmp / "bad.yaml").write_bytes(data)
    with pytest.raises(InputError) as caught:
        load("bad.yaml")
    assert caught.value.line == line


def test_become_false_turns_an_inherited_become_off():
    topo = loads(doc("""
        defaults: {become: true}
        hosts:
          a: {become: false}
          b: {}
        """))
    assert topo.targets["a"].become is None and topo.targets["b"].become == "sudo"


@pytest.mark.parametrize("written,shown", [(r'"a\nb"', r"'a\nb'"), (r'"a\0b"', r"'a\x00b'")])
def test_an_identity_file_with_a_newline_or_nul_is_refused(written, shown):
    error = error_of(f"hosts:\n  a: {{identity_file: {written}}}\n")
    assert str(error) == f"hosts.yaml:2: hosts.a.identity_file: {shown} is not a file path"


def test_a_bad_env_name_shows_the_allowed_form():
    error = error_of("hosts:\n  a: {env: {1A: x}}\n")
    assert str(error) == ("hosts.yaml:2: hosts.a.env.1A: '1A' is not an environment variable "
                          "name ([A-Za-z_][A-Za-z0-9_]*)")


def test_slurm_time_as_minutes_and_its_errors():
    assert loads("hosts:\n  l: {slurm: {time: 1}}\n").targets["l"].slurm.time == "1"
    error = error_of("hosts:\n  l: {slurm: {time: 0}}\n")
    assert str(error) == ('hosts.yaml:2: hosts.l.slurm.time: expected a Slurm time such as '
                          '"00:10:00", got 0')


def test_a_nodelist_that_is_not_a_string():
    error = error_of("hosts:\n  l: {slurm: {nodelist: 5}}\n")
    assert str(error) == "hosts.yaml:2: hosts.l.slurm.nodelist: expected a node set, got 5"


@pytest.mark.parametrize("spec,message", [
    ("{id: x}", "hosts.yaml:2: hosts.h.containers.c.runtime: required (one of "
                + ", ".join(topology.RUNTIMES) + ")"),
    ("{runtime: docker}", "hosts.yaml:2: hosts.h.containers.c.id: required"),
])
def test_a_missing_container_key(spec, message):
    assert str(error_of(f"hosts:\n  h: {{containers: {{c: {spec}}}}}\n")) == message


def test_expand_nodeset_counts_against_the_budget_given_or_none():
    budget = topology.nodeset.Budget(10, "this test")
    assert topology.expand_nodeset("n[1-4]", budget) == ["n1", "n2", "n3", "n4"]
    assert budget.left == 6
    assert topology.expand_nodeset("n[1-2]") == ["n1", "n2"]    # outside a file: no budget


def test_slurm_nodelists_count_against_the_file_budget():
    text = "hosts:\n" + "".join(f'  l{i}: {{slurm: {{nodelist: "n[1-99999]"}}}}\n' for i in range(6))
    with pytest.raises(InputError, match=r"^hosts\.yaml:7: hosts\.l5\.slurm\.nodelist: more than "
                                         r"500000 names in one hosts file"):
        loads(text)


def test_a_node_range_cannot_have_containers():
    error = error_of("hosts:\n  'n[1-2]': {containers: {c: {runtime: docker, id: x}}}\n")
    assert str(error) == ("hosts.yaml:2: hosts.n[1-2].containers: a node range (2 hosts) cannot "
                          "have containers: container names are target names and must be unique")


def test_exactly_max_nodes_hosts_load():
    topo = loads(f'hosts:\n  "n[1-{topology.MAX_NODES - 1}]": {{}}\n  a: {{}}\n')
    assert len(topo.targets) == topology.MAX_NODES + 1          # and the embedded local


def test_a_local_host_before_ssh_hosts_leaves_them_resolved():
    topo = loads("hosts:\n  me: {local: true}\n  a: {address: x}\n")
    assert topo.targets["me"].host is None and topo.targets["a"].host.address == "x"


def test_a_bad_runbooks_item_is_named_by_its_index():
    error = error_of("hosts: {}\nrunbooks:\n  - books\n  - 5\n")
    assert str(error) == "hosts.yaml:4: runbooks[1]: expected a directory, got 5"


@pytest.mark.parametrize("text,message", [
    ("hosts: {}\ndefaults: 5\n", "hosts.yaml:2: defaults: expected a mapping, got 5"),
    ("defaults: {}\nhosts: 5\n", "hosts.yaml:2: hosts: expected a mapping, got 5"),
    ("hosts: {}\ngroups: 5\n", "hosts.yaml:2: groups: expected a mapping, got 5"),
])
def test_a_top_level_section_that_is_not_a_mapping_is_named_at_its_line(text, message):
    assert str(error_of(text)) == message


def test_a_nodelist_node_starting_with_a_dash_is_refused():
    error = error_of('hosts:\n  l: {slurm: {nodelist: "-n[1-2]"}}\n')
    assert str(error).startswith("hosts.yaml:2: hosts.l.slurm.nodelist: node '-n1' ")


def test_a_group_keeps_its_names_before_a_group_reference():
    topo = loads("hosts:\n  a: {}\n  b: {}\ngroups:\n  g: [b]\n  h: 'a,g'\n")   # one member
    assert topo.groups["h"] == ("a", "b")


@pytest.mark.parametrize("member,message", [
    ("'n[1-2]'", "hosts.yaml:4: groups.g: unknown target or group 'n2' (from 'n[1-2]') "),
    ("zz", "hosts.yaml:4: groups.g: unknown target or group 'zz' ("),
])
def test_an_unknown_group_member_names_the_text_it_came_from(member, message):
    error = str(error_of(f"hosts:\n  n1: {{}}\ngroups:\n  g: {member}\n"))
    assert error.startswith(message) and error.count("(from") == message.count("(from")


def test_a_local_target_in_the_file_keeps_its_place():
    assert list(loads("hosts:\n  a: {}\n  local: {local: true}\n").targets) == ["a", "local"]

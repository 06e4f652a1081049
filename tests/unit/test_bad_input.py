"""The bad-input battery of issue 5 §4, through the real `mldiag` program: each case exits 4
with `file:line: key: what was expected` (or the flag named), prints nothing on stdout and no
traceback. (The loader's own tests, tests/unit/test_topology.py, cover each rule in depth,
with hypothesis feeding it random documents.)"""

import pytest

from tests.programs import mldiag

GOOD = 'hosts:\n  a: {address: 10.0.0.1}\n  gpu[01-02]: {address: "10.0.1.[1-2]"}\ngroups:\n  g: [a]\n'


def assert_bad_input(r, expected):
    assert r.returncode == 4, (r.returncode, r.stderr)
    assert r.stderr == f"mldiag: {expected}\n"
    assert r.stdout == "" and "Traceback" not in r.stderr


HOSTS_FILES = {
    "malformed-yaml": ("hosts:\n  a: {address: x\n  b: {}\n",
                       "hosts.yaml:3: invalid YAML: did not find expected ',' or '}' "
                       "(while parsing a flow mapping at line 2)"),
    "wrong-type": ("hosts:\n  a:\n    port: twenty-two\n",
                   "hosts.yaml:3: hosts.a.port: expected an integer, got 'twenty-two'"),
    "unknown-key": ("hosts:\n  a: {adress: 10.0.0.1}\n",
                    "hosts.yaml:2: hosts.a.adress: unknown key (did you mean 'address'?)"),
    "duplicate-target": ("hosts:\n  a: {}\n  b:\n    address: h\n    containers:\n"
                         "      a: {runtime: docker, id: c}\n",
                         "hosts.yaml:6: hosts.b.containers.a: duplicate target name 'a' "
                         "(first defined at line 2)"),
    "duplicate-key": ("hosts:\n  a: {}\n  a: {port: 2}\n",
                      "hosts.yaml:3: hosts.a: duplicate key (first at line 2)"),
    "unknown-jump": ("hosts:\n  a: {address: h, jump: bastoin}\n  bastion: {}\n",
                     "hosts.yaml:2: hosts.a.jump: unknown host 'bastoin': a jump names an entry "
                     "of hosts: (an empty entry such as `bastoin: {}` is an ssh_config alias) "
                     "(did you mean 'bastion'? known: a,bastion)"),
    "unknown-group-member": ("hosts:\n  a: {}\ngroups:\n  g: [a, b]\n",
                             "hosts.yaml:4: groups.g[1]: unknown target or group 'b' (known: a,g,local)"),
    # issue 11 item 15: the way out, not only what is wrong
    "interpreter-under-home": ("hosts:\n  a: {address: h, python: ~/venv/bin/python}\n",
                               "hosts.yaml:2: hosts.a.python: '~/venv/bin/python': '~' is not "
                               "expanded on the target (no shell runs the interpreter); use an "
                               "absolute path such as /root/venv/bin/python"),
    "jump-cycle": ("hosts:\n  a: {jump: b}\n  b: {jump: c}\n  c: {jump: a}\n",
                   "hosts.yaml:2: hosts.a.jump: jump cycle: a → b → c → a"),
    "reversed-range": ('hosts:\n  gpu[08-01]: {address: "10.0.0.[1-8]"}\n',
                       "hosts.yaml:2: hosts.gpu[08-01]: invalid node set 'gpu[08-01]': bad range: "
                       '"invalid values in range : "08-01""'),
    "ranges-of-different-sizes": ('hosts:\n  gpu[01-04]: {address: "10.0.0.[1-3]"}\n',
                                  "hosts.yaml:2: hosts.gpu[01-04].address: '10.0.0.[1-3]' expands "
                                  "to 3 addresses but 'gpu[01-04]' to 4 hosts"),
    "container-id-metacharacters": ('hosts:\n  h:\n    containers:\n      c: {runtime: pct, id: "200; rm -rf /"}\n',
                                    "hosts.yaml:4: hosts.h.containers.c.id: '200; rm -rf /' contains "
                                    "characters outside [A-Za-z0-9_@%+,./:-] (shell metacharacters "
                                    "are not allowed here)"),
    "interpreter-with-space": ("hosts:\n  a: {python: /opt/my venv/bin/python}\n",
                               "hosts.yaml:2: hosts.a.python: '/opt/my venv/bin/python' contains "
                               "characters outside [A-Za-z0-9_@%+,./:-] (shell metacharacters are "
                               "not allowed here)"),
    "interpreter-with-quote": ('hosts:\n  a: {python: "/opt/venv\'/bin/python"}\n',
                               "hosts.yaml:2: hosts.a.python: \"/opt/venv'/bin/python\" contains "
                               "characters outside [A-Za-z0-9_@%+,./:-] (shell metacharacters are "
                               "not allowed here)"),
    "python-object-tag": ("hosts:\n  a: !!python/object/apply:os.system [id]\n",
                          "hosts.yaml:2: invalid YAML: tag "
                          "'tag:yaml.org,2002:python/object/apply:os.system' is not allowed (plain YAML only)"),
    "empty-file": ("", "hosts.yaml:1: empty hosts file (expected a mapping with hosts:)"),
    "only-a-comment": ("# nothing yet\n", "hosts.yaml:1: empty hosts file (expected a mapping with hosts:)"),
    "ten-megabytes": ("hosts:\n" + "".join(f"  h{i}: {{address: 10.0.{i // 250 % 250}.{i % 250}}}\n"
                                           for i in range(330_000)),
                      "hosts.yaml: larger than 1 MiB, the most a hosts file may be (write node "
                      "ranges such as gpu[001-512] rather than one entry per node)"),
}


@pytest.mark.parametrize("text, expected", HOSTS_FILES.values(), ids=HOSTS_FILES.keys())
def test_bad_hosts_file(tmp_path, text, expected):
    (tmp_path / "hosts.yaml").write_text(text)
    assert_bad_input(mldiag("ping", cwd=tmp_path, timeout=60), expected)


FLAGS = {
    "unknown-host": (["ping", "-H", "nope"], "unknown target 'nope' (known: a,gpu[01-02],local)\n"
                     "mldiag: hosts file: {hosts_file} (from ./hosts.yaml)"),
    "broken-node-set": (["ping", "-H", "gpu[01-"],
                        "--host: invalid node set 'gpu[01-': missing bracket: \"gpu[01-\""),
    "unknown-group": (["ping", "-g", "nope"], "unknown group 'nope' (known: g)\n"
                      "mldiag: hosts file: {hosts_file} (from ./hosts.yaml)"),
    # issue 11 item 8: each of these used to run on the default target `local` and exit 0
    "host-without-value": (["ping", "-H"], "--host (-H) needs a value"),
    "group-without-value": (["ping", "-g"], "--group (-g) needs a value"),
    "arg-without-value": (["run-script", "x.py", "--arg"],
                          "--arg needs a value (the script's arguments can also follow `--`: "
                          "run-script SCRIPT -- ARG...)"),
    "host-empty": (["ping", "-H", ""],
                   "--host: expected a target name, a comma list or a node set, got ''"),
    "host-only-commas": (["ping", "-H", "a", "-H", " , "],
                         "--host: expected a target name, a comma list or a node set, got ' , '"),
    "group-empty": (["ping", "-g", ""],
                    "--group: expected a target name, a comma list or a node set, got ''"),
    "hosts-task-host-empty": (["hosts", "-H", ""],
                              "--host: expected a target name, a comma list or a node set, got ''"),
    "timeout-text": (["ping", "--timeout", "abc"],
                     "--timeout: expected a positive number of seconds, got 'abc'"),
    "timeout-negative": (["ping", "--timeout", "-5"],
                         "--timeout: expected a positive number of seconds, got '-5'"),
    "parallel-zero": (["ping", "--parallel", "0"], "--parallel: expected a positive integer, got '0'"),
    "parallel-text": (["ping", "--parallel", "many"],
                      "--parallel: expected a positive integer, got 'many'"),
    "parallel-fraction": (["ping", "--parallel", "2.5"],
                          "--parallel: expected a positive integer, got '2.5'"),
    "hosts-file-is-a-directory": (["ping", "--hosts-file", "."],
                                  ".: is a directory, expected a hosts.yaml file"),
    "hosts-file-missing": (["ping", "--hosts-file", "missing.yaml"], "missing.yaml: hosts file not found"),
    "unknown-flag": (["ping", "--bogus"], "No idea what '--bogus' is!"),
    "script-missing": (["run-script", "nothere.py"], "run-script nothere.py: No such file or directory"),
    "args-json-broken": (["run-script", "x.py", "--args-json", "{"],
                         "--args-json: not JSON (Expecting property name enclosed in double quotes: "
                         "line 1 column 2 (char 1))"),
}


@pytest.mark.parametrize("argv, expected", FLAGS.values(), ids=FLAGS.keys())
def test_bad_flag(tmp_path, argv, expected):
    (tmp_path / "hosts.yaml").write_text(GOOD)
    expected = expected.replace("{hosts_file}", str(tmp_path / "hosts.yaml"))
    assert_bad_input(mldiag(*argv, cwd=tmp_path, timeout=60), expected)

"""The command line: flags, exit codes, JSON-only stdout — through the real entry points."""

import json
import os

import pytest

from diagnostics.engine import execute
from diagnostics.core.errors import InputError
from tests.programs import MLDIAG, inv, run_program

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(argv, cwd=REPO, env=None, timeout=60):
    return run_program(argv, cwd=cwd, env=env, timeout=timeout)


@pytest.mark.parametrize("flag, value, integer", [
    ("--timeout", "abc", False), ("--timeout", "-1", False), ("--timeout", "0", False),
    ("--timeout", "1e3", False), ("--parallel", "2.5", True), ("--parallel", "0", True),
    ("--parallel", "x", True),
])
def test_bad_numbers_are_input_errors_naming_the_flag(flag, value, integer):
    with pytest.raises(InputError) as exc:
        execute.parse_positive_number(flag, value, integer=integer)
    assert str(exc.value).startswith(f"{flag}: expected a positive")
    assert repr(value) in str(exc.value)


def test_good_numbers():
    assert execute.parse_positive_number("--timeout", "2.5") == 2.5
    assert execute.parse_positive_number("--timeout", ".5") == 0.5
    assert execute.parse_positive_number("--parallel", "16", integer=True) == 16
    assert execute.parse_positive_number("--timeout", None) is None


def test_host_values_split_on_top_level_commas_only():
    assert execute._split(["a,b", "gpu[01-03,07],c", "d"]) == ["a", "b", "gpu[01-03,07]", "c", "d"]


def test_mldiag_maps_parse_errors_to_4_and_inv_keeps_1():
    r = run(MLDIAG + ["ping", "--no-such-flag"])
    assert r.returncode == 4, r.stderr
    assert "no-such-flag" in r.stderr and "Traceback" not in r.stderr
    r = run(MLDIAG + ["no-such-task"])
    assert r.returncode == 4 and "no-such-task" in r.stderr
    r = inv("ping", "--no-such-flag", timeout=60)
    assert r.returncode == 1


def test_bad_timeout_exits_4_without_traceback():
    r = run(MLDIAG + ["ping", "--timeout", "abc"])
    assert r.returncode == 4
    assert "--timeout: expected a positive number of seconds, got 'abc'" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_ping_on_the_embedded_local_target_json_only_on_stdout(tmp_path):
    r = run(MLDIAG + ["ping", "--json"], cwd=tmp_path)   # no hosts.yaml there: embedded local
    assert r.returncode == 0, r.stderr
    docs = json.loads(r.stdout)
    assert [d["target"] for d in docs] == ["local"]
    assert docs[0]["status"] == "ok" and docs[0]["data"]["tmpdir_mode"] == "0o700"


def test_inv_from_the_repository_uses_its_tasks(tmp_path):
    r = inv("--list", timeout=60)
    assert r.returncode == 0
    for name in ("hosts", "ping", "gpu-status", "run-script"):
        assert name in r.stdout


def test_run_script_exit_code_and_exact_args(tmp_path):
    script = tmp_path / "show.py"
    script.write_text("import json, sys\nprint(json.dumps(sys.argv[1:]))\nsys.exit(len(sys.argv) - 1)\n")
    r = run(MLDIAG + ["run-script", str(script), "--arg", "a b", "--arg=-x", "--args-json",
                      json.dumps(["--json", "-H", "$(id)"]), "--json"], cwd=tmp_path)
    doc = json.loads(r.stdout)[0]
    assert json.loads(doc["data"]["stdout"]) == ["a b", "-x", "--json", "-H", "$(id)"]
    assert doc["status"] == "fail" and doc["data"]["exit_code"] == 5
    assert r.returncode == 2


def test_run_script_missing_file_is_bad_input(tmp_path):
    r = run(MLDIAG + ["run-script", str(tmp_path / "nope.py")], cwd=tmp_path)
    assert r.returncode == 4 and "No such file" in r.stderr and "Traceback" not in r.stderr


def test_save_writes_one_file_per_target_and_a_summary(tmp_path):
    r = run(MLDIAG + ["ping", "--save", str(tmp_path / "out")], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "out")) == ["local.json", "summary.json"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["targets"] == {"local": "ok"} and summary["exit_code"] == 0


@pytest.mark.parametrize("text, expected", [
    ("hosts:\n  pve1:\n    address: 10.1.2.6\n    containers:\n      trainbox: {runtime: ptc, id: 200}\n",
     "hosts.yaml:5: hosts.pve1.containers.trainbox.runtime: 'ptc' is not one of pct, docker, podman, lxc, kubectl"),
    ("hosts:\n  a: {adress: x}\n", "hosts.yaml:2: hosts.a.adress:"),
    ("hosts:\n  a: [unclosed\n", "hosts.yaml:"),
    ("hosts:\n  a: !!python/object:os.system {}\n", "hosts.yaml:2:"),
    ("hosts:\n  a: {jump: b}\n  b: {jump: a}\n", "hosts.yaml:"),
    ("", "hosts.yaml:"),
])
def test_bad_hosts_file_exits_4_with_file_and_line(tmp_path, text, expected):
    (tmp_path / "hosts.yaml").write_text(text)
    r = run(MLDIAG + ["ping"], cwd=tmp_path)
    assert r.returncode == 4, r.stderr
    assert expected in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_hosts_file_that_is_a_directory_or_missing(tmp_path):
    r = run(MLDIAG + ["ping", "--hosts-file", str(tmp_path)], cwd=tmp_path)
    assert r.returncode == 4 and str(tmp_path) in r.stderr and "Traceback" not in r.stderr
    r = run(MLDIAG + ["ping", "--hosts-file", str(tmp_path / "nope.yaml")], cwd=tmp_path)
    assert r.returncode == 4 and "nope.yaml" in r.stderr and "Traceback" not in r.stderr

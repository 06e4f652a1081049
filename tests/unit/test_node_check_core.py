"""node-check's frame (issue 12): the tool runner every check calls (timeouts, a hung binary
not called twice), the GPU inventory from the fake nvidia-smi answering a real capture, the
checks run side by side (a crashed or hung check is its own finding, the others still
report), the hosts.yaml ``expect:`` block, the job's argv and timeout, schema 2's finding
keys, and the fleet view grouped by action. The per-check modules have their own tests."""

import os
import shutil
import sys
import textwrap
import time
from io import StringIO
from pathlib import Path

import pytest

from diagnostics import builtin
from diagnostics.engine import bundle, jobs, registry
from diagnostics.builtin.node_check import view as node_view
from diagnostics.inventory import topology
from diagnostics.core import wire
from diagnostics.core.errors import InputError
from diagnostics.core.results import ACTIONS, Finding, Result, action_rank, worst_action
from tests.programs import load_script, result_of

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "diagnostics" / "scripts"

nc = load_script("node_check.py", "mldiag_test_node_check")


def runner(bindir):
    r = nc.ToolRunner(path=str(bindir))
    r.find = lambda name, _w=shutil.which, _p=str(bindir): _w(name, path=_p)   # no system dirs
    return r


# --------------------------------------------------------------------------- the tool runner


def test_a_missing_tool_is_missing_not_an_exception(tool_dir):
    tool = runner(tool_dir)(["dcgmi", "diag", "-r", "1", "-j"], 5)
    assert (tool.status, tool.rc) == ("missing", None)


def test_a_hung_tool_is_killed_at_its_timeout_and_not_called_again(tool_dir, monkeypatch):
    monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI_HANG", "30")
    run = runner(tool_dir)
    t0 = time.monotonic()
    first = run(["nvidia-smi", "-q"], 1.0)
    took = time.monotonic() - t0
    assert first.status == "timeout" and took < 5
    t0 = time.monotonic()
    second = run(["nvidia-smi", "nvlink", "-s"], 1.0)
    assert second.status == "skipped" and time.monotonic() - t0 < 0.5
    assert [c["status"] for c in run.calls] == ["timeout", "skipped"]


def test_inventory_of_eight_h200_from_the_fake(tool_dir):
    gpus, findings, note = nc.inventory(runner(tool_dir), 10)
    assert findings == [] and note is None
    assert [g["index"] for g in gpus] == list(range(8))
    assert {g["name"] for g in gpus} == {"NVIDIA H200"}
    assert gpus[0]["pci"].startswith("00000000:") and len({g["pci"] for g in gpus}) == 8
    facts = nc.inventory_facts(gpus)
    assert facts["gpu.count"] == 8 and facts["gpu.model"] == "NVIDIA H200"
    assert facts["driver"] == gpus[0]["driver"]


def test_inventory_of_a_hung_nvidia_smi_is_one_tool_hung_finding(tool_dir, monkeypatch):
    monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI_HANG", "30")
    gpus, findings, note = nc.inventory(runner(tool_dir), 0.5)
    assert gpus == [] and note == "nvidia-smi hung"
    assert [(f["level"], f["code"], f["action"]) for f in findings] == [("fail", "tool-hung", "reboot")]
    assert "did not answer within 0.5 s" in findings[0]["message"]


def test_inventory_without_nvidia_smi_is_an_info(tool_dir):
    os.unlink(tool_dir / "nvidia-smi")
    gpus, findings, _ = nc.inventory(runner(tool_dir), 5)
    assert gpus == [] and [(f["level"], f["code"]) for f in findings] == [("info", "no-nvidia-smi")]


def test_fewer_gpus_than_expected_is_a_fail_with_reboot():
    gpus = [{"index": i, "name": "NVIDIA H200"} for i in range(7)]
    f = nc.gpu_count_finding(gpus, {"gpus": 8})
    assert (f["level"], f["code"], f["action"], f["message"]) == (
        "fail", "gpu-count", "reboot", "7 GPUs answer, expected 8")
    assert nc.gpu_count_finding(gpus, {"gpus": 7}) is None and nc.gpu_count_finding(gpus, {}) is None


# --------------------------------------------------------------------------- checks side by side


def checks_dir(tmp_path, modules):
    """node_check.py beside the given check modules (NAME -> source), as in the run's temp dir."""
    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(SCRIPTS / "node_check.py", d / "node_check.py")
    for name, source in modules.items():
        (d / (name + ".py")).write_text(textwrap.dedent(source))
    return load_script_at(d / "node_check.py")


def load_script_at(path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("nc_copy_%d" % id(path), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in list(sys.modules):   # each copy loads its own checks
        if name.startswith("_mldiag_check_"):
            del sys.modules[name]
    return module


def test_one_crashed_and_one_hung_check_never_cost_the_others(tmp_path):
    mod = checks_dir(tmp_path, {
        "xid": """
            def check(expect, run_tool, **options):
                return {"findings": [{"level": "fail", "code": "xid-79", "message": "Xid 79 on GPU 2",
                                      "action": "reboot", "gpus": [2]}],
                        "facts": {"xid.catalog": "test"}}
        """,
        "nvlink": """
            def check(expect, run_tool, **options):
                raise KeyError("links")
        """,
        "pcie": """
            import time
            def check(expect, run_tool, **options):
                time.sleep(30)
        """,
        "ib": """
            def check(expect, run_tool, **options):
                assert options["sys_root"] == "/sys" and options["gpus"] == []
                return {"findings": [{"level": "warn", "code": "ib-counter", "message": "m",
                                      "action": "not-an-action", "ports": ["mlx5_1/1"]}],
                        "facts": {"ib.mlx5_0/1.rate": 400, "ib.bad": [1, 2]}}
        """,
    })
    t0 = time.monotonic()
    findings, facts, checks, _ = mod.run_checks(["xid", "nvlink", "fabric", "pcie", "ib"], {},
                                                nc.ToolRunner(), {"gpus": [], "sys_root": "/sys"}, 1.0)
    assert time.monotonic() - t0 < 3
    by_code = {f["code"]: f for f in findings}
    assert by_code["xid-79"]["check"] == "xid" and by_code["xid-79"]["gpus"] == [2]
    assert by_code["check-crashed"]["check"] == "nvlink"
    assert "KeyError: 'links'" in by_code["check-crashed"]["message"]
    assert "Traceback" in checks["nvlink"]["error"]
    assert (by_code["check-hung"]["check"], by_code["check-hung"]["level"]) == ("pcie", "fail")
    assert by_code["check-not-shipped"]["check"] == "fabric"
    assert by_code["ib-counter"]["action"] == "monitor"     # an unknown action never passes
    assert facts == {"xid.catalog": "test", "ib.mlx5_0/1.rate": 400}   # only scalars
    assert {k: v["status"] for k, v in checks.items()} == {
        "xid": "fail", "nvlink": "crashed", "fabric": "skipped", "pcie": "hung", "ib": "warn"}


def test_a_check_named_like_an_installed_package_is_ours(tmp_path):
    """Invoke is installed here as ``invoke``: a check module of that name beside node_check.py
    must be the one loaded, and the library must stay importable under its own name. The fabric
    check's file is nvfabric.py: a fabric.py would shadow Fabric wherever its dir is on sys.path."""
    mod = checks_dir(tmp_path, {"invoke": """
        def check(expect, run_tool, **options):
            return {"findings": [], "facts": {"invoke.ours": True}}
    """, "nvfabric": """
        def check(expect, run_tool, **options):
            return {"findings": [], "facts": {"fabric.ours": True}}
    """})
    _, facts, checks, _ = mod.run_checks(["invoke", "fabric"], {}, nc.ToolRunner(), {}, 5)
    assert facts == {"invoke.ours": True, "fabric.ours": True}
    assert checks["invoke"]["status"] == checks["fabric"]["status"] == "ok"
    import invoke
    import fabric
    assert hasattr(invoke, "task") and hasattr(fabric, "Connection")
    assert not (SCRIPTS / "fabric.py").exists()


def test_summary_names_the_worst_action_and_the_top_finding():
    gpus = [{"name": "NVIDIA H200"}] * 8
    findings = [nc.finding("warn", "ib-counter", "mlx5_1/1: link_downed 255", "monitor", "ib"),
                nc.finding("fail", "xid-79", "GPU 2 fell off the bus (Xid 79)", "reboot", "xid")]
    assert nc.summarise(gpus, findings, {}) == "reboot: GPU 2 fell off the bus (Xid 79) (+1 more)"
    assert nc.summarise(gpus, [], {"xid": {"status": "ok"}, "dcgm": {"status": "skipped"}}) == \
        "healthy: 8× NVIDIA H200, 1 checks passed (xid)"
    # a machine without nvidia-smi or dcgmi: those checks read nothing, so they passed nothing
    idle = [nc.finding("info", "no-nvidia-smi", "nvidia-smi not found", "none", "gpu"),
            nc.finding("info", "not-checked", "not checked: nvidia-smi not found", "none", "nvlink"),
            nc.finding("info", "dcgm-absent", "dcgmi not found", "none", "dcgm")]
    checks = {name: {"status": "ok"} for name in ("xid", "nvlink", "pcie", "dcgm")}
    assert nc.summarise([], idle, checks) == \
        "healthy: no GPU listed, 2 checks passed (xid, pcie); nothing to read for nvlink, dcgm"


def test_expect_json_keeps_known_integer_keys_only():
    assert nc.parse_expect('{"gpus": 8, "ib_rate": 400, "x": 1, "pcie_gen": true}') == \
        {"gpus": 8, "ib_rate": 400}
    with pytest.raises(SystemExit):
        nc.parse_expect("[8]")


# --------------------------------------------------------------------------- hosts.yaml expect:


def test_expect_block_is_inherited_and_merged_and_gpus_is_its_shorthand():
    topo = topology.loads(textwrap.dedent("""\
        defaults:
          expect: {ib_rate: 400, nvlinks_per_gpu: 18}
        hosts:
          h200:
            address: 10.0.0.1
            expect: {gpus: 8, ib_ports: 8}
            containers:
              ct: {runtime: pct, id: 200, expect: {ib_rate: 200}}
          old:
            address: 10.0.0.2
            gpus: 4
        """), "hosts.yaml")
    assert topo.targets["h200"].expect_dict == {"gpus": 8, "ib_ports": 8, "ib_rate": 400,
                                                "nvlinks_per_gpu": 18}
    assert topo.targets["ct"].expect_dict["ib_rate"] == 200
    assert topo.targets["old"].expect_dict == {"gpus": 4, "ib_rate": 400, "nvlinks_per_gpu": 18}


@pytest.mark.parametrize("block, message", [
    ("{ib_rat: 400}", "hosts.yaml:4: hosts.h.expect.ib_rat: unknown key (did you mean 'ib_rate'?)"),
    ("{pcie_gen: 7}", "hosts.yaml:4: hosts.h.expect.pcie_gen: expected an integer from 1 to 6, got 7"),
    ("{gpus: eight}", "hosts.yaml:4: hosts.h.expect.gpus: expected an integer, got 'eight'"),
    ("8", "hosts.yaml:4: hosts.h.expect: expected a mapping, got 8"),
])
def test_a_bad_expect_block_names_file_line_and_key(block, message):
    with pytest.raises(InputError) as caught:
        topology.loads(f"hosts:\n  h:\n    address: 10.0.0.1\n    expect: {block}\n", "hosts.yaml")
    assert str(caught.value).startswith(message)


def test_the_job_sends_the_expect_block_and_raises_the_timeout_for_dcgm_levels():
    topo = topology.loads("hosts:\n  h:\n    address: 10.0.0.1\n    timeout: 100\n"
                          "    expect: {gpus: 8, ib_rate: 400}\n", "hosts.yaml")
    target = topo.targets["h"]
    job = jobs.job_source("node-check", {"since": "2h"})(target)
    assert list(job.argv) == ["--since=2h", '--expect={"gpus": 8, "ib_rate": 400}']
    assert job.timeout is None            # the target's own 100 s
    deep = jobs.job_source("node-check", {"dcgm_level": "3"})(target)
    assert deep.timeout == builtin.dcgm_level_timeouts()[3] + 60
    assert "--dcgm-level=3" in deep.argv
    off = jobs.job_source("node-check", {"dcgm_level": "3", "no_dcgm": True})(target)
    assert off.timeout is None


def test_the_job_timeout_and_the_script_budget_follow_dcgm_py():
    dcgm = load_script("dcgm.py", "mldiag_test_dcgm_levels")
    for level in (1, 2, 3):
        assert builtin.dcgm_level_timeouts()[level] == dcgm.timeout_for(level), level
        # the script's budget covers dcgmi's own timeout: a slow level-3 run ends as dcgm.py's
        # verdict, never as "hung" at the node-check budget
        assert nc.dcgm_budget(level) >= dcgm.timeout_for(level) + 60, level
    assert builtin.dcgm_level_timeouts()[3] == 3600.0
    assert nc.dcgm_budget(None) == nc.DEFAULT_BUDGET


def test_the_bundle_carries_every_companion_that_exists():
    job = bundle.script_job("node-check")
    # its companions, and the scripts' shared helpers every diagnostic gets
    assert set(job.extra_files) == set(registry.get("node-check").companions) | {"_remote.py"}
    for name in job.extra_files:
        assert job.extra_files[name] == (SCRIPTS / name).read_bytes()


# --------------------------------------------------------------------------- schema 2


def test_actions_are_ordered_and_worst_action_picks_the_most_severe():
    assert ACTIONS == ("none", "monitor", "app", "reset-gpu", "reboot", "drain", "rma")
    fs = [Finding("warn", "a", "m", action="monitor"), Finding("fail", "b", "m", action="drain"),
          Finding("fail", "c", "m", action="reboot"), Finding("info", "d", "m")]
    assert worst_action(fs) == "drain" and worst_action([]) is None
    assert action_rank(None) == -1 and action_rank("rma") == 6


def test_a_schema_2_finding_round_trips_with_its_new_keys():
    doc = {"schema": 2, "diagnostic": "node-check", "target": "n1", "status": "fail",
           "summary": "s", "data": {}, "log": [], "error": None,
           "findings": [{"level": "fail", "code": "ib-port-down", "message": "m", "action": "drain",
                         "check": "ib", "ports": ["mlx5_4/1"], "gpus": [0, "0000:91:00.0"]}]}
    assert wire.schema_problem(doc) is None
    result = Result.from_dict(doc)
    assert result.to_dict()["findings"] == doc["findings"]


# --------------------------------------------------------------------------- the action view


def result(target, *findings, status=None):
    """A node-check result of ``target``: ``findings`` as (level, code, action, gpus, ports)."""
    return result_of("node-check", target, *[Finding(level, code, "m", action=action, gpus=gpus, ports=ports)
                                             for level, code, action, gpus, ports in findings],
                     status=status, summary="s")


def test_the_fleet_view_groups_nodes_by_their_worst_action():
    results = [
        result("gpu01"), result("gpu02", ("warn", "ib-counter", "monitor", None, ["mlx5_1/1"])),
        result("gpu03", ("fail", "ib-port-down", "drain", None, ["mlx5_4/1"]),
               ("warn", "ib-counter", "monitor", None, ["mlx5_1/1"])),
        result("gpu04"), result("gpu05", ("fail", "xid-48", "reset-gpu", [1], None)),
        result("gpu07", ("fail", "xid-79", "reboot", [2], None), ("fail", "gpu-count", "drain", None, None)),
        Result.failure("node-check", "gpu08", "unreachable", "connection refused"),
    ]
    out = StringIO()
    node_view.render_actions(results, out)
    assert out.getvalue() == textwrap.dedent("""\

        ACTION     TARGETS     WHY
        unchecked  gpu08       unreachable
        drain      gpu[03,07]  ib-port-down (mlx5_4/1), gpu-count
        reset-gpu  gpu05       xid-48 (GPU 1)
        monitor    gpu02       ib-counter (mlx5_1/1)
        none       gpu[01,04]  healthy
        """)


def test_one_healthy_node_needs_no_action_view():
    out = StringIO()
    node_view.render_actions([result("gpu01", ("info", "dcgm-absent", "none", None, None))], out)
    assert out.getvalue() == ""


def test_hostile_codes_are_escaped_in_the_view():
    out = StringIO()
    node_view.render_actions([result("n1", ("fail", "x\x1b[2Jy", "drain", None, ["p\nq"]))], out)
    assert "\x1b" not in out.getvalue() and "\\x1b[2Jy" in out.getvalue() and "p\\nq" in out.getvalue()

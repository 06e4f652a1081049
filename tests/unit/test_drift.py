"""drift(): which data keys differ between targets, and the text lines that say so."""

import pytest

from diagnostics.drift import (ABSENT, DriftRow, IGNORE_PATTERNS, drift, flatten, fold,
                               format_drift, format_value, is_ignored)


def env(torch="2.11.0", **over):
    d = {
        "os": {"name": "Ubuntu 22.04.5 LTS", "kernel": "5.15.0-131-generic", "hostname": "x"},
        "python": {"version": "3.12.3", "executable": "/opt/venv/bin/python"},
        "packages": {"torch": torch, "transformers": "4.57.1", "flash-attn": "2.8.3"},
        "torch": {"cuda": "12.8", "arch_list": ["sm_80", "sm_90"]},
        "env": {"NCCL_DEBUG": "WARN"},
        "duration_s": 1.25,
    }
    for dotted, value in over.items():
        keys = dotted.split("__")
        node = d
        for k in keys[:-1]:
            node = node[k]
        if value is ABSENT:
            node.pop(keys[-1], None)
        else:
            node[keys[-1]] = value
    return d


def cluster(n=8, **per_target):
    """gpu01..gpuNN with env(); per_target maps a target name to env() overrides."""
    out = []
    for i in range(1, n + 1):
        name = "gpu%02d" % i
        kw = dict(per_target.get(name, {}))
        kw.setdefault("os__hostname", name)
        kw.setdefault("duration_s", 1.0 + i / 10)
        out.append((name, env(**kw)))
    return out


def test_the_design_example():
    rows = drift(cluster(8, gpu05={"torch": "2.10.0"}))
    assert format_drift(rows) == ["torch: 2.11.0 on 7 targets, 2.10.0 on gpu05"]
    (row,) = rows
    assert row == DriftRow(key="packages.torch", majority="2.11.0",
                           majority_targets=("gpu01", "gpu02", "gpu03", "gpu04", "gpu06", "gpu07", "gpu08"),
                           others=(("2.10.0", ("gpu05",)),))
    assert row.targets == ("gpu01", "gpu02", "gpu03", "gpu04", "gpu06", "gpu07", "gpu08", "gpu05")


def test_identical_targets_have_no_drift_and_hostnames_durations_are_ignored():
    rows = drift(cluster(4))      # hostnames and durations differ on every target
    assert rows == []


def test_fewer_than_two_targets():
    assert drift([]) == []
    assert drift([("gpu01", env())]) == []


def test_several_keys_groups_folding_none_and_absent():
    results = cluster(8,
                      gpu05={"torch": "2.10.0", "packages__flash-attn": None},
                      gpu06={"torch": "2.10.0", "env__NCCL_DEBUG": ABSENT},
                      gpu08={"torch": None, "torch__cuda": "12.4",
                             "torch__arch_list": ["sm_80", "sm_90", "sm_100"]})
    assert format_drift(drift(results)) == [
        "torch: 2.11.0 on 5 targets, 2.10.0 on gpu[05-06], none on gpu08",
        "flash-attn: 2.8.3 on 7 targets, none on gpu05",
        "torch.cuda: 12.8 on 7 targets, 12.4 on gpu08",
        "torch.arch_list: [sm_80, sm_90] on 7 targets, [sm_80, sm_90, sm_100] on gpu08",
        "env.NCCL_DEBUG: WARN on 7 targets, absent on gpu06",
    ]


def test_tie_goes_to_the_value_seen_first_and_single_majority_is_named():
    results = [("trainbox", env(python__version="3.11.7")), ("b200", env(python__version="3.12.3"))]
    assert format_drift(drift(results)) == ["python.version: 3.11.7 on trainbox, 3.12.3 on b200"]


def test_key_present_only_on_some_targets():
    a = env()
    b = env()
    b["env"]["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"
    rows = drift([("a1", a), ("a2", a), ("b1", b)])
    assert format_drift(rows) == ["env.CUDA_VISIBLE_DEVICES: absent on 2 targets, 0,1,2,3 on b1"]
    assert rows[0].majority is ABSENT


def test_names_a_nodeset_would_misread_fall_back_to_a_comma_list():
    results = [("n%d" % i, env()) for i in range(1, 5)] + [("a,b", env("2.9.0")), ("x!y", env("2.9.0"))]
    assert format_drift(drift(results)) == ["torch: 2.11.0 on 4 targets, 2.9.0 on a,b,x!y"]


@pytest.mark.parametrize("names, text", [
    (["gpu01", "gpu02", "gpu03", "gpu05"], "gpu[01-03,05]"),
    (["cluster-a:n3", "cluster-a:n4"], "cluster-a:n[3-4]"),
    (["trainbox", "b200"], "b200,trainbox"),
    (["n[1]"], "n[1]"),
    (["a^b", "c"], "c,a^b"),        # node names folded first, then the others (nodeset.fold)
    (["a&b"], "a&b"),
])
def test_fold(names, text):
    assert fold(names) == text


def test_slurm_node_rows_fold():
    results = [("cluster-a:n%d" % i, env()) for i in range(1, 5)]
    results[2] = ("cluster-a:n3", env(torch__cuda="12.6"))
    results[3] = ("cluster-a:n4", env(torch__cuda="12.6"))
    assert format_drift(drift(results)) == ["torch.cuda: 12.8 on 2 targets, 12.6 on cluster-a:n[3-4]"]


def test_flatten():
    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": {}, "f": None}) == {
        "a.b": 1, "a.c.d": [1, 2], "f": None}


@pytest.mark.parametrize("key, ignored", [
    ("os.hostname", True), ("hostname", True), ("gpus.0.uuid", True), ("gpus.0.gpu_uuid", True),
    ("processes.pid", True), ("runtime.child_pid", True), ("timestamp", True),
    ("started_at", True), ("boot_time", True), ("duration_s", True), ("load.elapsed_ms", True),
    ("os.uptime_s", True),
    ("packages.torch", False), ("env.NCCL_TIMEOUT", False), ("python.version", False),
    ("torch.cuda", False), ("env.TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", False),
])
def test_ignore_list(key, ignored):
    assert is_ignored(key) is ignored


def test_custom_ignore_list():
    results = cluster(3, gpu02={"torch": "2.10.0"})
    assert drift(results, ignore=IGNORE_PATTERNS + ("packages.*",)) == []


def test_value_formatting_and_truncation():
    assert format_value(None) == "none"
    assert format_value(True) == "true"
    assert format_value("") == '""'
    assert format_value(ABSENT) == "absent"
    assert format_value({"b": 1, "a": 2}) == '{"a": 2, "b": 1}'
    assert format_value("x" * 100, 10) == "xxxxxxxxx\u2026"
    long_a = "/usr/local/nvidia/lib64:" + "/opt/x" * 20
    results = [("g1", env(env__LD_LIBRARY_PATH=long_a)), ("g2", env(env__LD_LIBRARY_PATH="/usr/lib"))]
    (line,) = format_drift(drift(results), max_len=20)
    assert line == "env.LD_LIBRARY_PATH: /usr/local/nvidia/l\u2026 on g1, /usr/lib on g2"


def test_drift_over_real_env_report_documents():
    """Two runs on the same machine do not drift; an edited third one shows exactly its edit."""
    import argparse
    import copy
    from tests.programs import load_script

    er = load_script("env_report.py", "mldiag_test_drift_env_report")
    a = argparse.Namespace(imports="none", packages="", no_pip_check=True, timeout=30.0)
    first, second = er.run(a)["data"], er.run(a)["data"]
    assert drift([("gpu01", first), ("gpu02", second)]) == []
    third = copy.deepcopy(first)
    third["packages"]["transformers"] = "4.46.3"
    third["os"]["hostname"] = "elsewhere"
    third["env"]["NCCL_P2P_DISABLE"] = "1"
    assert format_drift(drift([("gpu01", first), ("gpu02", second), ("gpu03", third)])) == [
        "transformers: %s on 2 targets, 4.46.3 on gpu03" % format_value(first["packages"]["transformers"]),
        "env.NCCL_P2P_DISABLE: absent on 2 targets, 1 on gpu03",
    ]

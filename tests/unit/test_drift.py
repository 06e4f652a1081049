"""drift(): which data keys differ between targets, and the text lines that say so."""

import pytest

from diagnostics.views.drift import (ABSENT, DriftRow, FactGroup, FactRow, IGNORE_PATTERNS, drift,
                               drift_keys, fact_of, flatten, fold, format_drift, format_value,
                               is_ignored)


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
    assert format_drift(rows) == ["torch: 2.11.0 on gpu[01-04,06-08]; 2.10.0 on gpu05"]
    (row,) = rows
    assert row == FactRow(fact="torch", keys=("packages.torch",), groups=(
        FactGroup("2.11.0", False, (), ("gpu01", "gpu02", "gpu03", "gpu04", "gpu06", "gpu07", "gpu08")),
        FactGroup("2.10.0", False, (), ("gpu05",))))
    assert row.targets == ("gpu01", "gpu02", "gpu03", "gpu04", "gpu06", "gpu07", "gpu08", "gpu05")
    (key_row,) = drift_keys(cluster(8, gpu05={"torch": "2.10.0"}))
    assert key_row == DriftRow(key="packages.torch", majority="2.11.0",
                           majority_targets=("gpu01", "gpu02", "gpu03", "gpu04", "gpu06", "gpu07", "gpu08"),
                           others=(("2.10.0", ("gpu05",)),))
    assert key_row.targets == ("gpu01", "gpu02", "gpu03", "gpu04", "gpu06", "gpu07", "gpu08", "gpu05")


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
    # torch's package version, its cuda and its arch list are one fact; gpu08's torch is
    # missing (no version) though some of its fields are there: they are shown
    assert format_drift(drift(results)) == [
        "torch: 2.11.0 on gpu[01-04,07]; 2.10.0 on gpu[05-06]; "
        "missing (cuda 12.4, arch_list [sm_80, sm_90, sm_100]) on gpu08",
        "flash-attn: 2.8.3 on gpu[01-04,06-08]; missing on gpu05",
        "NCCL_DEBUG: WARN on gpu[01-05,07-08]; missing on gpu06",
    ]


def test_tie_goes_to_the_value_seen_first_and_single_majority_is_named():
    results = [("trainbox", env(python__version="3.11.7")), ("b200", env(python__version="3.12.3"))]
    assert format_drift(drift(results)) == ["python: 3.11.7 on trainbox; 3.12.3 on b200"]


def test_key_present_only_on_some_targets():
    a = env()
    b = env()
    b["env"]["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"
    rows = drift([("a1", a), ("a2", a), ("b1", b)])
    assert format_drift(rows) == ["CUDA_VISIBLE_DEVICES: missing on a[1-2]; 0,1,2,3 on b1"]
    assert rows[0].groups[0].headline is ABSENT and rows[0].groups[0].missing


def test_names_a_nodeset_would_misread_fall_back_to_a_comma_list():
    results = [("n%d" % i, env()) for i in range(1, 5)] + [("a,b", env("2.9.0")), ("x!y", env("2.9.0"))]
    assert format_drift(drift(results)) == ["torch: 2.11.0 on n[1-4]; 2.9.0 on a,b,x!y"]


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
    assert format_drift(drift(results)) == [
        "torch: 2.11.0 (cuda 12.8) on cluster-a:n[1-2]; 2.11.0 (cuda 12.6) on cluster-a:n[3-4]"]


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
    assert line == "LD_LIBRARY_PATH: /usr/local/nvidia/l\u2026 on g1; /usr/lib on g2"


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
        "transformers: %s on gpu[01-02]; 4.46.3 on gpu03" % format_value(first["packages"]["transformers"]),
        "NCCL_P2P_DISABLE: missing on gpu[01-02]; 1 on gpu03",
    ]


# ----------------------------------------------------------------------------- facts

@pytest.mark.parametrize("key, fact", [
    ("packages.torch", (("", "torch"), "")),
    ("torch.cuda_available", (("", "torch"), "cuda_available")),
    ("imports.torch.ok", (("", "torch"), "import ok")),
    ("imports.flash-attn.error", (("", "flash-attn"), "import error")),
    ("packages.zope.interface", (("", "zope.interface"), "")),     # a dotted distribution name
    ("env.NCCL_DEBUG", (("env", "NCCL_DEBUG"), "")),
    ("env.A.B", (("env", "A.B"), "")),
    ("python.version", (("", "python"), "version")),
    ("driver.version", (("", "driver"), "version")),
    ("gpus.models", (("", "gpus"), "models")),
    ("count", (("", "count"), "")),
])
def test_fact_of(key, fact):
    assert fact_of(key) == fact


def test_a_package_and_a_variable_of_the_same_name_are_two_facts():
    a = {"packages": {"torch": "2.1"}, "env": {"torch": "x"}}
    b = {"packages": {"torch": "2.2"}, "env": {"torch": "y"}}
    assert format_drift(drift([("a", a), ("b", b)])) == ["torch: 2.1 on a; 2.2 on b",
                                                         "torch: x on a; y on b"]


def test_a_fact_without_a_headline_shows_its_differing_fields():
    ok = {"pip_check": {"tool": "pip", "ok": True, "problems": []}, "gpus": {"count": 8, "models": "8× H200"}}
    bad = {"pip_check": {"tool": "pip", "ok": False, "problems": ["a 1 requires b"]},
           "gpus": {"count": None, "models": None}}
    assert format_drift(drift([("n1", ok), ("n2", ok), ("n3", bad)])) == [
        "pip_check: ok true on n[1-2]; ok false, problems [a 1 requires b] on n3",
        "gpus: count 8, models 8× H200 on n[1-2]; missing on n3",
    ]


def test_groups_sharing_a_headline_are_told_apart_by_their_fields():
    def d(path, cuda, missing=False):
        return {"packages": {"torch": None if missing else "2.8.0"},
                "torch": {"path": path, "cuda": cuda}}
    results = [("a", d("/v/torch", "12.8")), ("b", d("/v/torch", "12.8")), ("c", d("/w/torch", "12.8")),
               ("d", d(None, None, True)), ("e", d("/v/torch", "12.6"))]
    assert format_drift(drift(results)) == [
        "torch: 2.8.0 (path /v/torch, cuda 12.8) on a,b; 2.8.0 (path /w/torch, cuda 12.8) on c; "
        "missing on d; 2.8.0 (path /v/torch, cuda 12.6) on e"]


def test_hidden_fields_are_named_at_most_four():
    a = {"python": {"version": "3.11.7", "executable": "/a/python", "prefix": "/a", "base_prefix": "/p",
                    "venv": True, "uv": True, "conda_env": "x"}}
    b = {"python": {"version": "3.12.3", "executable": "/b/python", "prefix": "/b", "base_prefix": "/q",
                    "venv": False, "uv": False, "conda_env": None}}
    assert format_drift(drift([("a", a), ("b", b)])) == [
        "python: 3.11.7 on a; 3.12.3 on b (also differ: executable, prefix, base_prefix, venv +2 more)"]


def test_a_long_majority_set_is_counted():
    names = ["login-node-%s" % c for c in "abcdefgh"]
    results = [(n, {"v": "1"}) for n in names] + [("odd", {"v": "2"})]
    assert format_drift(drift(results)) == ["v: 1 on 8 targets; 2 on odd"]


# ------------------------------------------------------- real env-report documents, real venvs

@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """env-report documents from real interpreters on this machine, as a target sends them:
    ``mlbox``: this test's own virtualenv (torch, transformers, ...); ``gpubox`` and ``oldbox``:
    two bare venvs (no packages, no pip) of pyenv's Python 3.8 — the oldest the scripts support."""
    import json
    import subprocess
    import sys
    from tests.programs import SCRIPTS
    from tests.pythons import require_python

    py38 = require_python("3.8")
    root = tmp_path_factory.mktemp("venvs")
    pythons = {"mlbox": sys.executable}
    for name in ("gpubox", "oldbox"):
        subprocess.run([py38, "-m", "venv", "--without-pip", str(root / name)], check=True, timeout=60)
        pythons[name] = str(root / name / "bin" / "python")
    docs = {}
    for name, python in pythons.items():
        out = subprocess.run([python, str(SCRIPTS / "env_report.py"), "--no-pip-check"],
                             capture_output=True, text=True, timeout=120, cwd=str(root))
        assert out.returncode in (0, 1, 2), out.stderr
        docs[name] = json.loads(out.stdout)["data"]
    return docs


def test_real_documents_one_line_per_fact(documents):
    ml, gpu = documents["mlbox"], documents["gpubox"]
    assert ml["packages"]["torch"] and ml["torch"]["imported"], "the test venv has torch"
    results = [("mlbox", ml), ("gpubox", gpu)]
    keys = drift_keys(results)
    rows = drift(results)
    lines = format_drift(rows)
    # every differing key is in exactly one fact, and one fact is one line
    assert sorted(k for r in rows for k in r.keys) == sorted(r.key for r in keys)
    assert len(keys) > 2 * len(rows), (len(keys), lines)
    names = [line.split(":", 1)[0] for line in lines]
    assert len(names) == len(set(names)), lines
    assert not [n for n in names if "." in n], lines        # no torch.version, imports.torch.ok ...
    installed = [k for k, v in ml["packages"].items() if v]
    assert names == ["python"] + installed, lines
    assert lines[0] == "python: %s on mlbox; %s on gpubox (also differ: executable, prefix, base_prefix)" % (
        ml["python"]["version"], gpu["python"]["version"])
    assert "torch: %s on mlbox; missing on gpubox" % ml["packages"]["torch"] in lines
    for name in installed:
        assert "%s: %s on mlbox; missing on gpubox" % (name, ml["packages"][name]) in lines


def test_real_documents_same_interpreter_two_venvs(documents):
    gpu, old = documents["gpubox"], documents["oldbox"]
    assert format_drift(drift([("gpubox", gpu), ("oldbox", old)])) == [
        "python: {v} (executable {e1}, prefix {p1}) on gpubox; {v} (executable {e2}, prefix {p2}) on oldbox".format(
            v=gpu["python"]["version"], e1=gpu["python"]["executable"], p1=gpu["python"]["prefix"],
            e2=old["python"]["executable"], p2=old["python"]["prefix"])]


def test_real_documents_three_targets_fold(documents):
    results = [(n, documents[n]) for n in ("mlbox", "gpubox", "oldbox")]
    lines = format_drift(drift(results))
    assert "torch: missing on gpubox,oldbox; %s on mlbox" % documents["mlbox"]["packages"]["torch"] in lines
    # the two 3.8 venvs share a version: their own fields tell them apart
    gpu, old = documents["gpubox"]["python"], documents["oldbox"]["python"]
    assert lines[0] == (
        "python: {v1} on mlbox; {v2} (executable {e1}, prefix {p1}) on gpubox; "
        "{v2} (executable {e2}, prefix {p2}) on oldbox (also differ: base_prefix)".format(
            v1=documents["mlbox"]["python"]["version"], v2=gpu["version"], e1=gpu["executable"],
            p1=gpu["prefix"], e2=old["executable"], p2=old["prefix"])), lines


def _fleet(doc, edit):
    import copy
    out = []
    for i in range(1, 17):
        d = copy.deepcopy(doc)
        d["os"]["hostname"] = "gpu%02d" % i
        if i == 16:
            edit(d)
        out.append(("gpu%02d" % i, d))
    return out


def test_real_document_fleet_with_one_older_torch(documents):
    ml = documents["mlbox"]
    version = ml["packages"]["torch"]

    def older(d):          # what a node with torch 2.12.0 in the same venv path reports
        d["packages"]["torch"] = d["torch"]["version"] = d["imports"]["torch"]["version"] = "2.12.0"
    assert format_drift(drift(_fleet(ml, older))) == [
        "torch: %s on gpu[01-15]; 2.12.0 on gpu16" % version]

    def elsewhere(d):      # ... and installed elsewhere: the path is named, not shown
        older(d)
        d["torch"]["path"] = d["imports"]["torch"]["path"] = "/opt/other/torch"
    assert format_drift(drift(_fleet(ml, elsewhere))) == [
        "torch: %s on gpu[01-15]; 2.12.0 on gpu16 (also differ: path, import path)" % version]

    def gpus_hidden(d):    # the same torch, but this node sees GPUs
        d["torch"]["cuda_available"], d["torch"]["device_count"] = True, 8
    assert format_drift(drift(_fleet(ml, gpus_hidden))) == [
        "torch: {v} (cuda_available false, device_count 0) on gpu[01-15]; "
        "{v} (cuda_available true, device_count 8) on gpu16".format(v=version)]

    def broken(d):         # installed, but its import fails
        d["torch"]["imported"] = False
        d["imports"]["torch"].update(ok=False, error="ImportError: libcudnn.so.9: cannot open shared object file")
    line, = format_drift(drift(_fleet(ml, broken)))
    assert line == ("torch: {v} (imported true, import ok true, import error none) on gpu[01-15]; "
                    "{v} (imported false, import ok false, import error ImportError: libcudnn.so.9: "
                    "cannot open shared object file) on gpu16".format(v=version))


def test_empty_fields_are_kept_where_groups_would_read_alike():
    a, b, c = ({"check": {"problems": p, "ok": o}} for p, o in (([], True), (None, True), ([], False)))
    assert format_drift(drift([("a", a), ("b", b), ("c", c)])) == [
        "check: problems [], ok true on a; problems none, ok true on b; problems [], ok false on c"]


def test_a_missing_fact_shows_the_fields_that_say_why():
    ok = {"driver": {"version": "590.48.01", "source": "nvidia-smi", "nvidia_smi_error": None,
                     "kernel_module": "open"}}
    sick = {"driver": {"version": None, "source": None, "nvidia_smi_error": "exit 15: GPU lost",
                       "kernel_module": None}}
    gone = {"driver": {"version": None, "source": None, "nvidia_smi_error": None, "kernel_module": None}}
    assert format_drift(drift([("hotbox", ok), ("trainbox", ok), ("sickbox", sick), ("cpubox", gone)])) == [
        "driver: 590.48.01 on hotbox,trainbox; missing (nvidia_smi_error exit 15: GPU lost) on sickbox; "
        "missing on cpubox"]


def test_missing_groups_that_would_read_alike_are_told_apart():
    a = {"driver": {"version": "590.48.01", "kernel_module": "open"}}
    b = {"driver": {"version": None, "kernel_module": None}}
    c = {"driver": {"version": None, "kernel_module": ""}}
    assert format_drift(drift([("a", a), ("b", b), ("c", c)])) == [
        'driver: 590.48.01 on a; missing (kernel_module none) on b; missing (kernel_module "") on c']

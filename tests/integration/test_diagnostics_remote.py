"""Every diagnostic end to end through the real path: `mldiag` (a subprocess, as a user runs
it) → ssh main (the lab's sshd, user mlsh) → sudo → pct 200 (LXC) → /root/venv/bin/python,
the CT's venv made from Debian's /usr/bin/python3.11.

- gpu-status: the fake nvidia-smi (/usr/bin/nvidia-smi in the CT) answers from a capture
  picked by the target's `env:`.
- env-report: the CT and the `main` host in one call: the drift view and the JSON documents.
- scan-log: a recorded log of tests/fixtures/logs, bind-mounted read-only in the CT.
- check-attn, extract-smoke: tiny random Llama-style and Qwen3-Next-style models saved by this
  module into a directory bind-mounted in the CT; torch and transformers come from this test
  process's own site-packages, bind-mounted read-only and put on the target's
  `env: {PYTHONPATH: ...}`, with the base-system libraries torch links (libstdc++ & co., missing
  from the lab's minimal rootfs) on `LD_LIBRARY_PATH` (both binds: tests/integration/conftest.py).
  No torch or transformers here: skipped, or a failure under CI=true (tests/ml/mlenv.py).
"""

import json
import os
import re
import shutil
import textwrap
from functools import partial
from pathlib import Path

import pytest

from tests import programs
from tests.programs import findings_by_code, load_module

REPO = Path(__file__).resolve().parents[2]
VENV_PY = "/root/venv/bin/python"

mlenv = load_module(REPO / "tests" / "ml" / "mlenv.py", "mldiag_mlenv")


mldiag = partial(programs.mldiag, timeout=240)


def docs_of(r):
    """The result documents of a --json run, by target."""
    assert "Traceback" not in r.stderr, r.stderr
    return {d["target"]: d for d in json.loads(r.stdout)}


def bind(lab, pred, what):
    """The host path (= the path inside the CT) of one of the lab's extra binds: those under
    tests/ are the lab's copies in its session dir (Lab._stage_test_files)."""
    found = [b for b in lab.extra_binds if pred(Path(b))]
    if not found:
        lab.on_unavailable(f"{what} is not bind-mounted into the CT (tests/integration/conftest.py)")
    return Path(found[0])


def ct(name, env=None, **more):
    """A pct 200 target behind `pve` (ssh main → sudo), as one hosts.yaml line."""
    fields = {"runtime": "pct", "id": "200", "python": VENV_PY, **more}
    if env:
        fields["env"] = env
    return f"      {name}: {json.dumps(fields)}\n"


def hosts_file(lab, containers):
    return lab.hosts_yaml(textwrap.dedent("""\
        defaults: {connect_timeout: 5, timeout: 240}
        hosts:
          main: {}
          pve:
            address: main
            become: sudo
            containers:
        """) + "".join(containers))


# ------------------------------------------------------------------ no torch needed


@pytest.fixture(scope="module")
def plain_hosts(lab):
    lab.need("lxc")
    return hosts_file(lab, [
        ct("ct"),
        ct("gpubusy", gpus=8, env={"MLDIAG_FAKE_NVIDIA_SMI": "derived__h200x8__busy-pid-4242"}),
        ct("gpuhot", gpus=8, env={"MLDIAG_FAKE_NVIDIA_SMI": "derived__h200x8__hw-thermal-slowdown",
                                  "MLDIAG_FAKE_NVIDIA_SMI_PHASE": "load"}),
    ])


def test_gpu_status_in_the_ct(plain_hosts):
    r = mldiag("gpu-status", "--hosts-file", plain_hosts, "-H", "gpubusy,gpuhot", "--json")
    assert r.returncode == 2, r.stdout + r.stderr          # worst: the thermal slowdown (fail)
    docs = docs_of(r)

    busy = docs["gpubusy"]
    assert busy["status"] == "ok", busy
    assert busy["summary"] == "8\u00d7 NVIDIA H200, driver 590.48.01: healthy; GPU 3 busy (71 GiB, pid 4242)"
    assert busy["findings"] == [{"level": "info", "code": "gpu-busy",
                                 "message": "GPU 3 busy: 71 GiB held by pid 4242 (python)", "gpus": [3], "action": "none"}]
    assert busy["data"]["source"] == "nvidia-smi" and busy["data"]["gpu_count"] == 8
    assert busy["data"]["processes"] == [{"gpu": 3, "pid": 4242, "name": "python", "used_memory_mib": 72704,
                                          "gpu_uuid": "GPU-00000003-0000-0000-0000-000000000003"}]

    hot = docs["gpuhot"]
    assert hot["status"] == "fail"
    assert hot["data"]["gpus"][2]["clocks_event_reasons"] == {
        "active": "0x0000000000000048", "names": ["hw_slowdown", "hw_thermal_slowdown"]}
    assert [(f["level"], f["code"], f["message"]) for f in hot["findings"] if f["level"] != "info"] == [
        ("fail", "clocks-hw-thermal", "GPU 2: HW thermal slowdown active at 93 C, SM clock 810 of 1980 MHz; "
                                      "engaged 3.1 s in all")]
    assert hot["summary"] == "8\u00d7 NVIDIA H200, driver 590.48.01: GPU 2: HW thermal slowdown; GPUs 0-7 busy"


def test_env_report_drift_between_ct_and_host(plain_hosts):
    # the table: with two targets, only what differs between them
    r = mldiag("env-report", "--hosts-file", plain_hosts, "-H", "ct,main")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode in (0, 1), r.stdout + r.stderr   # warn: e.g. pip check on the host's python
    out = r.stdout
    assert "drift across 2 targets:" in out
    drift = out.split("drift across 2 targets:", 1)[1].splitlines()
    lines = {ln.strip().split(":", 1)[0]: ln.strip() for ln in drift if ln.strip()}
    # one line for python: the same Debian 3.11.2 on both sides, told apart by their fields
    py = lines["python"]
    assert re.fullmatch(r"python: (\S+) \(.*executable /root/venv/bin/python.*venv true.*\) on ct; "
                        r"\1 \(.*executable /usr/bin/python3.*venv false.*\) on main", py), py
    # the same OS on both sides (only how it runs may differ: a container kind); host names never
    # drift; no torch on either; no per-field lines
    assert not re.search(r"\b(?:name|id|version_id|kernel|arch|libc) ", lines.get("os", "")), out
    for same in ("torch", "hostname"):
        assert same not in lines, (same, out)
    assert not [name for name in lines if name.startswith(("python.", "torch.", "imports."))], out
    table = out.split("\n\n", 1)[0].splitlines()     # the usual table first: one row per target
    assert table[0].split()[:3] == ["TARGETS", "STATUS", "SUMMARY"]
    assert {ln.split()[0] for ln in table[1:] if not ln.startswith(" ")} == {"ct", "main"}

    # --json: one document per target, every field
    j = mldiag("env-report", "--hosts-file", plain_hosts, "-H", "ct,main", "--json")
    assert j.returncode == r.returncode, j.stdout + j.stderr
    docs = docs_of(j)
    assert set(docs) == {"ct", "main"}
    c, m = docs["ct"]["data"], docs["main"]["data"]
    assert c["python"]["executable"] == VENV_PY and c["python"]["venv"] is True
    assert c["python"]["base_prefix"] == "/usr" and c["python"]["prefix"] == "/root/venv"
    assert m["python"]["executable"] == "/usr/bin/python3" and m["python"]["venv"] is False
    assert c["python"]["version"] == m["python"]["version"] == "3.11.2"
    assert c["os"]["id"] == m["os"]["id"] == "debian"
    assert c["packages"]["torch"] is None and c["torch"]["installed"] is False   # the bare CT venv
    assert c["os"]["hostname"] == "ct200"       # the CT's own UTS name (lxc.uts.name)
    assert c["os"]["container"] == "lxc"
    assert docs["ct"]["diagnostic"] == "env-report" and docs["ct"]["error"] is None


def test_scan_log_on_a_log_inside_the_ct(lab, plain_hosts):
    logs = bind(lab, lambda b: b.name == "fixtures", "tests/fixtures") / "logs"
    log = logs / "extract_empty_errors.log"     # ERROR in batch 0-3: (nothing after the colon)
    # the same file read in the CT and on the host: identical answers, folded into one row
    r = mldiag("scan-log", "--hosts-file", plain_hosts, "-H", "ct,main", "--path", log)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.splitlines()[1].split()[:2] == ["ct,main", "fail"], r.stdout
    assert r.stdout.splitlines()[-1] == "2 fail"

    j = mldiag("scan-log", "--hosts-file", plain_hosts, "-H", "ct", "--path", log, "--json")
    assert j.returncode == 2, j.stdout + j.stderr
    doc = docs_of(j)["ct"]
    d = doc["data"]
    assert doc["status"] == "fail"
    assert d["lines_scanned"] == 48 and (d["first_line"], d["last_line"]) == (1, 48)
    assert [e["line"] for e in d["matches"]["empty-error"]] == [5, 7, 8, 9]
    assert [e["line"] for e in d["matches"]["traceback"]] == [12, 21, 42]
    assert {k: v for k, v in d["counts"].items() if v} == {"traceback": 3, "empty-error": 4}
    assert d["total"] == 7
    assert [f["code"] for f in doc["findings"]] == ["traceback", "empty-error"]
    f = findings_by_code(doc)["empty-error"]
    assert f["level"] == "fail" and "first at line 5" in f["message"] and "last at line 9" in f["message"]

    # --lines: only the tail is read, line numbers stay absolute
    t = mldiag("scan-log", "--hosts-file", plain_hosts, "-H", "ct", "--path", logs / "dmesg_xid.log",
               "--lines", "5", "--json")
    doc = docs_of(t)["ct"]
    d = doc["data"]
    assert (d["first_line"], d["last_line"]) == (15, 19) and d["lines_scanned"] == 5
    assert [e["line"] for e in d["matches"]["killed"]] == [15, 16]
    assert [e["line"] for e in d["matches"]["xid-fatal"]] == [18]
    assert [e["line"] for e in d["matches"]["xid"]] == [19]


# ------------------------------------------------------------------ torch + transformers in the CT


def packages_in_ct(lab, *names):
    """The ``env:`` a CT target needs to import this process's packages ``names`` (torch's
    libraries included), and the modules: (env, modules)."""
    lab.need("lxc")
    modules = [mlenv.require(name) for name in names]
    sites = {Path(m.__file__).resolve().parents[1] for m in modules}
    for site in sites:
        bind(lab, lambda b, s=site: b == s, f"site-packages {site}")
    libdir = bind(lab, lambda b: b.parent.name == "ml" and b.name.startswith("lib-"), "the torch libs dir")
    return {"PYTHONPATH": os.pathsep.join(sorted(str(s) for s in sites)), "LD_LIBRARY_PATH": str(libdir)}, modules


def tiny_models_in_ct(lab, *subdir):
    """Tiny models saved once into the models dir the CT sees (the session's own dir, then
    `subdir`): llama (4 full-attention layers, tokenizer) and qwen3next (3 linear + 1 full
    attention, no tokenizer); and the `env:` a CT target needs to import this process's torch and
    transformers. Returns (root, models, env, torch, transformers); the caller removes root."""
    env, (torch, transformers) = packages_in_ct(lab, "torch", "transformers")
    models_root = bind(lab, lambda b: b.parent.name == "ml" and b.name == "models", "the models dir")
    for old in models_root.iterdir():   # left by killed sessions
        if old.is_dir() and not (lab.root / f"session-{old.name}").exists():
            shutil.rmtree(old, ignore_errors=True)
    root = models_root.joinpath(lab.sid, *subdir)
    tm = mlenv.load_tiny_models()
    models = {
        "llama": tm.build("llama", root / "llama", tokenizer=True),
        "qwen3next": tm.build("qwen3_next", root / "qwen3_next"),
    }
    for dirpath, dirnames, filenames in os.walk(models_root / lab.sid):
        os.chmod(dirpath, 0o755)
    env = dict(env, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return root, models, env, torch, transformers


@pytest.fixture(scope="module")
def ml_hosts(lab):
    """A hosts.yaml whose CT targets see this process's torch and transformers, and the tiny models
    of tiny_models_in_ct. (The NaN-injected model's failure is tests/unit's: one more target here
    costs a whole torch + transformers import in the CT.)"""
    root, models, env, torch, transformers = tiny_models_in_ct(lab)
    path = hosts_file(lab, [ct(name, env=env, models={"tiny": info["path"]}) for name, info in models.items()])
    try:
        yield path, models, transformers.__version__, torch.__version__
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_check_attn_in_the_ct(ml_hosts):
    path, models, tf_version, torch_version = ml_hosts
    # no --model: each target's first models: entry
    r = mldiag("check-attn", "--hosts-file", path, "-H", "llama,qwen3next", "--json")
    docs = docs_of(r)
    for doc in docs.values():
        assert doc["error"] is None, doc["error"]
    llama, qwen = docs["llama"], docs["qwen3next"]

    d = llama["data"]
    assert llama["status"] == "ok" and llama["findings"] == [], llama["findings"]
    assert d["versions"]["transformers"] == tf_version and d["versions"]["torch"] == torch_version
    assert d["model"]["config_class"] == "LlamaConfig" and d["model"]["model_type"] == "llama"
    assert d["build"]["class"] == "LlamaForCausalLM" and d["build"]["chosen_by"] == "architectures"
    assert d["build"]["device"] == "meta"
    assert d["requested"]["levels"][0]["requested"] is None
    assert [(m["layer_idx"], m["implementation"]) for m in d["resolved"]["modules"]] == \
        [(0, "sdpa"), (1, "sdpa"), (2, "sdpa"), (3, "sdpa")]
    assert d["resolved"]["counts"] == {"sdpa": 4}
    assert d["layers"]["types"] == {"full_attention": 4} and d["layers"]["linear_attention"] == 0
    assert llama["summary"] == "LlamaForCausalLM: sdpa on 4 attention modules; 4/4 full-attention layers"

    d = qwen["data"]
    assert d["build"]["class"] == "Qwen3NextForCausalLM"
    assert d["layers"]["types"] == {"linear_attention": 3, "full_attention": 1}
    assert d["resolved"]["counts"] == {"sdpa": 1} and d["resolved"]["modules"][0]["layer_idx"] == 3
    assert d["linear_attention"]["modules"] == 3
    assert d["linear_attention"]["module_classes"] == ["Qwen3NextGatedDeltaNet"]
    assert d["cuda"]["available"] is False
    if not d["kernels"]["flash-linear-attention"]["installed"]:
        f = findings_by_code(qwen)["fla-missing"]
        assert f["level"] == "warn" and qwen["status"] == "warn"   # no CUDA here: warn, not fail
        assert f["message"] == ("3 of 4 layers are linear attention and flash-linear-attention is missing: "
                                "slow torch fallback")
        assert r.returncode == 1, r.stdout + r.stderr


def test_extract_smoke_in_the_ct(ml_hosts):
    path, models, _tf, _torch = ml_hosts
    r = mldiag("extract-smoke", "--hosts-file", path, "-H", "llama,qwen3next", "--json",
               "--backend", "transformers", "--device", "cpu", "--max-tokens", "16", "--samples", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    docs = docs_of(r)
    for name in ("llama", "qwen3next"):
        doc = docs[name]
        assert doc["status"] == "ok", (name, doc["findings"], doc["error"])
        d = doc["data"]
        assert d["backend"] == "transformers" and d["model_class"] == models[name]["class"]
        assert d["num_layers"] == 4 and d["hidden_size"] == 32 and isinstance(d["hidden_size"], int)
        assert [l["id"] for l in d["layers"]] == [1, 2, 4]          # default [2, N//2, N-3] + N, N = 4
        assert len(d["samples"]) == 2
        tokens = sum(s["tokens"] for s in d["samples"])
        for layer in d["layers"]:
            assert layer["shape"] == [tokens, 32] and layer["dtype"] == "float32"
            assert layer["finite"] is True and layer["std"] > 0
        assert d["final_norm"] == "after" and d["last_layer_captured"] is True
        assert doc["summary"].startswith("transformers: layers 1,2,4 of 4 captured, hidden 32")
    assert docs["llama"]["data"]["tokenizer"]["synthetic_ids"] is False
    assert docs["qwen3next"]["data"]["tokenizer"]["synthetic_ids"] is True

"""check-attn on real transformers classes, CPU torch, tiny configs saved by the test.

Models (tests/ml/tiny_models.py): a Llama-style model (4 full-attention layers), a Qwen3-Next-style
hybrid shrunk to 4 layers (3 linear + 1 full), a composite Qwen3.5-style config (text + vision;
Qwen2.5-VL when the installed transformers lacks qwen3_5), and one run on transformers 4.57
installed beside the 5.x one (pip --target, PYTHONPATH in a subprocess).
"""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.programs import REPO, findings_by_code, load_module

mlenv = load_module(Path(REPO) / "tests" / "ml" / "mlenv.py", "mldiag_mlenv")

SCRIPT = mlenv.SCRIPTS / "check_attn.py"


# ---------------------------------------------------------------- static (no torch needed)

def test_script_parses_as_python38():
    src = SCRIPT.read_text()
    tree = ast.parse(src, feature_version=(3, 8))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert "diagnostics" not in imported
    # heavy imports only inside functions
    top_names = set()
    for n in tree.body:
        if isinstance(n, ast.Import):
            top_names.update(a.name.split(".")[0] for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            top_names.add((n.module or "").split(".")[0])
    assert not top_names & {"torch", "transformers", "vllm", "numpy"}


def test_help_and_import_are_stdlib_only():
    code = ("import sys; sys.path.insert(0, %r); import check_attn; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules; "
            "p = check_attn.build_parser(); a = p.parse_args(['--model', 'x']); "
            "assert a.attn_implementation is None and a.model_class is None") % str(mlenv.SCRIPTS)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    r = subprocess.run([sys.executable, str(SCRIPT), "--help"], stdout=subprocess.PIPE,
                       universal_newlines=True, timeout=60)
    assert r.returncode == 0
    assert "--attn-implementation" in r.stdout and "--model" in r.stdout


# ---------------------------------------------------------------- real transformers

@pytest.fixture(scope="module")
def ml():
    torch = mlenv.require("torch")
    transformers = mlenv.require("transformers")
    return torch, transformers


@pytest.fixture(scope="module")
def check_attn(ml):
    return mlenv.load_script("check_attn")


@pytest.fixture(scope="module")
def models(ml, tmp_path_factory):
    tm = mlenv.load_tiny_models()
    root = tmp_path_factory.mktemp("check_attn_models")
    out = {}
    for kind in ("llama", "qwen3_next"):
        out[kind] = tm.build(kind, root / kind, weights=False)
    kind = "qwen3_5" if tm.available("qwen3_5") else "qwen2_5_vl"
    out["composite"] = tm.build(kind, root / "composite", weights=False)
    out["llama_eager"] = tm.build("llama", root / "llama_eager", weights=False,
                                  config_updates={"attn_implementation": "eager"})
    out["llama_unknown_arch"] = tm.build("llama", root / "llama_unknown_arch", weights=False,
                                         config_updates={"architectures": ["AcmeForCausalLM"]})
    return out


def attn(check_attn, path, *extra):
    args = check_attn.build_parser().parse_args(["--model", str(path)] + list(extra))
    res = check_attn.run(args)
    json.dumps(res)  # serialisable as the runtime will print it
    assert set(res) >= {"status", "summary", "findings", "data"}
    assert "\n" not in res["summary"]
    return res


def test_llama_all_sdpa_all_full(check_attn, models):
    res = attn(check_attn, models["llama"]["path"])
    d = res["data"]
    assert res["status"] == "ok", res["findings"]
    assert res["findings"] == []
    assert d["model"]["config_class"] == "LlamaConfig" and d["model"]["model_type"] == "llama"
    assert d["model"]["composite"] is False and d["model"]["text_config"] is None
    assert d["build"]["class"] == "LlamaForCausalLM" and d["build"]["chosen_by"] == "architectures"
    assert d["build"]["device"] == "meta"
    # requested read before building: nothing set (None on 4.47+)
    assert d["requested"]["levels"][0]["requested"] is None
    mods = d["resolved"]["modules"]
    assert len(mods) == 4 and all(m["implementation"] == "sdpa" for m in mods)
    assert [m["layer_idx"] for m in mods] == [0, 1, 2, 3]
    assert d["resolved"]["counts"] == {"sdpa": 4}
    assert d["layers"]["num_layers"] == 4 and d["layers"]["types"] == {"full_attention": 4}
    assert d["layers"]["linear_attention"] == 0
    assert res["summary"] == "LlamaForCausalLM: sdpa on 4 attention modules; 4/4 full-attention layers"
    k = d["kernels"]
    assert set(k) >= {"flash-attn", "flash-linear-attention", "causal-conv1d"}
    for entry in k.values():
        assert set(entry) >= {"installed", "importable", "usable", "version"}
    assert set(d["sdpa_backends"]) >= {"flash", "mem_efficient", "math", "cudnn"}
    assert d["versions"]["torch"] and d["versions"]["transformers"]


def test_qwen3_next_hybrid_counts_linear_layers(check_attn, models):
    res = attn(check_attn, models["qwen3_next"]["path"])
    d = res["data"]
    assert d["layers"]["types"] == {"linear_attention": 3, "full_attention": 1}
    assert d["layers"]["linear_attention"] == 3 and d["layers"]["full_attention"] == 1
    assert d["resolved"]["counts"] == {"sdpa": 1}
    assert d["resolved"]["modules"][0]["layer_idx"] == 3
    assert d["linear_attention"]["modules"] == 3
    assert d["linear_attention"]["module_classes"] == ["Qwen3NextGatedDeltaNet"]
    fla = d["kernels"]["flash-linear-attention"]
    if fla["installed"]:
        pytest.skip("flash-linear-attention is installed here")
    assert fla["importable"] is False and fla["usable"] is False
    f = findings_by_code(res)["fla-missing"]
    assert f["message"] == ("3 of 4 layers are linear attention and flash-linear-attention is missing: "
                            "slow torch fallback")
    assert f["level"] == ("fail" if d["cuda"]["available"] else "warn")
    assert res["status"] == f["level"]
    assert "3 linear (torch fallback)" in res["summary"]


def test_composite_text_sub_config(check_attn, models):
    info = models["composite"]
    res = attn(check_attn, info["path"])
    d = res["data"]
    m = d["model"]
    assert m["composite"] is True
    if info["kind"] == "qwen3_5":
        assert m["config_class"] == "Qwen3_5Config"
        assert m["text_config"] == {"class": "Qwen3_5TextConfig", "model_type": "qwen3_5_text"}
        assert d["layers"]["types"] == {"linear_attention": 3, "full_attention": 1}
        assert "fla-missing" in findings_by_code(res) or d["kernels"]["flash-linear-attention"]["installed"]
    else:
        assert m["text_config"]["class"] == "Qwen2_5_VLTextConfig"
    paths = {lv["path"]: lv for lv in d["requested"]["levels"]}
    assert set(paths) == {"(root)", "text_config", "vision_config"}
    assert all(lv["requested"] is None for lv in paths.values())
    assert d["build"]["class"] == info["class"]
    # the text model and the vision tower are reported separately, each resolved to sdpa
    by_model = d["resolved"]["by_model"]
    assert len(by_model) == 2, by_model
    assert all(set(c) == {"sdpa"} for c in by_model.values())
    vision = [k for k in by_model if "Vision" in k]
    assert vision and by_model[vision[0]]["sdpa"] == 2


def test_same_family_causal_lm_is_not_a_mismatch(check_attn, models):
    info = models["composite"]
    if info["kind"] != "qwen3_5":
        pytest.skip("needs qwen3_5 in the installed transformers")
    res = attn(check_attn, info["path"], "--model-class", "Qwen3_5ForCausalLM")
    assert res["data"]["build"]["class"] == "Qwen3_5ForCausalLM"
    assert res["data"]["build"].get("same_family") is True
    assert "class-mismatch" not in findings_by_code(res)
    assert res["data"]["resolved"]["counts"] == {"sdpa": 1}


def test_unknown_architecture_falls_back_to_auto_and_flags_family(check_attn, models):
    res = attn(check_attn, models["llama_unknown_arch"]["path"])
    c = findings_by_code(res)
    assert res["data"]["build"]["chosen_by"] == "auto:AutoModelForCausalLM"
    assert res["data"]["build"]["class"] == "LlamaForCausalLM"
    assert "AcmeForCausalLM" in c["architecture-unavailable"]["message"]
    assert c["class-mismatch"]["level"] == "warn"
    assert "LlamaForCausalLM" in c["class-mismatch"]["message"]


def test_flash_attention_2_request_cannot_dispatch(check_attn, models):
    res = attn(check_attn, models["llama"]["path"], "--attn-implementation", "flash_attention_2")
    d = res["data"]
    if d["kernels"]["flash-attn"]["usable"]:
        pytest.skip("flash-attn is usable here")
    f = findings_by_code(res)["attn-cannot-dispatch"]
    assert f["level"] == "fail" and res["status"] == "fail"
    assert "flash_attention_2" in f["message"]
    assert "ImportError" in f["message"] and "FlashAttention2" in f["message"]
    assert d["build"]["error"]["type"] == "ImportError"
    assert "Traceback" in d["build"]["error"]["traceback"]
    assert d["requested"]["override"] == "flash_attention_2"
    # what the checkpoint resolves to without the override is still reported
    assert d["build"]["fallback_build"]
    assert d["resolved"]["counts"] == {"sdpa": 4}


def test_unknown_implementation_is_reported(check_attn, models):
    res = attn(check_attn, models["llama"]["path"], "--attn-implementation", "flash_attn_99")
    f = findings_by_code(res)["attn-cannot-dispatch"]
    assert "flash_attn_99" in f["message"] and "ValueError" in f["message"]


def test_explicit_eager_override_is_not_a_finding(check_attn, models):
    res = attn(check_attn, models["llama"]["path"], "--attn-implementation", "eager")
    assert res["data"]["resolved"]["counts"] == {"eager": 4}
    assert res["status"] == "ok" and res["findings"] == []


def test_config_requesting_eager_is_read_before_building(check_attn, models, ml):
    _torch, transformers = ml
    res = attn(check_attn, models["llama_eager"]["path"])
    d = res["data"]
    if d["requested"]["levels"][0]["requested"] != "eager":
        pytest.skip("transformers %s ignores attn_implementation in config.json" % transformers.__version__)
    assert d["resolved"]["counts"] == {"eager": 4}
    f = findings_by_code(res)["eager-attention"]
    assert f["level"] == "warn" and "config requests eager" in f["message"]


def test_transformers_4_57_subprocess(tmp_path):
    mlenv.require("torch")
    target = mlenv.tf457_dir()
    env = dict(os.environ, PYTHONPATH=str(target))
    model = tmp_path / "qwen3_next_457"
    cmd = [sys.executable, str(mlenv.ML / "tiny_models.py"), "qwen3_next", str(model), "--config-only",
           "--then-run", str(SCRIPT), "--model", "MODEL_DIR"]
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       timeout=300)
    assert r.stdout.strip().startswith("{"), r.stderr[-3000:]
    res = json.loads(r.stdout)
    d = res["data"]
    assert d["versions"]["transformers"].startswith("4.57."), d["versions"]
    assert r.returncode == {"ok": 0, "warn": 1, "fail": 2, "error": 3}[res["status"]]
    assert d["build"]["class"] == "Qwen3NextForCausalLM"
    assert d["requested"]["levels"][0]["requested"] is None  # 4.57: unset is None, not "eager"
    assert d["resolved"]["counts"] == {"sdpa": 1}
    assert d["layers"]["types"] == {"linear_attention": 3, "full_attention": 1}
    # 4.57 decides the fast path at import (is_fast_path_available) and warns when building
    fast = d["linear_attention"]["fast_path"]["Qwen3NextGatedDeltaNet"]
    assert fast["is_fast_path_available"] is False
    assert any("fast path is not available" in m for m in d["linear_attention"]["transformers_warnings"])
    assert "fla-missing" in {f["code"] for f in res["findings"]}


def test_missing_model_path(check_attn, tmp_path):
    res = attn(check_attn, tmp_path / "nope")
    assert res["status"] == "fail" and findings_by_code(res)["model-not-found"]["level"] == "fail"
    assert "does not exist" in res["summary"]

"""extract-smoke on tiny random models saved by the test (CPU torch, transformers backend).

Layer ids are HF hidden_states indices (0 = embeddings, i = output of decoder layer i-1, N = last,
after the final norm).  With N = 4 the default ids [2, N//2, N-3] + [N] are {1, 2, 4}.
The vllm backend cannot run here (no GPU, no vllm): only its "not importable" failure is tested.
"""

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.programs import REPO, findings_by_code, load_module

mlenv = load_module(Path(REPO) / "tests" / "ml" / "mlenv.py", "mldiag_mlenv")

SCRIPT = mlenv.SCRIPTS / "extract_smoke.py"


# ---------------------------------------------------------------- static (no torch needed)

def test_script_parses_as_python38_and_is_stdlib_only_at_import():
    tree = ast.parse(SCRIPT.read_text(), feature_version=(3, 8))
    top = set()
    every = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            every.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            every.add(node.module.split(".")[0])
    for node in tree.body:
        if isinstance(node, ast.Import):
            top.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            top.add((node.module or "").split(".")[0])
    assert "diagnostics" not in every
    assert not top & {"torch", "transformers", "vllm", "numpy", "safetensors"}
    code = ("import sys; sys.path.insert(0, %r); import extract_smoke as e; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules; "
            "assert e.default_layers(32) == [2, 16, 29, 32], e.default_layers(32); "
            "assert e.default_layers(4) == [1, 2, 4]; assert e.default_layers(2) == [1, 2]; "
            "assert e.parse_layers('2, 16,29') == [2, 16, 29]") % str(mlenv.SCRIPTS)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    r = subprocess.run([sys.executable, str(SCRIPT), "--help"], stdout=subprocess.PIPE,
                       universal_newlines=True, timeout=60)
    assert r.returncode == 0
    for flag in ("--model", "--layers", "--samples", "--data", "--backend", "--max-tokens", "--device"):
        assert flag in r.stdout


# ---------------------------------------------------------------- real models

@pytest.fixture(scope="module")
def ml():
    return mlenv.require("torch"), mlenv.require("transformers")


@pytest.fixture(scope="module")
def es(ml):
    return mlenv.load_script("extract_smoke")


@pytest.fixture(scope="module")
def models(ml, tmp_path_factory):
    tm = mlenv.load_tiny_models()
    root = tmp_path_factory.mktemp("extract_smoke_models")
    return {
        "llama": tm.build("llama", root / "llama", tokenizer=True),
        "qwen3_next": tm.build("qwen3_next", root / "qwen3_next"),
        "broken": tm.build("llama", root / "broken", nan_layer=1),
        "zero": tm.build("llama", root / "zero", zero_embeddings=True),
    }


def smoke(es, path, *extra):
    args = es.build_parser().parse_args(["--model", str(path), "--backend", "transformers", "--device", "cpu",
                                         "--max-tokens", "16"] + list(extra))
    res = es.run(args)
    json.dumps(res)
    assert set(res) >= {"status", "summary", "findings", "data"}
    assert "\n" not in res["summary"]
    return res


def test_llama_default_layers(es, models):
    res = smoke(es, models["llama"]["path"])
    d = res["data"]
    assert res["status"] == "ok", res["findings"]
    assert d["backend"] == "transformers" and d["num_layers"] == 4
    assert d["hidden_size"] == 32 and isinstance(d["hidden_size"], int)
    assert [l["id"] for l in d["layers"]] == [1, 2, 4]
    tokens = sum(s["tokens"] for s in d["samples"])
    assert len(d["samples"]) == 3 and all(s["seconds"] > 0 for s in d["samples"])
    for l in d["layers"]:
        assert set(l) >= {"id", "shape", "dtype", "finite", "mean", "std"}
        assert l["shape"] == [tokens, 32]
        assert all(s[1] == 32 for s in l["sample_shapes"])
        assert l["dtype"] == "float32" and l["finite"] is True and l["std"] > 0
    # the last layer is HF's hidden_states[N], measured to be the final norm's output
    assert d["final_norm"] == "after" and d["final_norm_verified"] is True
    assert d["last_layer_captured"] is True
    assert d["tokenizer"]["present"] is True and d["tokenizer"]["synthetic_ids"] is False
    assert d["time_per_sample_s"] > 0
    assert res["summary"].startswith("transformers: layers 1,2,4 of 4 captured, hidden 32")


def test_qwen3_next_explicit_layers_without_tokenizer(es, models):
    res = smoke(es, models["qwen3_next"]["path"], "--layers", "0,1,3,4", "--samples", "2")
    d = res["data"]
    assert res["status"] == "ok", res["findings"]
    assert [l["id"] for l in d["layers"]] == [0, 1, 3, 4]
    assert all(l["finite"] and l["std"] > 0 and l["shape"][1] == 32 for l in d["layers"])
    assert d["num_layers"] == 4 and d["hidden_size"] == 32
    assert d["tokenizer"]["synthetic_ids"] is True and "seed" in d["tokenizer"]
    assert len(d["samples"]) == 2
    assert d["model_class"] == "Qwen3NextForCausalLM"


def test_synthetic_ids_are_deterministic(es, models):
    a = smoke(es, models["qwen3_next"]["path"], "--layers", "2", "--samples", "1")["data"]["layers"][0]
    b = smoke(es, models["qwen3_next"]["path"], "--layers", "2", "--samples", "1")["data"]["layers"][0]
    assert a["mean"] == b["mean"] and a["std"] == b["std"]


def test_nan_weights_fail_naming_first_bad_layer(es, models):
    res = smoke(es, models["broken"]["path"])  # NaN in decoder layer 1 -> hidden_states[2] onwards
    d = res["data"]
    assert res["status"] == "fail"
    f = findings_by_code(res)["nonfinite"]
    assert f["level"] == "fail"
    assert "first bad hidden_states id is 2 (output of decoder layer 1)" in f["message"]
    assert "layers 2, 4" in f["message"]
    finite = {l["id"]: l["finite"] for l in d["layers"]}
    assert finite == {1: True, 2: False, 4: False}
    assert d["first_nonfinite"]["id"] == 2
    assert d["final_norm"] == "after"  # still measured (NaN compared equal to NaN)
    assert "nonfinite" in res["summary"]


def test_constant_layers_fail(es, models):
    res = smoke(es, models["zero"]["path"], "--layers", "0,1")
    f = findings_by_code(res)["constant-layer"]
    assert f["level"] == "fail" and "0, 1" in f["message"]
    assert all(l["std"] == 0 for l in res["data"]["layers"])


def test_layer_out_of_range(es, models):
    res = smoke(es, models["llama"]["path"], "--layers", "2,9,-1")
    c = [f for f in res["findings"] if f["code"] == "layer-out-of-range"]
    assert len(c) == 2 and all(f["level"] == "fail" for f in c)
    assert "layer id 9 is out of range" in c[0]["message"] and "0..4" in c[0]["message"]
    assert [l["id"] for l in res["data"]["layers"]] == [2]  # the valid ones are still checked
    assert res["status"] == "fail"


def test_bad_layers_value(es, models):
    res = smoke(es, models["llama"]["path"], "--layers", "2,x")
    assert findings_by_code(res)["bad-layers"]["level"] == "fail"


def test_jsonl_data(es, models, tmp_path):
    data = tmp_path / "samples.jsonl"
    data.write_text('{"text": "hello world"}\nnot json\n{"prompt": "what is a model"}\n{"other": 1}\n'
                    '{"text": "the quick brown fox"}\n')
    res = smoke(es, models["llama"]["path"], "--data", str(data), "--samples", "5")
    d = res["data"]
    assert d["sample_source"] == str(data)
    assert [s["index"] for s in d["samples"]] == [1, 3, 5]  # line numbers
    assert len([f for f in res["findings"] if f["code"] == "data-line-skipped"]) == 2
    assert res["status"] == "warn"


def test_vllm_backend_not_importable_reports_traceback(es, models):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    res = smoke(es, models["llama"]["path"], "--backend", "vllm")
    f = findings_by_code(res)["backend-failed"]
    assert f["level"] == "fail" and "step import" in f["message"]
    assert "ModuleNotFoundError" in f["message"]
    err = res["data"]["error"]
    assert err["step"] == "import" and "Traceback (most recent call last)" in err["traceback"]
    assert res["data"]["backend"] == "vllm"


def test_auto_backend_without_vllm_is_transformers(es, models):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    args = es.build_parser().parse_args(["--model", str(models["llama"]["path"]), "--layers", "4",
                                         "--samples", "1", "--device", "cpu"])
    assert args.backend == "auto"
    res = es.run(args)
    assert res["data"]["backend"] == "transformers" and res["status"] == "ok"


def test_empty_exception_message_is_reported_by_type_and_repr(es, models, ml, monkeypatch):
    _torch, transformers = ml

    class Boom(RuntimeError):
        pass

    def explode(*a, **k):
        raise Boom()

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", explode)
    res = smoke(es, models["llama"]["path"])
    f = findings_by_code(res)["backend-failed"]
    assert "step load-model" in f["message"] and "Boom (empty message)" in f["message"]
    err = res["data"]["error"]
    assert err["type"] == "Boom" and err["message"] == "" and err["repr"] == "Boom()"
    assert "in explode" in err["traceback"] and "raise Boom()" in err["traceback"]
    assert res["status"] == "fail" and "Boom" in res["summary"]


def test_missing_model_path(es, tmp_path):
    res = smoke(es, tmp_path / "nope")
    assert res["status"] == "fail" and findings_by_code(res)["model-not-found"]["level"] == "fail"


def test_directory_without_config_reports_load_config_step(es, tmp_path):
    res = smoke(es, tmp_path)
    f = findings_by_code(res)["backend-failed"]
    assert "step load-config" in f["message"]
    assert "Traceback" in res["data"]["error"]["traceback"]


# ---------------------------------------------------------------- vllm plumbing against a stand-in
# The real vLLM cannot run here (no GPU).  This stand-in implements only the documented surface the
# backend uses (LLM(..., speculative_config=extract_hidden_states, kv_transfer_config=
# ExampleHiddenStatesConnector), generate(), kv_transfer_params["hidden_states_path"],
# example_hidden_states_connector.load_hidden_states) so the backend's plumbing is exercised.

FAKE_VLLM = '''
__version__ = "0.0.0+standin"
CALLS = []


class SamplingParams(object):
    def __init__(self, **kw):
        self.kw = kw


class _Out(object):
    def __init__(self, ids, path):
        self.prompt_token_ids = ids
        self.kv_transfer_params = {"hidden_states_path": path}


class LLM(object):
    def __init__(self, **kw):
        CALLS.append(kw)
        spec = kw["speculative_config"]
        assert spec["method"] == "extract_hidden_states"
        self.layers = spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"]
        self.dir = kw["kv_transfer_config"]["kv_connector_extra_config"]["shared_storage_path"]
        self.n = 0

    def generate(self, prompts, sp):
        import os
        import torch
        outs = []
        for p in prompts:
            ids = p["prompt_token_ids"]
            g = torch.Generator().manual_seed(len(ids))
            hs = torch.randn(len(ids), len(self.layers), 32, generator=g)
            path = os.path.join(self.dir, "req%d.pt" % self.n)
            self.n += 1
            torch.save({"hidden_states": hs, "token_ids": torch.tensor(ids)}, path)
            outs.append(_Out(ids, path))
        return outs
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    root = tmp_path / "fakepkgs"
    pkg = root / "vllm"
    v1 = pkg / "distributed" / "kv_transfer" / "kv_connector" / "v1"
    v1.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_VLLM)
    for d in (pkg / "distributed", pkg / "distributed" / "kv_transfer", v1.parent, v1):
        (d / "__init__.py").touch()
    (v1 / "example_hidden_states_connector.py").write_text(
        "def load_hidden_states(path):\n    import torch\n    return torch.load(path)\n")
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    yield
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def test_vllm_backend_plumbing_with_standin(es, models, fake_vllm):
    args = es.build_parser().parse_args(["--model", str(models["llama"]["path"]), "--max-tokens", "8"])
    res = es.run(args)  # auto picks vllm when importable
    d = res["data"]
    assert d["backend"] == "vllm" and res["status"] == "ok", res["findings"]
    assert d["final_norm"] == "before" and d["final_norm_verified"] is False
    assert "untested" in d["untested_backend"]
    assert [l["id"] for l in d["layers"]] == [1, 2, 4]
    tokens = sum(s["tokens"] for s in d["samples"])
    assert all(l["shape"] == [tokens, 32] and l["finite"] for l in d["layers"])
    assert all(s["tokens"] <= 8 for s in d["samples"])
    import vllm

    kw = vllm.CALLS[-1]
    assert kw["enable_chunked_prefill"] is False
    assert kw["kv_transfer_config"]["kv_connector"] == "ExampleHiddenStatesConnector"
    assert kw["speculative_config"]["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]
    assert res["summary"].endswith("last layer before final norm")

"""extract-smoke: hidden-state extraction smoke test (the EAGLE-3 drafter data path).

Loads the model, prefills a few short samples, captures the chosen layers and
checks each: shape [tokens, hidden], dtype, no NaN/inf, not constant, per-layer
mean/std, time per sample.

Layer ids are HF ``hidden_states`` indices: 0 is the embedding output, i the
output of decoder layer i-1 (what vLLM's EAGLE-3 aux layer id i captures), N
the last layer.  transformers' ``hidden_states[N]`` is taken *after* the final
norm (verified here with a hook on the norm), vLLM's *before* it.

Backends: transformers (tested on CPU with tiny models) and vllm (UNTESTED on a
real vLLM: written against vLLM's documented hidden-state extraction API; its
plumbing is tested against a stand-in module only, until a GPU machine runs it).

Standard library only at import time; torch / transformers / vllm are imported
inside run().  Standalone: ``python3 extract_smoke.py --model DIR``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import sys
import time
import traceback
import warnings

import _remote

DIAGNOSTIC = "extract-smoke"

PROMPTS = (
    "The capital of France is",
    "Write a short Python function that reverses a string.",
    "Explain in one sentence why the sky is blue.",
    "List three prime numbers greater than ten.",
    "Translate 'good morning' into German.",
    "What is the derivative of x squared?",
    "Summarise the plot of Hamlet in two sentences.",
    "A haiku about GPUs:",
)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")
_NORM_NAMES = ("norm", "final_layernorm", "final_layer_norm", "ln_f", "final_norm", "norm_f")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="extract_smoke.py",
        description="Hidden-state extraction smoke test: prefill a few samples, capture the chosen layers "
                    "(HF hidden_states ids: 0 = embeddings, i = output of decoder layer i-1, N = last) and check "
                    "shape, dtype, finiteness, non-constant values and time per sample.")
    p.add_argument("--model", required=True, metavar="PATH", help="model directory (config.json + weights)")
    p.add_argument("--layers", default=None, metavar="IDS",
                   help="comma-separated hidden_states ids, e.g. 2,16,29 (default: 2, N//2, N-3 and N)")
    p.add_argument("--samples", type=int, default=3, metavar="K",
                   help="number of samples: built-in short prompts, or the first K lines of --data (default 3)")
    p.add_argument("--data", default=None, metavar="FILE.jsonl",
                   help="JSONL file on the target, one object per line with a 'text' or 'prompt' field")
    p.add_argument("--backend", choices=("auto", "transformers", "vllm"), default="auto",
                   help="auto: vllm when importable, else transformers (the vllm backend is untested on a "
                        "real GPU so far)")
    p.add_argument("--max-tokens", type=int, default=64, metavar="N",
                   help="truncate every sample to at most N tokens (default 64)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="transformers backend device (auto: cuda when available)")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                   help="auto: the config's dtype on GPU, float32 on CPU")
    p.add_argument("--seed", type=int, default=0, help="seed for synthetic token ids (model without tokenizer)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the checkpoint's own modelling code")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5, metavar="F",
                   help="vllm backend: fraction of GPU memory vLLM may take (default 0.5)")
    return p


# --------------------------------------------------------------------------- helpers

class _Capture(object):
    """Collects warnings and transformers/vllm log records raised inside the block; warnings are re-emitted."""

    def __init__(self):
        self.records = []

    def __enter__(self):
        records = self.records

        class _H(logging.Handler):
            def emit(self, record):
                try:
                    msg = record.getMessage()
                except Exception:  # pragma: no cover
                    msg = str(record.msg)
                records.append({"level": record.levelname, "source": record.name, "message": msg})

        self._handler = _H(level=logging.WARNING)
        for name in ("transformers", "vllm"):
            logging.getLogger(name).addHandler(self._handler)
        self._cm = warnings.catch_warnings(record=True)
        self._warnings = self._cm.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._cm.__exit__(*exc)
        for name in ("transformers", "vllm"):
            logging.getLogger(name).removeHandler(self._handler)
        for w in self._warnings or []:
            self.records.append({"level": "WARNING", "source": "warnings:" + w.category.__name__,
                                 "message": str(w.message)})
            try:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            except Exception:  # pragma: no cover
                pass
        return False


class StepError(Exception):
    """A backend step failed; carries the step name and the original exception + traceback."""

    def __init__(self, step, exc, tb):
        Exception.__init__(self, "%s: %s" % (step, _exc_text(exc)))
        self.step, self.exc, self.tb = step, exc, tb


def _exc_text(e: BaseException) -> str:
    """'Type: message', or 'Type (empty message)' when str() is empty (the classic trap:
    ``raise RuntimeError()``; data.error.repr keeps its repr)."""
    msg = str(e)
    if not msg.strip():
        return "%s (empty message)" % type(e).__name__
    return "%s: %s" % (type(e).__name__, msg)


class _Step(object):
    """``with _Step("load-model"):`` turns any exception into a StepError with its full traceback."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if ev is not None and isinstance(ev, Exception) and not isinstance(ev, StepError):
            raise StepError(self.name, ev, "".join(traceback.format_exception(et, ev, tb)))
        return False


def parse_layers(text):
    ids = []
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        try:
            ids.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError("--layers: %r is not an integer" % part)
    return ids


def default_layers(n):
    """[2, N//2, N-3] plus N, deduplicated, in range, sorted."""
    return sorted(set(i for i in (2, n // 2, n - 3, n) if 0 <= i <= n))


def load_samples(args):
    """[(index, text, source)] and any problems found in --data."""
    k = max(1, int(args.samples))
    problems = []
    if not args.data:
        return [(i, PROMPTS[i % len(PROMPTS)]) for i in range(k)], "built-in", problems
    out = []
    with open(args.data, "r", encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if len(out) >= k:
                break
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                problems.append("line %d: not JSON (%s)" % (lineno, e))
                continue
            text = obj.get("text") if isinstance(obj, dict) else None
            if text is None and isinstance(obj, dict):
                text = obj.get("prompt")
            if not isinstance(text, str) or not text:
                problems.append("line %d: no 'text' or 'prompt' string" % lineno)
                continue
            out.append((lineno, text))
    return out, args.data, problems


def synthetic_ids(text, vocab_size, max_tokens, rng):
    """Deterministic token ids within the vocabulary, about one per 4 characters of the prompt."""
    n = max(4, min(max_tokens, (len(text) + 3) // 4))
    hi = max(2, int(vocab_size)) - 1
    return [rng.randint(1, hi) for _ in range(n)]


def _text_config(config):
    try:
        tc = config.get_text_config(decoder=True)
    except TypeError:
        tc = config.get_text_config()
    except Exception:
        tc = None
    return tc if tc is not None else config


def _has_tokenizer(path):
    return os.path.isdir(path) and any(os.path.exists(os.path.join(path, f)) for f in _TOKENIZER_FILES)


def _worst(findings):
    return _remote.worst_status(findings)


class _Stats(object):
    """Running per-layer statistics over all samples (float64 sums)."""

    def __init__(self, lid):
        self.id = lid
        self.n = 0
        self.s = 0.0
        self.ss = 0.0
        self.finite = True
        self.constant_samples = []
        self.nonfinite_samples = []
        self.shapes = []
        self.dtype = None
        self.shape_errors = []

    def add(self, sample_index, h, hidden_size):
        import torch

        self.dtype = str(h.dtype).replace("torch.", "")
        shape = list(h.shape)
        self.shapes.append(shape)
        if len(shape) != 2 or (hidden_size and shape[1] != hidden_size):
            self.shape_errors.append("sample %s: shape %s, expected [tokens, %s]" % (sample_index, shape, hidden_size))
        x = h.detach().to(torch.float64)
        fin = bool(torch.isfinite(x).all().item())
        if not fin:
            self.finite = False
            self.nonfinite_samples.append(sample_index)
            x = x[torch.isfinite(x)]
        if x.numel():
            self.n += x.numel()
            self.s += float(x.sum().item())
            self.ss += float((x * x).sum().item())
            std = float(x.std(unbiased=False).item()) if x.numel() > 1 else 0.0
            if std == 0.0:
                self.constant_samples.append(sample_index)
        elif fin:
            self.constant_samples.append(sample_index)

    def to_dict(self):
        mean = self.s / self.n if self.n else None
        std = math.sqrt(max(0.0, self.ss / self.n - mean * mean)) if self.n else None
        tokens = sum(s[0] for s in self.shapes if s)
        width = self.shapes[0][1] if self.shapes and len(self.shapes[0]) > 1 else None
        return {"id": self.id, "shape": [tokens, width], "dtype": self.dtype, "finite": self.finite,
                "mean": None if mean is None else round(mean, 6), "std": None if std is None else round(std, 6),
                "constant": bool(self.constant_samples), "sample_shapes": self.shapes,
                "nonfinite_samples": self.nonfinite_samples}


# --------------------------------------------------------------------------- backends

def _final_norm_module(model, n_layers):
    """The final norm of the decoder stack: a sibling of the `layers` ModuleList of length N."""
    for _name, mod in model.named_modules():
        layers = getattr(mod, "layers", None)
        if layers is None or not hasattr(layers, "__len__") or len(layers) != n_layers:
            continue
        for nn in _NORM_NAMES:
            norm = getattr(mod, nn, None)
            if norm is not None and hasattr(norm, "register_forward_hook"):
                return nn, norm
    return None, None


def _same(torch, a, b):
    """Exact equality that treats NaN == NaN (a broken model still tells where its norm is)."""
    if a is None or b is None or a.shape != b.shape:
        return False
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all().item())


def run_transformers(args, model_path, layer_ids, samples, n_layers, hidden_size, text_cfg, data):
    """Prefill every sample with output_hidden_states=True; returns (per-layer stats, per-sample rows)."""
    with _Step("import"):
        import torch
        import transformers
    data["versions"]["torch"] = torch.__version__
    data["versions"]["transformers"] = transformers.__version__

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.dtype != "auto":
        dtype = getattr(torch, args.dtype)
    elif device == "cpu":
        dtype = torch.float32
    else:
        cd = getattr(text_cfg, "dtype", None) or getattr(text_cfg, "torch_dtype", None)
        dtype = getattr(torch, cd) if isinstance(cd, str) else (cd or torch.float32)
    data["device"] = device
    data["load_dtype"] = str(dtype).replace("torch.", "")

    tok = None
    data["tokenizer"] = {"present": _has_tokenizer(model_path), "synthetic_ids": False}
    if data["tokenizer"]["present"]:
        with _Step("load-tokenizer"):
            tok = transformers.AutoTokenizer.from_pretrained(model_path, trust_remote_code=args.trust_remote_code)
        data["tokenizer"]["class"] = type(tok).__name__
    else:
        data["tokenizer"].update({"synthetic_ids": True, "seed": args.seed,
                                  "note": "no tokenizer files in the model directory: token ids are seeded "
                                          "random integers within the vocabulary"})

    major_minor = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
    dtype_kw = "dtype" if major_minor >= (4, 56) else "torch_dtype"
    load_kw = {dtype_kw: dtype, "trust_remote_code": args.trust_remote_code}
    if device == "cuda":
        # straight onto the GPU(s) (a large checkpoint would not fit a CPU detour); needs accelerate on 4.x
        load_kw["device_map"] = "auto"
    model = None
    errors = []
    with _Step("load-model"):
        t0 = time.perf_counter()
        for auto_name in ("AutoModelForCausalLM", "AutoModelForImageTextToText", "AutoModel"):
            auto = getattr(transformers, auto_name, None)
            if auto is None:
                continue
            try:
                try:
                    model = auto.from_pretrained(model_path, **load_kw)
                except (ImportError, ValueError) as e:
                    if "device_map" not in load_kw or "accelerate" not in str(e).lower():
                        raise
                    load_kw.pop("device_map")
                    data["device_map_fallback"] = _exc_text(e)
                    model = auto.from_pretrained(model_path, **load_kw)
                data["model_class"] = type(model).__name__
                data["loaded_with"] = auto_name
                break
            except ValueError as e:  # "Unrecognized configuration class" -> try the next Auto class
                if "Unrecognized configuration class" not in str(e):
                    raise
                errors.append(_exc_text(e))
        if model is None:
            raise ValueError("no Auto class loads this checkpoint: " + " | ".join(errors))
        if "device_map" not in load_kw:
            model.to(device)
        data["device_map"] = load_kw.get("device_map")
        model.eval()
        data["load_s"] = round(time.perf_counter() - t0, 3)

    norm_name, norm = _final_norm_module(model, n_layers)
    seen = {}

    def hook(_m, inputs, output):
        if "out" not in seen:
            seen["in"] = inputs[0].detach() if inputs else None
            seen["out"] = (output[0] if isinstance(output, tuple) else output).detach()

    handle = norm.register_forward_hook(hook) if norm is not None else None

    stats = dict((lid, _Stats(lid)) for lid in layer_ids)
    rows = []
    first_bad = None
    final_norm = None
    rng = random.Random(args.seed)
    vocab = getattr(text_cfg, "vocab_size", None) or 32000
    try:
        for index, text in samples:
            with _Step("tokenize"):
                if tok is not None:
                    enc = tok(text, return_tensors="pt", truncation=True, max_length=args.max_tokens)
                    ids = enc["input_ids"]
                else:
                    ids = torch.tensor([synthetic_ids(text, vocab, args.max_tokens, rng)], dtype=torch.long)
                ids = ids.to(model.get_input_embeddings().weight.device)
            with _Step("forward"):
                seen.clear()
                if device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                with torch.inference_mode():
                    out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
                if device == "cuda":
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t0
            hs = getattr(out, "hidden_states", None)
            if hs is None:
                raise StepError("forward", RuntimeError("the model returned no hidden_states"), "")
            if len(hs) != n_layers + 1:
                data.setdefault("hidden_states_count_mismatch", []).append(len(hs))
            rows.append({"index": index, "tokens": int(ids.shape[1]), "seconds": round(dt, 4)})
            for lid in layer_ids:
                if lid < len(hs):
                    stats[lid].add(index, hs[lid][0], hidden_size)
            if first_bad is None:
                for i, h in enumerate(hs):
                    if not bool(torch.isfinite(h).all().item()):
                        first_bad = {"id": i, "sample": index}
                        break
            if final_norm is None and "out" in seen and len(hs) > n_layers:
                last = hs[n_layers]
                if _same(torch, seen["out"], last):
                    final_norm = "after"
                elif _same(torch, seen.get("in"), last):
                    final_norm = "before"
                else:
                    final_norm = "unknown"
    finally:
        if handle is not None:
            handle.remove()
    data["final_norm"] = final_norm or "after"
    data["final_norm_verified"] = final_norm in ("after", "before")
    data["final_norm_module"] = norm_name
    data["first_nonfinite"] = first_bad
    return stats, rows


def run_vllm(args, model_path, layer_ids, samples, n_layers, hidden_size, text_cfg, data):
    """UNTESTED: written against vLLM's documented hidden-state extraction API, never run on a GPU yet.

    Follows docs/features/speculative_decoding/extract_hidden_states.md of vLLM: the
    ``extract_hidden_states`` speculative method with ``eagle_aux_hidden_state_layer_ids`` and the
    ``ExampleHiddenStatesConnector`` KV connector, which writes one safetensors file per request
    (``hidden_states`` [tokens, num_layers, hidden], ``token_ids`` [tokens]) and returns its path in
    ``output.kv_transfer_params["hidden_states_path"]``.  Layer id N is the last layer's output
    *before* the final norm (vLLM's note).  Needs a GPU and a vLLM with that feature; mark the
    README as untested until a GPU machine has run it.
    """
    import shutil
    import tempfile

    with _Step("import"):
        import vllm
        from vllm import LLM, SamplingParams
    data["versions"]["vllm"] = getattr(vllm, "__version__", None)
    try:
        import torch

        data["versions"]["torch"] = torch.__version__
    except Exception:  # pragma: no cover
        torch = None
    try:  # documented reader (handles the writer's file lock); plain safetensors as a fallback
        from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector as _hsc

        load_hidden_states = _hsc.load_hidden_states
    except Exception:
        load_hidden_states = None

    has_tok = _has_tokenizer(model_path)
    data["tokenizer"] = {"present": has_tok, "synthetic_ids": not has_tok}
    if not has_tok:
        data["tokenizer"].update({"seed": args.seed, "note": "no tokenizer files: seeded random token ids"})
    data["device"] = "cuda"
    data["untested_backend"] = ("untested: the vllm backend follows vLLM's documented extract_hidden_states "
                                "API but has not been run on a real GPU by mldiag's tests yet")
    tmp = tempfile.mkdtemp(prefix="mldiag-hs-")
    stats = dict((lid, _Stats(lid)) for lid in layer_ids)
    rows = []
    first_bad = None
    try:
        with _Step("load-model"):
            t0 = time.perf_counter()
            llm = LLM(
                model=model_path,
                trust_remote_code=args.trust_remote_code,
                skip_tokenizer_init=not has_tok,
                enforce_eager=True,
                enable_chunked_prefill=False,  # required by the hidden-states connector
                max_model_len=max(128, args.max_tokens + 16),
                gpu_memory_utilization=args.gpu_memory_utilization,
                dtype="auto" if args.dtype == "auto" else args.dtype,
                speculative_config={
                    "method": "extract_hidden_states",
                    "num_speculative_tokens": 1,
                    "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}},
                },
                kv_transfer_config={
                    "kv_connector": "ExampleHiddenStatesConnector",
                    "kv_role": "kv_producer",
                    "kv_connector_extra_config": {"shared_storage_path": tmp},
                },
            )
            data["load_s"] = round(time.perf_counter() - t0, 3)
            data["model_class"] = "vllm.LLM"
        rng = random.Random(args.seed)
        vocab = getattr(text_cfg, "vocab_size", None) or 32000
        tok = None
        if has_tok:
            # tokenize here (same tokenizer as the transformers backend) and truncate to --max-tokens,
            # so the prompt reaches vLLM as token ids whatever its truncation options are called
            with _Step("load-tokenizer"):
                import transformers

                tok = transformers.AutoTokenizer.from_pretrained(model_path,
                                                                 trust_remote_code=args.trust_remote_code)
        for index, text in samples:
            with _Step("generate"):
                sp = SamplingParams(max_tokens=1, detokenize=False)
                if tok is not None:
                    ids = list(tok(text, truncation=True, max_length=args.max_tokens)["input_ids"])
                else:
                    ids = synthetic_ids(text, vocab, args.max_tokens, rng)
                prompt = {"prompt_token_ids": ids}
                t0 = time.perf_counter()
                outputs = llm.generate([prompt], sp)
                dt = time.perf_counter() - t0
            with _Step("read-hidden-states"):
                out = outputs[0]
                path = (out.kv_transfer_params or {}).get("hidden_states_path")
                if not path:
                    raise RuntimeError("vLLM returned no hidden_states_path in kv_transfer_params: %r"
                                       % (out.kv_transfer_params,))
                if load_hidden_states is not None:
                    obj = load_hidden_states(path)
                else:
                    from safetensors.torch import load_file

                    obj = load_file(path)
                hs = obj["hidden_states"]  # [tokens, num_layers, hidden]
            rows.append({"index": index, "tokens": int(hs.shape[0]), "seconds": round(dt, 4)})
            if hs.dim() != 3 or hs.shape[1] != len(layer_ids):
                raise StepError("read-hidden-states",
                                ValueError("hidden_states shape %s, expected [tokens, %d, %s]"
                                           % (list(hs.shape), len(layer_ids), hidden_size)), "")
            for j, lid in enumerate(layer_ids):
                h = hs[:, j, :]
                stats[lid].add(index, h, hidden_size)
                if first_bad is None and torch is not None and not bool(torch.isfinite(h).all().item()):
                    first_bad = {"id": lid, "sample": index}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    data["final_norm"] = "before"
    data["final_norm_verified"] = False  # from vLLM's documentation, not measured
    data["first_nonfinite"] = first_bad
    return stats, rows


# --------------------------------------------------------------------------- run

def _looks_like_path(model):
    """A filesystem path rather than a hub id ('org/name' has exactly one slash)."""
    return model.startswith(("/", "./", "../", "~")) or model.count("/") >= 2


def _vllm_importable():
    import importlib.util

    try:
        return importlib.util.find_spec("vllm") is not None
    except Exception:
        return False


def run(args) -> dict:
    findings = []
    if args.model.startswith("~"):
        args.model = os.path.expanduser(args.model)

    def finding(level, code, message, hint=None):
        f = {"level": level, "code": code, "message": message}
        if hint:
            f["hint"] = hint
        findings.append(f)

    data = {"model": args.model, "versions": {"python": sys.version.split()[0]}, "backend": None,
            "layers": [], "hidden_size": None, "num_layers": None, "samples": []}

    backend = args.backend
    if backend == "auto":
        backend = "vllm" if _vllm_importable() else "transformers"
        data["backend_choice"] = "auto"
    data["backend"] = backend

    capture = _Capture()
    stats, rows = {}, []
    if _looks_like_path(args.model) and not os.path.isdir(args.model):
        what = "is not a directory" if os.path.exists(args.model) else "does not exist"
        finding("fail", "model-not-found", "model path %s %s on this target" % (args.model, what),
                "pass --model with the directory that holds config.json and the weights")
        return {"status": "fail", "summary": "model path %s %s" % (args.model, what), "findings": findings,
                "data": data}
    with capture:
        try:
            with _Step("import"):
                import transformers
            with _Step("load-config"):
                config = transformers.AutoConfig.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
            text_cfg = _text_config(config)
            n = getattr(text_cfg, "num_hidden_layers", None)
            hidden = getattr(text_cfg, "hidden_size", None)
            data["num_layers"] = int(n) if n is not None else None
            data["hidden_size"] = int(hidden) if hidden is not None else None
            data["config_class"] = type(config).__name__
            data["model_type"] = getattr(config, "model_type", None)
            if n is None:
                raise StepError("load-config", ValueError("config has no num_hidden_layers"), "")
            n = int(n)

            requested = None
            if args.layers:
                try:
                    requested = parse_layers(args.layers)
                except argparse.ArgumentTypeError as e:
                    finding("fail", "bad-layers", "%s (expected comma-separated integers, e.g. 2,16,29)" % e)
                    requested = []
            if requested is not None:
                bad = [i for i in requested if i < 0 or i > n]
                layer_ids = sorted(set(i for i in requested if 0 <= i <= n))
                for i in bad:
                    finding("fail", "layer-out-of-range",
                            "layer id %d is out of range: this model has %d decoder layers, valid hidden_states "
                            "ids are 0..%d (0 = embeddings, i = output of decoder layer i-1, %d = last layer)"
                            % (i, n, n, n))
                data["layers_requested"] = requested
            else:
                layer_ids = default_layers(n)
                data["layers_requested"] = "default [2, N//2, N-3, N]"
            data["layer_ids"] = layer_ids

            samples, source, problems = load_samples(args)
            data["sample_source"] = source
            for p in problems[:20]:
                finding("warn", "data-line-skipped", "%s: %s" % (args.data, p))
            if not samples:
                finding("fail", "no-samples", "no usable sample (a 'text' or 'prompt' field per line) in %s"
                        % args.data)
            elif layer_ids:
                runner = run_vllm if backend == "vllm" else run_transformers
                stats, rows = runner(args, args.model, layer_ids, samples, n, data["hidden_size"], text_cfg, data)
        except StepError as e:
            data["error"] = {"step": e.step, "type": type(e.exc).__name__, "message": str(e.exc),
                             "repr": repr(e.exc), "traceback": e.tb}
            finding("fail", "backend-failed", "%s backend, step %s: %s" % (backend, e.step, _exc_text(e.exc)),
                    _failure_hint(backend, e.step, e.exc))
    data["log"] = capture.records
    data["samples"] = rows
    data["layers"] = [stats[lid].to_dict() for lid in sorted(stats)] if rows else []
    if rows:
        secs = [r["seconds"] for r in rows]
        data["time_per_sample_s"] = round(sum(secs) / len(secs), 4)
        data["tokens_per_sample"] = round(sum(r["tokens"] for r in rows) / float(len(rows)), 1)
    n = data.get("num_layers")
    data["last_layer_captured"] = bool(n is not None and any(l["id"] == n for l in data["layers"]))
    if data.get("hidden_states_count_mismatch"):
        finding("warn", "hidden-states-count",
                "the model returned %s hidden states, expected N+1 = %s" % (data["hidden_states_count_mismatch"][0],
                                                                            (n or 0) + 1))
    if data.get("final_norm") == "unknown":
        finding("warn", "final-norm-unverified",
                "hidden_states[%s] matches neither the input nor the output of the final norm (%s)"
                % (n, data.get("final_norm_module")))

    # per-layer verdicts
    nonfinite = [l for l in data["layers"] if not l["finite"]]
    if nonfinite:
        fb = data.get("first_nonfinite")
        where = ""
        if fb is not None:
            where = ("; first bad hidden_states id is %d (%s), sample %s"
                     % (fb["id"], "embeddings" if fb["id"] == 0 else "output of decoder layer %d" % (fb["id"] - 1),
                        fb["sample"]))
        finding("fail", "nonfinite",
                "NaN/inf in layer%s %s of %d captured%s"
                % ("s" if len(nonfinite) > 1 else "", ", ".join(str(l["id"]) for l in nonfinite),
                   len(data["layers"]), where),
                "check the weights of the first bad layer (a bad shard, an overflow in float16) and the input ids")
    constant = [l for l in data["layers"] if l["constant"] and l["finite"]]
    if constant:
        finding("fail", "constant-layer", "layer%s %s captured constant values (std 0)"
                % ("s" if len(constant) > 1 else "", ", ".join(str(l["id"]) for l in constant)),
                "constant hidden states usually mean zeroed weights or a wrong layer hook")
    for l in data["layers"]:
        for s in stats[l["id"]].shape_errors:
            finding("fail", "bad-shape", "layer %d: %s" % (l["id"], s))
    slow = [r["message"] for r in capture.records
            if "falling back" in r["message"].lower() or "fast path" in r["message"].lower()]
    if slow:
        data["slow_path_warnings"] = slow

    status = _worst(findings)
    return {"status": status, "summary": _summary(data, findings), "findings": findings, "data": data}


def _failure_hint(backend, step, exc):
    if step == "import":
        return "%s is not importable in this environment" % backend
    if isinstance(exc, (MemoryError,)) or "out of memory" in str(exc).lower():
        return "not enough memory: fewer --max-tokens, --dtype bfloat16, or a GPU"
    if step == "load-config":
        return "--model must be a model directory whose config.json transformers can read"
    # NOTE: no "see the traceback" hint: the table shows data.error.traceback under the row
    return None


def _summary(data, findings):
    backend = data.get("backend")
    if data.get("error"):
        err = data["error"]
        what = ("%s: %s" % (err["type"], err["message"][:200]) if err["message"].strip()
                else "%s (empty message)" % err["type"])
        return "%s backend failed at %s: %s" % (backend, err["step"], what)
    if not data["layers"]:
        top = findings[0]["message"] if findings else "nothing captured"
        return "%s: %s" % (backend, top)
    ids = ",".join(str(l["id"]) for l in data["layers"])
    bad = [f for f in findings if f["level"] in ("fail", "error")]
    verdict = bad[0]["code"] if bad else "finite, non-constant"
    return ("%s: layers %s of %s captured, hidden %s, %s; %d samples, %.3fs/sample, last layer %s final norm"
            % (backend, ids, data.get("num_layers"), data.get("hidden_size"), verdict, len(data["samples"]),
               data.get("time_per_sample_s") or 0.0, data.get("final_norm")))


def main(argv=None):
    result = run(build_parser().parse_args(argv))
    print(json.dumps(result, indent=2, default=str))
    return _remote.exit_code(result)


if __name__ == "__main__":
    sys.exit(main())

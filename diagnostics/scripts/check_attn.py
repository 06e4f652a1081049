"""check-attn: which attention implementation a model will really run.

Reads the checkpoint's config (no weights), records the *requested*
``_attn_implementation`` at every config level before anything is built
(building writes the resolved value into the config object it was given),
then builds a skeleton of the checkpoint's own class on the meta device and
reads the *resolved* implementation from every attention module.  Also
reports layer types (full vs linear attention), whether the fast kernels
(flash-attn, flash-linear-attention, causal-conv1d) are installed /
importable / usable here, the torch SDPA backends, and the versions.

Standard library only at import time; torch and transformers are imported
inside run().  Runs standalone: ``python3 check_attn.py --model DIR``.
Works with transformers 4.4x/4.5x and 5.x (see the notes in run()).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import logging
import os
import re
import sys
import traceback
import warnings

import _remote

DIAGNOSTIC = "check-attn"

# (report name, distributions to look up, import name, transformers availability helper)
KERNELS = (
    ("flash-attn", ("flash-attn", "flash_attn"), "flash_attn", "is_flash_attn_2_available"),
    ("flash-attn-3", ("flash-attn-3", "flash_attn_3"), "flash_attn_interface", "is_flash_attn_3_available"),
    ("flash-linear-attention", ("flash-linear-attention", "fla-core"), "fla",
     "is_flash_linear_attention_available"),
    ("causal-conv1d", ("causal-conv1d", "causal_conv1d"), "causal_conv1d", "is_causal_conv1d_available"),
)

# Module class names that are token mixers other than softmax attention.
_LINEAR_CLASS_RE = re.compile(r"(GatedDeltaNet|DeltaNet|LinearAttention|LinearAttn|Lightning\w*Attention)")
_ATTN_CLASS_RE = re.compile(r"(Attention\d?|Attn)$")
_NOT_ATTN_RE = re.compile(r"(Rotary|Norm|Embedding|Pool|Bias|Mask|Output$)")
_LINEAR_LAYER_TYPES = ("linear_attention",)
_FLASH_RE = re.compile(r"flash", re.I)
_FAST_PATH_HINT = ("fast path", "falling back", "fall back", "slower", "much slower", "not installed")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="check_attn.py",
        description="Report requested vs resolved attention implementation of a model "
                    "(skeleton built on the meta device: no weights are read), layer types, "
                    "fast-kernel availability and SDPA backends.")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="model directory (or hub id already in the local cache) holding config.json")
    p.add_argument("--attn-implementation", default=None, metavar="IMPL",
                   help="request this implementation (eager, sdpa, flash_attention_2, flex_attention, ...) "
                        "instead of what the config asks for")
    p.add_argument("--model-class", default=None, metavar="NAME",
                   help="build this transformers class instead of the checkpoint's architectures "
                        "(e.g. what the training code uses: Qwen3_5ForCausalLM)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow the checkpoint's own modelling code (auto_map)")
    return p


# --------------------------------------------------------------------------- helpers

class _Capture(object):
    """Collects warnings and transformers log records raised inside the block.

    Warnings are re-emitted afterwards so that the runtime's own recorder still
    sees them; log records propagate as usual (the handler is only added).
    """

    def __init__(self):
        self.records = []
        self._handler = None
        self._cm = None
        self._warnings = None

    def __enter__(self):
        records = self.records

        class _H(logging.Handler):
            def emit(self, record):
                try:
                    msg = record.getMessage()
                except Exception:  # pragma: no cover - broken format args
                    msg = str(record.msg)
                records.append({"level": record.levelname, "source": record.name, "message": msg})

        self._handler = _H(level=logging.DEBUG)
        logging.getLogger("transformers").addHandler(self._handler)
        self._cm = warnings.catch_warnings(record=True)
        self._warnings = self._cm.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._cm.__exit__(*exc)
        logging.getLogger("transformers").removeHandler(self._handler)
        for w in self._warnings or []:
            self.records.append({"level": "WARNING", "source": "warnings:" + w.category.__name__,
                                 "message": str(w.message)})
            try:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            except Exception:  # pragma: no cover - e.g. filter set to "error"
                pass
        return False


def _exc_text(e: BaseException) -> str:
    """'Type: message', with repr() when str() is empty (the classic empty-message trap)."""
    msg = str(e)
    if not msg.strip():
        msg = repr(e)
    return "%s: %s" % (type(e).__name__, msg)


def _dist_version(names):
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover - Python < 3.8
        return None, None
    for n in names:
        try:
            return n, metadata.version(n)
        except Exception:
            continue
    return None, None


def _kernel_status(tf_import_utils):
    out = {}
    for name, dists, module, helper in KERNELS:
        dist, ver = _dist_version(dists)
        entry = {"module": module, "distribution": dist, "version": ver, "installed": ver is not None,
                 "importable": False, "import_error": None, "usable": None}
        try:
            importlib.import_module(module)
            entry["importable"] = True
        except Exception as e:
            entry["import_error"] = _exc_text(e)
        fn = getattr(tf_import_utils, helper, None) if tf_import_utils is not None else None
        if fn is not None:
            try:
                entry["usable"] = bool(fn())
            except Exception as e:
                entry["usable"] = False
                entry["usable_error"] = _exc_text(e)
        out[name] = entry
    return out


def _sdpa_status(torch):
    out = {}
    cuda_be = getattr(getattr(torch, "backends", None), "cuda", None)
    for key, fn in (("flash", "flash_sdp_enabled"), ("mem_efficient", "mem_efficient_sdp_enabled"),
                    ("math", "math_sdp_enabled"), ("cudnn", "cudnn_sdp_enabled")):
        f = getattr(cuda_be, fn, None)
        try:
            out[key] = bool(f()) if f is not None else None
        except Exception:
            out[key] = None
    f = getattr(cuda_be, "is_flash_attention_available", None)
    try:
        out["flash_available"] = bool(f()) if f is not None else None
    except Exception:
        out["flash_available"] = None
    return out


def _cuda_status(torch):
    info = {"available": False, "device_count": 0, "cuda_version": getattr(torch.version, "cuda", None),
            "devices": []}
    try:
        info["available"] = bool(torch.cuda.is_available())
        if info["available"]:
            info["device_count"] = torch.cuda.device_count()
            for i in range(info["device_count"]):
                cap = torch.cuda.get_device_capability(i)
                info["devices"].append({"index": i, "name": torch.cuda.get_device_name(i),
                                        "capability": "%d.%d" % cap})
    except Exception as e:
        info["error"] = _exc_text(e)
    return info


_MISSING = object()


def _requested_of(cfg):
    """The raw request stored on a config object, read without triggering any default.

    4.3x-4.46: the ``_attn_implementation`` property answers "eager" when nothing is set;
    4.47+/5.x answer None.  The private ``_attn_implementation_internal`` is the request itself.
    """
    raw = cfg.__dict__.get("_attn_implementation_internal", _MISSING)
    try:
        prop = getattr(cfg, "_attn_implementation", None)
    except Exception:
        prop = None
    if isinstance(prop, dict):
        prop = dict(prop)
    return (None if raw is _MISSING else raw), prop


def _config_levels(config):
    """[(path, config)] for the config and all its sub-configs, depth first."""
    out = []
    seen = set()

    def walk(cfg, path):
        if id(cfg) in seen:
            return
        seen.add(id(cfg))
        out.append((path, cfg))
        keys = list(getattr(cfg, "sub_configs", None) or {})
        for k in keys:
            sub = getattr(cfg, k, None)
            if sub is not None and hasattr(sub, "to_dict"):
                walk(sub, k if not path else path + "." + k)

    walk(config, "")
    return out


def _family(class_name):
    """'Qwen3_5ForConditionalGeneration' -> 'Qwen3_5', 'Qwen3_5TextModel' -> 'Qwen3_5'."""
    n = class_name
    m = re.match(r"^(.*?)For[A-Z]\w*$", n)
    if m:
        n = m.group(1)
    for suffix in ("PreTrainedModel", "Model", "LMHead", "Text", "Language"):
        if n.endswith(suffix) and len(n) > len(suffix):
            n = n[: -len(suffix)]
    return n.rstrip("_")


def _text_config(config):
    try:
        tc = config.get_text_config(decoder=True)
    except TypeError:
        tc = config.get_text_config()
    except Exception:
        tc = config
    return tc if tc is not None else config


def _layer_types(text_cfg):
    n = getattr(text_cfg, "num_hidden_layers", None)
    lt = getattr(text_cfg, "layer_types", None)
    if isinstance(lt, (list, tuple)) and lt:
        return list(lt), "layer_types"
    interval = getattr(text_cfg, "full_attention_interval", None)
    if isinstance(n, int) and isinstance(interval, int) and interval > 0:
        return (["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)],
                "full_attention_interval")
    if isinstance(n, int):
        return ["full_attention"] * n, "assumed (no layer_types in config)"
    return [], "unknown"


def _is_linear_module(mod):
    return bool(_LINEAR_CLASS_RE.search(type(mod).__name__))


def _is_attention_module(mod):
    cn = type(mod).__name__
    if _is_linear_module(mod):
        return False
    return bool(_ATTN_CLASS_RE.search(cn)) and not _NOT_ATTN_RE.search(cn)


def _linear_fast_path(module_classes):
    """What the installed transformers decided for the linear-attention kernels, per module class.

    4.5x: the modelling module exposes ``is_fast_path_available`` (needs fla + causal-conv1d + CUDA).
    5.x: each kernel function is wrapped by ``use_kernel_func_from_hub_with_fallback``, which binds the
    package implementation at import time, or the torch reference when the package is missing; the
    choice sits in the wrapper's closure (``is_new_implementation``).
    """
    out = {}
    for cls in module_classes:
        mod = sys.modules.get(cls.__module__)
        if mod is None:
            continue
        info = {"module": cls.__module__}
        flag = getattr(mod, "is_fast_path_available", None)
        if isinstance(flag, bool):
            info["is_fast_path_available"] = flag
        kernels = {}
        for name, obj in sorted(vars(mod).items()):
            code = getattr(obj, "__code__", None)
            if code is None or "is_new_implementation" not in code.co_freevars or not obj.__closure__:
                continue
            try:
                cells = dict(zip(code.co_freevars, [c.cell_contents for c in obj.__closure__]))
            except ValueError:  # empty cell
                continue
            kernels[name] = {"package": cells.get("package"),
                             "kernel": bool(cells.get("is_new_implementation"))}
        if kernels:
            info["functions"] = kernels
        out[cls.__name__] = info
    return out


def _pick_class(transformers, config, args):
    """(class or Auto class, how it was chosen, from_config style) — architectures first."""
    if args.model_class:
        cls = getattr(transformers, args.model_class, None)
        if cls is None:
            raise ValueError("--model-class %s: no such class in transformers %s"
                             % (args.model_class, transformers.__version__))
        return cls, "--model-class", "class", []
    missing = []
    for name in list(getattr(config, "architectures", None) or []):
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls, "architectures", "class", missing
        missing.append(name)
    auto_map = getattr(config, "auto_map", None) or {}
    for auto_name in ("AutoModelForCausalLM", "AutoModelForImageTextToText", "AutoModel"):
        auto = getattr(transformers, auto_name, None)
        if auto is None:
            continue
        mapping = getattr(auto, "_model_mapping", None)
        known = False
        try:
            known = mapping is not None and type(config) in mapping
        except Exception:
            known = False
        if known or (args.trust_remote_code and auto_name in auto_map):
            return auto, "auto:" + auto_name, "auto", missing
    raise ValueError("no model class for config %s (model_type %r): architectures %r not in transformers %s "
                     "and no Auto mapping matches" % (type(config).__name__, getattr(config, "model_type", None),
                                                      getattr(config, "architectures", None),
                                                      transformers.__version__))


def _build_on_meta(torch, cls, style, config, attn, trust_remote_code):
    cfg = copy.deepcopy(config)
    kwargs = {}
    if attn is not None:
        kwargs["attn_implementation"] = attn
        try:  # 4.4x ignores the kwarg when the config already carries a value
            cfg._attn_implementation = attn
        except Exception:
            pass
    if style == "auto":
        if trust_remote_code:
            kwargs["trust_remote_code"] = True
        builder = cls.from_config
    else:
        config_class = getattr(cls, "config_class", None)
        if config_class is not None and not isinstance(cfg, config_class):
            # e.g. --model-class Qwen3_5ForCausalLM on a composite checkpoint: build from its text config
            tc = _text_config(cfg)
            if isinstance(tc, config_class):
                cfg = tc
        builder = getattr(cls, "_from_config", None) or cls
    with torch.device("meta"):
        model = builder(cfg, **kwargs)
    return model


def _resolved(model):
    """Per attention module: the implementation its config resolved to."""
    import transformers

    ptm = transformers.PreTrainedModel
    named = list(model.named_modules())
    owners = {}  # module path -> (PreTrainedModel class name, config)
    for name, mod in named:
        if isinstance(mod, ptm):
            owners[name] = (type(mod).__name__, mod.config)

    def owner_of(name):
        parts = name.split(".")
        for i in range(len(parts), -1, -1):
            key = ".".join(parts[:i])
            if key in owners:
                return owners[key]
        return owners.get("", (type(model).__name__, model.config))

    attn, linear = [], []
    attn_names = [n for n, m in named if _is_attention_module(m)]
    attn_set = set(attn_names)
    for name, mod in named:
        if _is_linear_module(mod):
            linear.append({"name": name, "class": type(mod).__name__, "layer_idx": getattr(mod, "layer_idx", None),
                           "owner": owner_of(name)[0]})
            continue
        if name not in attn_set:
            continue
        # keep only innermost attention modules (BertAttention wraps BertSelfAttention)
        if any(o.startswith(name + ".") for o in attn_set):
            continue
        owner_cls, owner_cfg = owner_of(name)
        cfg = getattr(mod, "config", None)
        source = "module.config"
        if cfg is None or not hasattr(cfg, "_attn_implementation"):
            cfg, source = owner_cfg, "model.config"
        try:
            impl = cfg._attn_implementation
        except Exception as e:  # pragma: no cover
            impl = "unknown (%s)" % _exc_text(e)
        attn.append({"name": name, "class": type(mod).__name__, "implementation": impl,
                     "layer_idx": getattr(mod, "layer_idx", None), "owner": owner_cls, "source": source})
    return attn, linear


def _count(items, key):
    out = {}
    for it in items:
        out[str(it[key])] = out.get(str(it[key]), 0) + 1
    return out


def _worst(findings):
    return _remote.worst_status(findings)


# --------------------------------------------------------------------------- run

def run(args) -> dict:
    findings = []
    if args.model.startswith("~"):
        args.model = os.path.expanduser(args.model)
    data = {"model": {"path": args.model}}

    def finding(level, code, message, hint=None):
        f = {"level": level, "code": code, "message": message}
        if hint:
            f["hint"] = hint
        findings.append(f)

    try:
        import torch
        import transformers
    except Exception as e:
        data["versions"] = {"python": sys.version.split()[0], "executable": sys.executable}
        data["error"] = {"step": "import", "type": type(e).__name__, "message": _exc_text(e),
                         "traceback": traceback.format_exc()}
        finding("fail", "import-failed", "cannot import torch/transformers with %s: %s"
                % (sys.executable, _exc_text(e)), "install torch and transformers in this environment "
                "(or point the target's python: at the right venv)")
        return {"status": "fail", "summary": "import failed: %s" % _exc_text(e), "findings": findings,
                "data": data}
    try:
        from transformers.utils import import_utils as tf_import_utils
    except Exception:  # pragma: no cover
        tf_import_utils = None

    data["versions"] = {"python": sys.version.split()[0], "torch": torch.__version__,
                        "transformers": transformers.__version__}
    cuda = _cuda_status(torch)
    data["cuda"] = cuda
    data["sdpa_backends"] = _sdpa_status(torch)

    if _looks_like_path(args.model) and not os.path.isdir(args.model):
        what = "is not a directory" if os.path.exists(args.model) else "does not exist"
        finding("fail", "model-not-found", "model path %s %s on this target" % (args.model, what),
                "pass --model with the directory that holds config.json (models: in hosts.yaml)")
        return {"status": "fail", "summary": "model path %s %s" % (args.model, what), "findings": findings,
                "data": data}
    capture = _Capture()
    try:
        with capture:
            config = transformers.AutoConfig.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
    except Exception as e:
        data["error"] = {"step": "load-config", "type": type(e).__name__, "message": _exc_text(e),
                         "traceback": traceback.format_exc()}
        data["build_log"] = capture.records
        finding("fail", "config-load-failed", "cannot load the config of %s: %s" % (args.model, _exc_text(e)),
                "check the path (a directory with config.json) and --trust-remote-code for custom models")
        return {"status": "fail", "summary": "config load failed: %s" % _exc_text(e)[:200],
                "findings": findings, "data": data}
    with capture:

        # 1. what is requested, read BEFORE anything is built
        levels = []
        for path, cfg in _config_levels(config):
            raw, prop = _requested_of(cfg)
            levels.append({"path": path or "(root)", "class": type(cfg).__name__,
                           "model_type": getattr(cfg, "model_type", None),
                           "requested": raw, "property": prop})
        text_cfg = _text_config(config)
        composite = text_cfg is not config
        data["model"].update({
            "config_class": type(config).__name__,
            "model_type": getattr(config, "model_type", None),
            "architectures": list(getattr(config, "architectures", None) or []),
            "composite": composite,
            "text_config": ({"class": type(text_cfg).__name__, "model_type": getattr(text_cfg, "model_type", None)}
                            if composite else None),
            "num_hidden_layers": getattr(text_cfg, "num_hidden_layers", None),
            "hidden_size": getattr(text_cfg, "hidden_size", None),
        })
        requested = args.attn_implementation if args.attn_implementation else levels[0]["requested"]
        data["requested"] = {"override": args.attn_implementation, "effective": requested, "levels": levels}

        # 2. layer types from the text config
        layer_types, lt_source = _layer_types(text_cfg)
        n_layers = len(layer_types)
        type_counts = {}
        for t in layer_types:
            type_counts[t] = type_counts.get(t, 0) + 1
        n_linear = sum(c for t, c in type_counts.items() if t in _LINEAR_LAYER_TYPES)
        data["layers"] = {"num_layers": n_layers, "types": type_counts, "source": lt_source,
                          "full_attention": type_counts.get("full_attention", 0),
                          "sliding_attention": sum(c for t, c in type_counts.items() if "sliding" in t or
                                                   "chunked" in t),
                          "linear_attention": n_linear, "layer_types": layer_types}

        # 3. build the skeleton on the meta device and read the resolved implementation
        build = {"device": "meta", "class": None, "chosen_by": None, "requested": requested, "error": None}
        data["build"] = build
        model = None
        try:
            cls, chosen_by, style, missing = _pick_class(transformers, config, args)
        except ValueError as e:
            cls, missing = None, []
            build["error"] = {"type": type(e).__name__, "message": _exc_text(e), "traceback": traceback.format_exc()}
            finding("fail", "no-model-class", str(e))
        if cls is not None:
            build["chosen_by"] = chosen_by
            if missing:
                finding("warn", "architecture-unavailable",
                        "checkpoint architectures %s not in transformers %s; built via %s"
                        % (", ".join(missing), transformers.__version__, chosen_by),
                        "upgrade transformers or pass --trust-remote-code if the checkpoint ships its code")
            try:
                model = _build_on_meta(torch, cls, style, config, args.attn_implementation, args.trust_remote_code)
            except (ImportError, ValueError) as e:
                err = _exc_text(e)
                build["error"] = {"type": type(e).__name__, "message": err, "traceback": traceback.format_exc(),
                                  "attn_implementation": args.attn_implementation}
                if args.attn_implementation:
                    finding("fail", "attn-cannot-dispatch",
                            "requested attn_implementation=%r cannot dispatch: %s" % (args.attn_implementation, err),
                            _dispatch_hint(args.attn_implementation))
                    # still report what the checkpoint resolves to by default
                    try:
                        model = _build_on_meta(torch, cls, style, config, None, args.trust_remote_code)
                        build["fallback_build"] = "default (no override)"
                    except Exception as e2:
                        build["fallback_error"] = _exc_text(e2)
                elif requested and requested not in ("eager", "sdpa"):
                    finding("fail", "attn-cannot-dispatch",
                            "config requests attn_implementation=%r, which cannot dispatch: %s" % (requested, err),
                            _dispatch_hint(requested))
                else:
                    finding("fail", "build-failed", "building %s on the meta device failed: %s"
                            % (getattr(cls, "__name__", cls), err))
            except Exception as e:
                build["error"] = {"type": type(e).__name__, "message": _exc_text(e),
                                  "traceback": traceback.format_exc()}
                finding("fail", "build-failed", "building %s on the meta device failed: %s"
                        % (getattr(cls, "__name__", cls), _exc_text(e)))

        attn_modules, linear_modules = [], []
        if model is not None:
            built = type(model).__name__
            build["class"] = built
            build["root_resolved"] = _requested_of(model.config)[1]
            attn_modules, linear_modules = _resolved(model)
            arch = data["model"]["architectures"]
            if arch and built not in arch:
                fams = set(_family(a) for a in arch)
                if _family(built) not in fams:
                    finding("warn", "class-mismatch",
                            "built %s, which is not of the checkpoint's family (%s)" % (built, ", ".join(arch)),
                            "the checkpoint's own class is what training/inference code should load")
                else:
                    build["same_family"] = True
            if linear_modules and n_linear == 0:  # no layer_types in the config: count the modules
                n_linear = len(linear_modules)
                data["layers"]["linear_attention"] = n_linear
                data["layers"]["full_attention"] = max(0, n_layers - n_linear)
                data["layers"]["source"] += "; linear layers counted from modules"
    data["build_log"] = capture.records

    by_impl = _count(attn_modules, "implementation")
    by_owner = {}
    for a in attn_modules:
        by_owner.setdefault(a["owner"], {})
        by_owner[a["owner"]][str(a["implementation"])] = by_owner[a["owner"]].get(str(a["implementation"]), 0) + 1
    data["resolved"] = {"counts": by_impl, "by_model": by_owner, "modules": attn_modules,
                        "attention_modules": len(attn_modules)}

    # 4. kernels (after the build: the modelling modules import them the way transformers does)
    kernels = _kernel_status(tf_import_utils)
    data["kernels"] = kernels
    lin_classes = []
    if model is not None:
        seen = set()
        for _n, m in model.named_modules():
            if _is_linear_module(m) and type(m) not in seen:
                seen.add(type(m))
                lin_classes.append(type(m))
    fast = _linear_fast_path(lin_classes)
    slow_msgs = [r for r in capture.records if any(h in r["message"].lower() for h in _FAST_PATH_HINT)]
    data["linear_attention"] = {"layers": n_linear, "modules": len(linear_modules),
                                "module_classes": sorted(c.__name__ for c in lin_classes), "fast_path": fast,
                                "transformers_warnings": [r["message"] for r in slow_msgs]}

    # 5. findings
    if model is not None and attn_modules:
        eager = by_impl.get("eager", 0)
        if eager and args.attn_implementation != "eager":
            owners = sorted(set(a["owner"] for a in attn_modules if a["implementation"] == "eager"))
            if requested == "eager":
                why = "the checkpoint's config requests eager"
                hint = "drop attn_implementation from config.json or load with attn_implementation='sdpa'"
            else:
                why = "requested: %s" % (requested or "default")
                hint = "this class does not support SDPA/flash here; eager is slow and memory hungry"
            finding("warn", "eager-attention", "%d of %d attention modules resolved to eager (%s) in %s"
                    % (eager, len(attn_modules), why, ", ".join(owners)), hint)
        if requested and requested not in ("eager",) and not findings_has(findings, "attn-cannot-dispatch"):
            other = {k: v for k, v in by_impl.items() if k != requested and k != "eager"}
            if other:
                finding("warn", "attn-fallback",
                        "requested %s but %s" % (requested, ", ".join("%d modules resolved to %s" % (v, k)
                                                                       for k, v in sorted(other.items()))))

    if n_linear:
        fla = kernels["flash-linear-attention"]
        conv = kernels["causal-conv1d"]
        lvl = "fail" if cuda["available"] else "warn"
        fast_used = _fast_used(fast)
        of = "%d of %d layers are linear attention" % (n_linear, n_layers or n_linear)
        if not fla["installed"]:
            finding(lvl, "fla-missing", "%s and flash-linear-attention is missing: slow torch fallback" % of,
                    "pip install flash-linear-attention")
        elif not fla["importable"]:
            finding(lvl, "fla-broken", "%s and flash-linear-attention is installed (%s) but does not import: %s"
                    % (of, fla["version"], fla["import_error"]), "reinstall flash-linear-attention for this torch")
        elif fast_used.get("fla") is False or fla["usable"] is False:
            finding("warn", "fla-unusable", "%s; flash-linear-attention %s is installed but not usable here%s: "
                    "slow torch fallback" % (of, fla["version"], "" if cuda["available"] else " (no CUDA)"))
        if not conv["installed"]:
            finding("warn", "causal-conv1d-missing", "%s and causal-conv1d is missing: slow torch convolution"
                    % of, "pip install causal-conv1d")
        elif not conv["importable"]:
            finding("warn", "causal-conv1d-broken", "causal-conv1d %s is installed but does not import: %s"
                    % (conv["version"], conv["import_error"]), "reinstall causal-conv1d for this torch")

    if requested and _FLASH_RE.search(str(requested)) and not findings_has(findings, "attn-cannot-dispatch"):
        fa = kernels["flash-attn"]
        if not fa["usable"] and not fa["installed"]:
            finding("warn", "flash-attn-missing", "%s requested but flash-attn is not installed" % requested,
                    "pip install flash-attn --no-build-isolation")

    # warnings about slow paths that no finding explains yet
    if not any(f["code"].startswith(("fla-", "causal-conv1d")) for f in findings):
        for rec in capture.records:
            low = rec["message"].lower()
            if rec["level"] in ("WARNING", "ERROR", "CRITICAL") and any(h in low for h in _FAST_PATH_HINT):
                finding("warn", "build-warning", rec["message"].strip().splitlines()[0][:300])
                break

    status = _worst(findings)
    data["summary_counts"] = {"attention_modules": len(attn_modules), "linear_layers": n_linear,
                              "layers": n_layers}
    return {"status": status, "summary": _summary(data, by_impl, n_linear, n_layers, findings),
            "findings": findings, "data": data}


def _looks_like_path(model):
    """A filesystem path rather than a hub id ('org/name' has exactly one slash)."""
    return model.startswith(("/", "./", "../", "~")) or model.count("/") >= 2


def findings_has(findings, code):
    return any(f["code"] == code for f in findings)


def _fast_used(fast):
    """{'fla': bool, 'causal_conv1d': bool} from what transformers bound (None when unknown)."""
    out = {}
    for info in fast.values():
        if "is_fast_path_available" in info:
            out.setdefault("fla", info["is_fast_path_available"])
            out.setdefault("causal_conv1d", info["is_fast_path_available"])
        for fn in (info.get("functions") or {}).values():
            pkg = fn.get("package")
            if pkg:
                out[pkg] = out.get(pkg, True) and fn["kernel"]
    return out


def _dispatch_hint(impl):
    if impl and "flash_attention_2" in impl:
        return "pip install flash-attn (needs CUDA and a float16/bfloat16 model), or use sdpa"
    if impl and "flash_attention_3" in impl:
        return "flash-attn-3 needs Hopper (sm90) and its own wheel; or use sdpa"
    return "check the spelling and that this model class supports it (eager, sdpa, flash_attention_2, flex_attention)"


def _summary(data, by_impl, n_linear, n_layers, findings):
    lay = data.get("layers") or {}
    built = data.get("build", {}).get("class") or data["model"].get("config_class")
    if by_impl:
        impl = "/".join("%s" % k for k, _v in sorted(by_impl.items(), key=lambda kv: -kv[1]))
        n = sum(by_impl.values())
        attn = "%s on %d attention module%s" % (impl, n, "" if n == 1 else "s")
    elif data.get("build", {}).get("error") and not data.get("build", {}).get("class"):
        attn = "build failed"
    else:
        attn = "no attention modules found"
    layers = "%d/%d full-attention layers" % (lay.get("full_attention", n_layers - n_linear), n_layers)
    if lay.get("sliding_attention"):
        layers += ", %d sliding" % lay["sliding_attention"]
    if n_linear:
        layers += ", %d linear" % n_linear
        if any(f["code"] in ("fla-missing", "fla-broken", "fla-unusable") for f in findings):
            layers += " (torch fallback)"
    top = [f for f in findings if f["level"] in ("fail", "error")]
    tail = ("; " + top[0]["code"]) if top else ""
    return "%s: %s; %s%s" % (built, attn, layers, tail)


def main(argv=None):
    result = run(build_parser().parse_args(argv))
    print(json.dumps(result, indent=2, default=str))
    return _remote.exit_code(result)


if __name__ == "__main__":
    sys.exit(main())

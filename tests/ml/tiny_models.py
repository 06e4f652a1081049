"""Tiny random models for the ML diagnostics tests, built locally (no hub access).

Importable (``build(kind, directory, ...)``) and runnable as a script, so the same
builders can run under another transformers (``PYTHONPATH=<target dir> python
tiny_models.py qwen3_next DIR``).  Works with transformers 4.57 and 5.x.

Kinds:
  llama          LlamaForCausalLM, 4 layers, hidden 32, all full attention (+ a word-level tokenizer)
  qwen3_next     Qwen3NextForCausalLM, 4 layers (3 linear + 1 full), tiny MoE, no tokenizer
  qwen3_5        Qwen3_5ForConditionalGeneration (composite text+vision), 4 text layers; config only
  qwen2_5_vl     Qwen2_5_VLForConditionalGeneration (composite), the fallback when qwen3_5 is missing
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HIDDEN = 32
LAYERS = 4
VOCAB = 128

WORDS = ("the quick brown fox jumps over lazy dog hello world what is a model attention layer "
         "hidden state test of and to in it for on with as at by from").split()


def _cfg_llama(transformers, layers):
    return transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=False, architectures=["LlamaForCausalLM"])


def _cfg_qwen3_next(transformers, layers):
    return transformers.Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, max_position_embeddings=256, full_attention_interval=4,
        architectures=["Qwen3NextForCausalLM"])


def _cfg_qwen3_5(transformers, layers):
    return transformers.Qwen3_5Config(
        text_config=dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                         linear_value_head_dim=8, max_position_embeddings=256),
        vision_config=dict(depth=2, hidden_size=HIDDEN, intermediate_size=64, num_heads=2,
                           out_hidden_size=HIDDEN),
        architectures=["Qwen3_5ForConditionalGeneration"])


def _cfg_qwen2_5_vl(transformers, layers):
    return transformers.Qwen2_5_VLConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=2, hidden_size=HIDDEN, intermediate_size=64, num_heads=2,
                           out_hidden_size=HIDDEN, fullatt_block_indexes=[1]),
        architectures=["Qwen2_5_VLForConditionalGeneration"])


CONFIGS = {"llama": _cfg_llama, "qwen3_next": _cfg_qwen3_next, "qwen3_5": _cfg_qwen3_5,
           "qwen2_5_vl": _cfg_qwen2_5_vl}
CLASSES = {"llama": "LlamaForCausalLM", "qwen3_next": "Qwen3NextForCausalLM",
           "qwen3_5": "Qwen3_5ForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration"}


def available(kind):
    import transformers

    return hasattr(transformers, CLASSES[kind]) and hasattr(
        transformers, {"llama": "LlamaConfig", "qwen3_next": "Qwen3NextConfig", "qwen3_5": "Qwen3_5Config",
                       "qwen2_5_vl": "Qwen2_5_VLConfig"}[kind])


def save_tokenizer(directory):
    """A word-level tokenizer saved as a fast tokenizer (tokenizer.json + config), vocab < VOCAB."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.save_pretrained(directory)


def build(kind, directory, layers=LAYERS, weights=True, tokenizer=False, nan_layer=None, zero_embeddings=False,
          config_updates=None, seed=0):
    """Save a tiny model of `kind` into `directory`; return a dict describing it.

    weights=False saves config.json only (enough for check-attn).  nan_layer=k fills the
    weights of decoder layer k's token mixer output projection with NaN (extract-smoke's broken
    model: hidden_states[k+1] onwards are NaN).  zero_embeddings=True zeroes the input embeddings
    (every hidden state is then constant).  config_updates: keys written into config.json as is.
    """
    import transformers

    os.makedirs(directory, exist_ok=True)
    cfg = CONFIGS[kind](transformers, layers)
    info = {"kind": kind, "path": str(directory), "class": CLASSES[kind], "num_layers": layers,
            "hidden_size": HIDDEN, "vocab_size": VOCAB, "transformers": transformers.__version__,
            "tokenizer": bool(tokenizer), "nan_layer": nan_layer}
    text = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    info["layer_types"] = list(getattr(text, "layer_types", None) or ["full_attention"] * layers)
    if not weights:
        cfg.save_pretrained(directory)
        _update_config(directory, config_updates)
        return info
    import torch

    torch.manual_seed(seed)
    model = getattr(transformers, CLASSES[kind])(cfg)
    model.eval()
    if nan_layer is not None:
        layer = model.model.layers[nan_layer]
        mixer = getattr(layer, "self_attn", None) or getattr(layer, "linear_attn")
        proj = getattr(mixer, "o_proj", None) or getattr(mixer, "out_proj")
        with torch.no_grad():
            proj.weight.fill_(float("nan"))
    if zero_embeddings:
        with torch.no_grad():
            model.get_input_embeddings().weight.zero_()
    model.save_pretrained(directory)
    _update_config(directory, config_updates)
    if tokenizer:
        save_tokenizer(directory)
    return info


def _update_config(directory, updates):
    if not updates:
        return
    path = os.path.join(str(directory), "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(updates)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=sorted(CONFIGS))
    p.add_argument("directory")
    p.add_argument("--layers", type=int, default=LAYERS)
    p.add_argument("--config-only", action="store_true")
    p.add_argument("--tokenizer", action="store_true")
    p.add_argument("--nan-layer", type=int, default=None)
    p.add_argument("--zero-embeddings", action="store_true")
    p.add_argument("--then-run", nargs=argparse.REMAINDER, default=None, metavar="SCRIPT ARGS",
                   help="then run SCRIPT as __main__ in this same process with ARGS (MODEL_DIR is replaced "
                        "by the directory), so one interpreter start covers both; exits with its code")
    a = p.parse_args(argv)
    info = build(a.kind, a.directory, layers=a.layers, weights=not a.config_only, tokenizer=a.tokenizer,
                 nan_layer=a.nan_layer, zero_embeddings=a.zero_embeddings)
    if not a.then_run:
        print(json.dumps(info))
        return 0
    import runpy

    script = a.then_run[0]
    sys.argv = [script] + [a.directory if x == "MODEL_DIR" else x for x in a.then_run[1:]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))   # as `python3 SCRIPT` would
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

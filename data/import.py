#!/usr/bin/env python3
"""Import a local Hugging Face GPT-2 directory as a tp (llm.c) checkpoint.

    python3 data/import.py HF_DIR OUT.bin

HF_DIR holds config.json and model.safetensors (a folder from save_pretrained, or a snapshot in the
Hugging Face cache, e.g. ~/.cache/huggingface/hub/models--gpt2/snapshots/<hash>/); nothing is
downloaded. OUT.bin is llm.c's fp32 model file (version 3), the vocab padded with zero rows to a
multiple of 128 (GPT-2's 50257 to 50304). When HF_DIR has a tokenizer.json, it is copied next to OUT.bin
as tokenizer.json, where tp finds it for -e OUT.bin. Then, e.g., fine-tune GPT-2 124M at TP 2:
    ./tp -e OUT.bin -i data_train.bin -j data_val.bin --tp 2 -l 1e-4
Needs numpy.
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export import die as _die, from_hf, read_safetensors, write_llmc  # noqa: E402

PROG = "import.py"


def die(msg):
    _die(msg, PROG)


def main():
    if len(sys.argv) != 3 or sys.argv[1].startswith("-"):
        die("usage: python3 data/import.py HF_DIR OUT.bin")
    src, out = sys.argv[1], sys.argv[2]
    conf_path = os.path.join(src, "config.json")
    if not os.path.isdir(src) or not os.path.isfile(conf_path):
        die(f"{src} is not a Hugging Face model directory (no config.json): give the folder with config.json and model.safetensors")
    try:
        with open(conf_path) as f:
            conf = json.load(f)
    except (OSError, ValueError) as e:
        die(f"cannot read {conf_path}: {e}")
    kind = conf.get("model_type")
    if kind != "gpt2":
        die(f"{src} holds a {kind or 'model without a model_type'} ({', '.join(conf.get('architectures') or []) or 'no architectures'}), "
            "not GPT-2: tp trains GPT-2 only (model_type \"gpt2\")")
    act = conf.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        die(f"{src}: activation_function is {act}; tp's GPT-2 uses the tanh GELU (gelu_new)")
    if conf.get("scale_attn_by_inverse_layer_idx") or conf.get("scale_attn_weights", True) is False:
        die(f"{src}: its attention scaling (scale_attn_by_inverse_layer_idx / scale_attn_weights) is not GPT-2's 1/sqrt(head size)")
    C, L, NH = conf.get("n_embd", 768), conf.get("n_layer", 12), conf.get("n_head", 12)
    V, T = conf.get("vocab_size", 50257), conf.get("n_positions", 1024)
    if conf.get("n_inner") not in (None, 4 * C):
        die(f"{src}: n_inner is {conf.get('n_inner')}; tp's GPT-2 MLP is 4 x n_embd = {4 * C}")
    if abs(conf.get("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12:
        die(f"{src}: layer_norm_epsilon is {conf.get('layer_norm_epsilon')}; tp's layernorms use 1e-5")
    if C % NH:
        die(f"{src}: n_embd {C} is not a multiple of n_head {NH}")
    weights = os.path.join(src, "model.safetensors")
    if not os.path.isfile(weights):
        other = [f for f in ("model.safetensors.index.json", "pytorch_model.bin") if os.path.isfile(os.path.join(src, f))]
        die(f"{src} has no model.safetensors" + (f" (it has {other[0]}, which this does not read: save it again with "
                                                 "save_pretrained(dir, safe_serialization=True, max_shard_size='100GB'))" if other else ""))
    cfg = {"maxT": T, "V": V, "L": L, "NH": NH, "C": C, "Vp": (V + 127) // 128 * 128}
    t = from_hf(cfg, read_safetensors(weights, PROG), PROG)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    write_llmc(out, cfg, t)
    msg = f"wrote {out}: GPT-2 with {L} layers, {NH} heads, {C} channels, vocab {V} (padded {cfg['Vp']}), max T {T}"
    tok = os.path.join(src, "tokenizer.json")
    dst = os.path.join(os.path.dirname(os.path.abspath(out)), "tokenizer.json")
    if os.path.isfile(tok):
        if os.path.isfile(dst) and open(dst, "rb").read() != open(tok, "rb").read():
            msg += f"; {dst} exists and differs, so the tokenizer was not copied: give tp --tokenizer {tok}"
        else:
            if not (os.path.isfile(dst) and os.path.samefile(tok, dst)):
                shutil.copyfile(tok, dst)
            msg += f", and {dst} (tp finds it next to -e)"
    print(msg)


if __name__ == "__main__":
    main()

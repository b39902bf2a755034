#!/usr/bin/env python3
"""GPT-2's forward pass in numpy (float64), from an exported Hugging Face directory, for the tests: it
checks data/export.py's files against tp's own logits.

    python3 dev/gpt2_numpy.py HF_DIR LOGITS.bin

LOGITS.bin (dev/test_bpe.cuh writes it): int32 B, T, V; then B*T int32 tokens; then B*T*V float32
logits from tp. Prints "numpy max abs diff X", and, when torch and transformers are installed,
"transformers max abs diff Y" from GPT2LMHeadModel.from_pretrained(HF_DIR), else "transformers skipped".
"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
from export import read_safetensors  # noqa: E402


def layernorm(x, w, b):
    """LayerNorm over the last axis, eps 1e-5, biased variance"""
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


def gelu(x):
    """the tanh approximation (GPT-2's gelu_new)"""
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(w, conf, tokens):
    """logits (T, V) of one sequence, from GPT2LMHeadModel-named weights"""
    g = lambda k: w["transformer." + k].astype(np.float64)  # noqa: E731
    T, NH = len(tokens), conf["n_head"]
    x = g("wte.weight")[tokens] + g("wpe.weight")[:T]
    C = x.shape[1]
    hs = C // NH
    mask = np.triu(np.ones((T, T), dtype=bool), 1)
    for layer in range(conf["n_layer"]):
        p = f"h.{layer}."
        h = layernorm(x, g(p + "ln_1.weight"), g(p + "ln_1.bias"))
        qkv = h @ g(p + "attn.c_attn.weight") + g(p + "attn.c_attn.bias")  # Conv1D: (in, out)
        q, k, v = (qkv[:, i * C:(i + 1) * C].reshape(T, NH, hs).transpose(1, 0, 2) for i in range(3))
        att = q @ k.transpose(0, 2, 1) / np.sqrt(hs)
        att[:, mask] = -np.inf
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(1, 0, 2).reshape(T, C)
        x = x + y @ g(p + "attn.c_proj.weight") + g(p + "attn.c_proj.bias")
        h = layernorm(x, g(p + "ln_2.weight"), g(p + "ln_2.bias"))
        x = x + gelu(h @ g(p + "mlp.c_fc.weight") + g(p + "mlp.c_fc.bias")) @ g(p + "mlp.c_proj.weight") + g(p + "mlp.c_proj.bias")
    x = layernorm(x, g("ln_f.weight"), g("ln_f.bias"))
    return x @ g("wte.weight").T


def main():
    hf_dir, logits_path = sys.argv[1], sys.argv[2]
    with open(os.path.join(hf_dir, "config.json")) as f:
        conf = json.load(f)
    w = read_safetensors(os.path.join(hf_dir, "model.safetensors"))
    raw = open(logits_path, "rb").read()
    B, T, V = struct.unpack("<3i", raw[:12])
    tokens = np.frombuffer(raw, dtype="<i4", count=B * T, offset=12).reshape(B, T)
    tp = np.frombuffer(raw, dtype="<f4", offset=12 + 4 * B * T).reshape(B, T, V)
    ours = np.stack([forward(w, conf, tokens[b]) for b in range(B)])
    print(f"numpy max abs diff {np.abs(ours - tp).max():.3e} (logits up to {np.abs(tp).max():.2f})")
    try:
        import torch
        from transformers import GPT2LMHeadModel
    except ImportError:
        print("transformers skipped (torch and transformers are not installed)")
        return
    model = GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    with torch.no_grad():
        hf = model(torch.tensor(tokens.astype(np.int64))).logits.double().numpy()
    print(f"transformers max abs diff {np.abs(hf - tp).max():.3e}")


if __name__ == "__main__":
    main()

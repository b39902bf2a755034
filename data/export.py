#!/usr/bin/env python3
"""Export a tp (llm.c) checkpoint as a Hugging Face GPT-2 model directory.

    python3 data/export.py RUN_DIR_OR_MODEL.bin OUT_DIR [--tokenizer tokenizer.json]

RUN_DIR: the newest model_N.bin in a run folder (-o); or one model file: llm.c's fp32 format (version 3)
or bf16 (version 5). Checkpoints are full tensors, so a run at any --tp exports the same files.
OUT_DIR gets:
  config.json        GPT2LMHeadModel's config (tanh GELU, layernorm eps 1e-5, tied LM head, no dropout)
  model.safetensors  the weights under GPT2LMHeadModel's names (transformer.h.N.attn.c_attn.weight ...),
                     the Conv1D matrices stored (in, out), i.e. transposed from llm.c's (out, in), the
                     padded vocab rows dropped; written here with numpy (no safetensors package needed)
  tokenizer.json, tokenizer_config.json, vocab.json, merges.txt
                     for a BPE run: its tokenizer.json (--tokenizer, else the run folder's, else one next
                     to the model file), and what the slow GPT2Tokenizer reads. A byte-level model (vocab
                     256) has no tokenizer file: token i is byte i.
Load it with transformers:
    from transformers import GPT2LMHeadModel, AutoTokenizer
    model = GPT2LMHeadModel.from_pretrained("OUT_DIR")
    tok = AutoTokenizer.from_pretrained("OUT_DIR")
data/import.py goes the other way. Needs numpy.
"""
import glob
import json
import os
import re
import shutil
import struct
import sys

MODEL_MAGIC = 20240326
# llm.c's 16 tensors in file order; per-layer kinds hold all L layers together
LLMC_ORDER = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b",
              "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
# per-layer llm.c kind -> (Hugging Face name inside h.N., transposed: a Conv1D matrix)
LAYER_NAMES = {"ln1w": ("ln_1.weight", False), "ln1b": ("ln_1.bias", False),
               "qkvw": ("attn.c_attn.weight", True), "qkvb": ("attn.c_attn.bias", False),
               "attprojw": ("attn.c_proj.weight", True), "attprojb": ("attn.c_proj.bias", False),
               "ln2w": ("ln_2.weight", False), "ln2b": ("ln_2.bias", False),
               "fcw": ("mlp.c_fc.weight", True), "fcb": ("mlp.c_fc.bias", False),
               "fcprojw": ("mlp.c_proj.weight", True), "fcprojb": ("mlp.c_proj.bias", False)}
EOT = "<|endoftext|>"
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"]


def die(msg, prog="export.py"):
    """one line on stderr, exit status 1"""
    print(f"{prog}: error: {msg}", file=sys.stderr)
    sys.exit(1)


def need_numpy(prog):
    """numpy, or one line saying how to get it"""
    try:
        import numpy
        return numpy
    except ImportError:
        die("needs numpy, which is not installed: pip install numpy", prog)


def shapes(cfg):
    """the shapes of llm.c's 16 tensors for a header dict (maxT, V, Vp, L, NH, C)"""
    Vp, T, L, C = cfg["Vp"], cfg["maxT"], cfg["L"], cfg["C"]
    return {"wte": (Vp, C), "wpe": (T, C), "ln1w": (L, C), "ln1b": (L, C), "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C),
            "attprojw": (L, C, C), "attprojb": (L, C), "ln2w": (L, C), "ln2b": (L, C), "fcw": (L, 4 * C, C),
            "fcb": (L, 4 * C), "fcprojw": (L, C, 4 * C), "fcprojb": (L, C), "lnfw": (C,), "lnfb": (C,)}


def read_llmc(path, prog="export.py"):
    """An llm.c model file (version 3 fp32 or 5 bf16) -> (cfg dict, {name: float32 array in llm.c's layout})"""
    np = need_numpy(prog)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}", prog)
    if len(raw) < 1024:
        die(f"{path} is shorter than llm.c's 1024-byte header: not a model file", prog)
    h = struct.unpack("<256i", raw[:1024])
    if h[0] != MODEL_MAGIC:
        die(f"{path} has magic {h[0]}, not {MODEL_MAGIC}: not an llm.c model file (tp writes model_N.bin in its -o folder)", prog)
    if h[1] not in (3, 5):
        die(f"{path} has version {h[1]}; this reads version 3 (fp32) and 5 (bf16)", prog)
    cfg = {"maxT": h[2], "V": h[3], "L": h[4], "NH": h[5], "C": h[6], "Vp": h[7]}
    shp = shapes(cfg)
    n = sum(int(np.prod(s)) for s in shp.values())
    width = 4 if h[1] == 3 else 2
    if len(raw) != 1024 + n * width:
        die(f"{path} holds {len(raw) - 1024} bytes of weights, its header says {n * width}: truncated or not this format", prog)
    if h[1] == 3:
        flat = np.frombuffer(raw, dtype="<f4", offset=1024).astype(np.float32)
    else:  # bf16: the high half of an fp32
        flat = (np.frombuffer(raw, dtype="<u2", offset=1024).astype(np.uint32) << 16).view(np.float32)
    out, at = {}, 0
    for name in LLMC_ORDER:
        k = int(np.prod(shp[name]))
        out[name] = flat[at:at + k].reshape(shp[name])
        at += k
    return cfg, out


def write_llmc(path, cfg, t):
    """An llm.c version-3 (fp32) model file from cfg and llm.c-layout tensors, through a temporary name"""
    np = need_numpy("import.py")
    h = [0] * 256
    h[:8] = [MODEL_MAGIC, 3, cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"], cfg["Vp"]]
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<256i", *h))
        for name in LLMC_ORDER:
            f.write(np.ascontiguousarray(t[name], dtype="<f4").tobytes())
    os.replace(tmp, path)


def to_hf(cfg, t):
    """llm.c tensors -> {GPT2LMHeadModel name: array}: Conv1D matrices transposed, padded vocab rows dropped"""
    np = need_numpy("export.py")
    out = {"transformer.wte.weight": t["wte"][:cfg["V"]], "transformer.wpe.weight": t["wpe"],
           "transformer.ln_f.weight": t["lnfw"], "transformer.ln_f.bias": t["lnfb"]}
    for kind, (name, transpose) in LAYER_NAMES.items():
        for layer in range(cfg["L"]):
            x = t[kind][layer]
            out[f"transformer.h.{layer}.{name}"] = x.T if transpose else x
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def from_hf(cfg, w, prog="import.py"):
    """{GPT2 name (with or without "transformer."): array} -> llm.c tensors, the vocab padded to cfg["Vp"] with zeros"""
    np = need_numpy(prog)
    w = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in w.items()}

    def get(name, shape):
        if name not in w:
            die(f"the weights lack {name}: not a GPT-2 model.safetensors", prog)
        x = w[name]
        if tuple(x.shape) != tuple(shape):
            die(f"{name} has shape {tuple(x.shape)}, config.json implies {tuple(shape)}", prog)
        x = x.astype(np.float32)
        bad = np.argwhere(~np.isfinite(x))
        if len(bad):  # refused here, with its name, rather than written into a checkpoint tp refuses
            at = tuple(int(k) for k in bad[0])
            die(f"{name} holds a non-finite weight ({x[at]}) at {list(at)}: the weights file is damaged, or its run had diverged", prog)
        return x

    V, Vp, C, L, T = cfg["V"], cfg["Vp"], cfg["C"], cfg["L"], cfg["maxT"]
    wte = np.zeros((Vp, C), dtype=np.float32)
    wte[:V] = get("wte.weight", (V, C))
    if "lm_head.weight" in w and not np.array_equal(w["lm_head.weight"], w["wte.weight"]):
        die("lm_head.weight differs from wte.weight: tp's GPT-2 ties the LM head to the token embedding", prog)
    t = {"wte": wte, "wpe": get("wpe.weight", (T, C)), "lnfw": get("ln_f.weight", (C,)), "lnfb": get("ln_f.bias", (C,))}
    hf_shape = {"ln_1.weight": (C,), "ln_1.bias": (C,), "attn.c_attn.weight": (C, 3 * C), "attn.c_attn.bias": (3 * C,),
                "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,), "ln_2.weight": (C,), "ln_2.bias": (C,),
                "mlp.c_fc.weight": (C, 4 * C), "mlp.c_fc.bias": (4 * C,), "mlp.c_proj.weight": (4 * C, C), "mlp.c_proj.bias": (C,)}
    for kind, (name, transpose) in LAYER_NAMES.items():
        xs = [get(f"h.{i}.{name}", hf_shape[name]) for i in range(L)]
        t[kind] = np.stack([x.T if transpose else x for x in xs])
    return t


def write_safetensors(path, tensors):
    """A safetensors file: 8-byte little-endian header length, a JSON header (padded with spaces to a
    multiple of 8), then the raw little-endian tensors back to back, in name order"""
    np = need_numpy("export.py")
    header, at = {}, 0
    names = sorted(tensors)
    for k in names:
        n = tensors[k].size * 4
        header[k] = {"dtype": "F32", "shape": list(tensors[k].shape), "data_offsets": [at, at + n]}
        at += n
    header["__metadata__"] = {"format": "pt"}
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(js)))
        f.write(js)
        for k in names:
            f.write(np.ascontiguousarray(tensors[k], dtype="<f4").tobytes())
    os.replace(tmp, path)


def read_safetensors(path, prog="import.py"):
    """A safetensors file -> {name: float32 array} (F32, F16 and BF16 tensors)"""
    np = need_numpy(prog)
    try:
        with open(path, "rb") as f:
            raw = f.read()
        n = struct.unpack("<Q", raw[:8])[0]
        if n > len(raw) - 8:
            raise ValueError(f"its header is {n} bytes, the file {len(raw)}")
        header = json.loads(raw[8:8 + n])
        if not isinstance(header, dict):
            raise ValueError("its header is not a JSON object")
    except (OSError, ValueError, RecursionError, struct.error) as e:
        die(f"cannot read {path} as safetensors: {e}", prog)
    out, base = {}, 8 + n
    sizes = {"F32": 4, "F16": 2, "BF16": 2}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        try:
            dtype, shape, (a, b) = v["dtype"], [int(d) for d in v["shape"]], v["data_offsets"]
            ok = isinstance(a, int) and isinstance(b, int) and 0 <= a <= b <= len(raw) - base and min(shape, default=0) >= 0
        except (TypeError, ValueError, KeyError) as e:
            die(f"{path}: tensor {k} has a damaged entry in the header ({e!r}): not a safetensors file", prog)
        if dtype not in sizes:
            die(f"{path}: tensor {k} has dtype {dtype}; this reads F32, F16 and BF16", prog)
        if not ok or b - a != int(np.prod(shape)) * sizes[dtype]:
            die(f"{path}: tensor {k} of shape {tuple(shape)} does not fit its bytes {v['data_offsets']} "
                f"(the data is {len(raw) - base} bytes): the file is truncated or damaged", prog)
        buf = raw[base + a:base + b]
        if dtype == "F32":
            x = np.frombuffer(buf, dtype="<f4")
        elif dtype == "F16":
            x = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        else:
            x = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        out[k] = x.reshape(shape)
    return out


def hf_config(cfg, eot):
    """GPT2LMHeadModel's config.json for a tp model"""
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg["V"],
            "n_positions": cfg["maxT"], "n_ctx": cfg["maxT"], "n_embd": cfg["C"], "n_layer": cfg["L"], "n_head": cfg["NH"],
            "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False, "tie_word_embeddings": True,
            "bos_token_id": eot, "eos_token_id": eot, "torch_dtype": "float32"}


def newest_model(run_dir):
    """the model_N.bin of the largest N in a run folder"""
    found = []
    for p in glob.glob(os.path.join(run_dir, "model_*.bin")):
        m = re.fullmatch(r"model_(\d+)\.bin", os.path.basename(p))
        if m:
            found.append((int(m.group(1)), p))
    if not found:
        die(f"{run_dir} holds no model_N.bin: give a run folder (tp's -o) or a model file")
    return max(found)[1]


def write_tokenizer_files(src, out_dir, maxT):
    """copies tokenizer.json and writes tokenizer_config.json, vocab.json and merges.txt beside it; returns
    the end-of-text id (or None)"""
    try:
        with open(src, encoding="utf-8") as f:
            tj = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        die(f"cannot read tokenizer {src}: {e}")
    model = (tj.get("model") if isinstance(tj, dict) else None) or {}
    if model.get("type") != "BPE":
        die(f"tokenizer {src} is not a BPE tokenizer.json")
    shutil.copyfile(src, os.path.join(out_dir, "tokenizer.json"))
    vocab = dict(model["vocab"])
    eot = None
    for t in tj.get("added_tokens") or []:
        vocab.setdefault(t["content"], t["id"])
        if t["content"] == EOT:
            eot = t["id"]
    with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for m in model["merges"]:
            f.write((m if isinstance(m, str) else " ".join(m)) + "\n")
    conf = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": maxT, "add_prefix_space": False}
    if eot is not None:
        conf.update({"bos_token": EOT, "eos_token": EOT, "unk_token": EOT})
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(conf, f, indent=2)
    return eot, len(vocab)


def main():
    args = sys.argv[1:]
    tok = None
    if "--tokenizer" in args:
        i = args.index("--tokenizer")
        if i + 1 >= len(args):
            die("--tokenizer needs a file: --tokenizer tokenizer.json")
        tok = args[i + 1]
        del args[i:i + 2]
    if len(args) != 2 or args[0].startswith("-"):
        die("usage: python3 data/export.py RUN_DIR_OR_MODEL.bin OUT_DIR [--tokenizer tokenizer.json]")
    src, out_dir = args
    if not os.path.exists(src):
        die(f"{src} does not exist: give a run folder (tp's -o) or a model_N.bin")
    model = newest_model(src) if os.path.isdir(src) else src
    if tok is None:  # the run folder's copy (tp keeps one), else one next to the model file
        for cand in [os.path.join(src, "tokenizer.json")] * os.path.isdir(src) + [os.path.join(os.path.dirname(model), "tokenizer.json")]:
            if os.path.isfile(cand):
                tok = cand
                break
    cfg, t = read_llmc(model)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        die(f"{out_dir} exists and is not a directory")
    os.makedirs(out_dir, exist_ok=True)
    eot = None
    if not tok:  # no tokenizer files of an earlier export left beside other weights
        for name in TOKENIZER_FILES:
            if os.path.isfile(os.path.join(out_dir, name)):
                os.remove(os.path.join(out_dir, name))
    if tok:
        eot, n = write_tokenizer_files(tok, out_dir, cfg["maxT"])
        if n != cfg["V"]:
            die(f"tokenizer {tok} has vocab {n} but the model has vocab {cfg['V']}: give the run's tokenizer with --tokenizer")
    write_safetensors(os.path.join(out_dir, "model.safetensors"), to_hf(cfg, t))
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config(cfg, eot), f, indent=2)
    print(f"exported {model}: GPT-2 with {cfg['L']} layers, {cfg['NH']} heads, {cfg['C']} channels, vocab {cfg['V']}, "
          f"max T {cfg['maxT']} -> {out_dir}/ (config.json, model.safetensors"
          + (", tokenizer.json" if tok else "; no tokenizer: byte-level, token i is byte i" if cfg["V"] == 256 else "; no tokenizer found") + ")")


if __name__ == "__main__":
    main()

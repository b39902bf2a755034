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
import collections
import json
import os
import pickle
import shutil
import struct
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export import die as _die, from_hf, need_numpy, read_safetensors, write_llmc  # noqa: E402

PROG = "import.py"


def die(msg):
    _die(msg, PROG)


# The weights of a Hugging Face folder, in any of the layouts save_pretrained and torch.save leave: one
# model.safetensors; shards listed in model.safetensors.index.json; PyTorch's pytorch_model.bin (the zip
# format of torch >= 1.6, or the one-stream format before it, which older uploads to the Hub have); or its shards
# listed in pytorch_model.bin.index.json. torch is not needed: a PyTorch file is a pickle that names the
# tensors' storages, read here by an unpickler that builds nothing but dicts and arrays (a pickle may name
# any Python function to call; this one refuses every name a state dict of tensors does not use).
WEIGHT_FILES = ["model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"]


def read_weights(src):
    """{name: float32 array} from the first of WEIGHT_FILES that src holds"""
    have = [f for f in WEIGHT_FILES if os.path.isfile(os.path.join(src, f))]
    if not have:
        die(f"{src} has no weights: none of {', '.join(WEIGHT_FILES)}")
    path = os.path.join(src, have[0])
    if not path.endswith(".index.json"):
        return read_weight_file(path)
    try:
        with open(path) as f:
            shards = json.load(f)["weight_map"]
        files = sorted(set(shards.values()))
    except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError) as e:
        die(f"cannot read {path} as a shard index (a \"weight_map\" of tensor names to files): {e!r}")
    w = {}
    for name in files:
        if not isinstance(name, str) or os.path.dirname(name) or not os.path.isfile(os.path.join(src, name)):
            die(f"{path} names the shard {name!r}, which is not a file in {src}")
        w.update(read_weight_file(os.path.join(src, name)))
    missing = [k for k in shards if k not in w]
    if missing:
        die(f"{path} says {missing[0]} is in {shards[missing[0]]}, which does not hold it")
    return w


def read_weight_file(path):
    return read_safetensors(path, PROG) if path.endswith(".safetensors") else read_torch(path)


# PyTorch's storage classes (the dtype of a storage is its class's) -> numpy's dtype; "bf16": 2-byte bfloat16
TORCH_STORAGES = {"FloatStorage": "<f4", "HalfStorage": "<f2", "BFloat16Storage": "bf16", "DoubleStorage": "<f8",
                  "LongStorage": "<i8", "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1",
                  "ByteStorage": "u1", "BoolStorage": "?"}


class TorchStorage:
    """a storage a pickle refers to: its dtype, its key, its length; bytes filled in once read"""
    def __init__(self, dtype, key, numel):
        self.dtype, self.key, self.numel, self.bytes = dtype, key, numel, None


class TorchTensor:
    """torch._utils._rebuild_tensor_v2's arguments, turned into an array once the storage's bytes are read"""
    def __init__(self, storage, offset, size, stride, *rest):
        if not isinstance(storage, TorchStorage):
            raise pickle.UnpicklingError("a tensor without a storage")
        self.storage, self.offset, self.size, self.stride = storage, int(offset), tuple(size), tuple(stride)


class TorchUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return TorchTensor
        if module == "torch" and name in TORCH_STORAGES:
            return TORCH_STORAGES[name]
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a state dict of tensors does not (not called: a pickle can run any code)")

    def persistent_load(self, pid):
        # ('storage', dtype, key, location, numel), and in the older format a sixth field, a view of it (None)
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage" and pid[1] in TORCH_STORAGES.values()
                and isinstance(pid[4], int) and pid[4] >= 0 and (len(pid) == 5 or pid[5] is None)):
            raise pickle.UnpicklingError(f"a storage reference {pid!r:.80} that is not one torch.save writes")
        key = str(pid[2])
        if key not in self.storages:
            self.storages[key] = TorchStorage(pid[1], key, pid[4])
        return self.storages[key]


def torch_array(t, path):
    """a TorchTensor as a float32 array, checked against its storage's bytes"""
    np = need_numpy(PROG)
    s = t.storage
    item = 2 if s.dtype == "bf16" else np.dtype(s.dtype).itemsize
    if s.bytes is None or len(s.bytes) != s.numel * item:
        die(f"{path}: storage {s.key} should hold {s.numel * item} bytes, it holds {0 if s.bytes is None else len(s.bytes)}: truncated or damaged")
    if len(t.size) != len(t.stride) or any(not isinstance(v, int) or v < 0 for v in t.size + t.stride) or t.offset < 0:
        die(f"{path}: a tensor of size {t.size} and stride {t.stride}: not one torch.save writes")
    last = t.offset + sum((n - 1) * st for n, st in zip(t.size, t.stride)) if all(t.size) else -1
    if last >= s.numel:
        die(f"{path}: a tensor of size {t.size} reaches past the end of its storage ({s.numel} elements): damaged")
    flat = np.frombuffer(s.bytes, dtype="<u2" if s.dtype == "bf16" else s.dtype)
    if s.dtype == "bf16":
        flat = (flat.astype(np.uint32) << 16).view(np.float32)
    return np.lib.stride_tricks.as_strided(flat[t.offset:], shape=t.size, strides=[st * flat.itemsize for st in t.stride]).astype(np.float32)


def read_torch(path):
    """A PyTorch state dict file -> {name: float32 array}"""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                pkl = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
                if len(pkl) != 1:
                    die(f"{path} is a zip file without one data.pkl: not a file torch.save wrote")
                root = pkl[0][:-len("data.pkl")]
                if root + "byteorder" in z.namelist() and z.read(root + "byteorder") != b"little":
                    die(f"{path} was written on a big-endian machine; this reads little-endian files")
                u = TorchUnpickler(z.open(pkl[0]))
                u.storages = {}
                obj = u.load()
                for s in u.storages.values():
                    s.bytes = z.read(f"{root}data/{s.key}")
        else:
            with open(path, "rb") as f:
                # torch's format before 1.6: a magic number, a version, the machine, the object, the storages'
                # keys (pickles), then each storage as its length (int64, in elements) and its bytes
                u = TorchUnpickler(f)
                u.storages = {}
                if u.load() != 0x1950a86a20f9469cfc6c or u.load() != 1001:
                    die(f"{path} is neither a safetensors file nor a PyTorch file (no zip archive, no magic number)")
                info = u.load()
                if not isinstance(info, dict) or not info.get("little_endian", False):
                    die(f"{path} was written on a big-endian machine; this reads little-endian files")
                obj = u.load()
                keys = u.load()
                for key in keys:
                    s = u.storages.get(str(key))
                    if s is None:
                        die(f"{path}: its storage list names {key!r}, which no tensor uses: damaged")
                    n = struct.unpack("<q", f.read(8))[0]
                    item = 2 if s.dtype == "bf16" else need_numpy(PROG).dtype(s.dtype).itemsize
                    if n != s.numel:
                        die(f"{path}: storage {s.key} says {n} elements, its tensors' pickle {s.numel}: damaged")
                    s.bytes = f.read(n * item)
    except (OSError, EOFError, ValueError, KeyError, TypeError, IndexError, AttributeError, struct.error,
            pickle.UnpicklingError, zipfile.BadZipFile, MemoryError) as e:
        die(f"cannot read {path} as a PyTorch state dict: {e}")
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        die(f"{path} holds a {type(obj).__name__}, not a state dict (tensor names to tensors)")
    # a state dict may hold values that are not tensors (a version number, say); GPT-2's weights are tensors
    return {k: torch_array(v, path) for k, v in obj.items() if isinstance(v, TorchTensor)}


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
    except (OSError, ValueError, RecursionError) as e:
        die(f"cannot read {conf_path}: {e}")
    if not isinstance(conf, dict):
        die(f"{conf_path} holds a JSON {type(conf).__name__}, not an object: not a Hugging Face config.json")
    kind = conf.get("model_type")
    if kind != "gpt2":
        arch = conf.get("architectures")
        arch = ", ".join(map(str, arch)) if isinstance(arch, list) and arch else "no architectures"
        die(f"{src} holds a {kind or 'model without a model_type'} ({arch}), not GPT-2: tp trains GPT-2 only (model_type \"gpt2\")")
    act = conf.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        die(f"{src}: activation_function is {act}; tp's GPT-2 uses the tanh GELU (gelu_new)")
    if conf.get("scale_attn_by_inverse_layer_idx") or conf.get("scale_attn_weights", True) is False:
        die(f"{src}: its attention scaling (scale_attn_by_inverse_layer_idx / scale_attn_weights) is not GPT-2's 1/sqrt(head size)")
    sizes = {"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}  # GPT2Config's defaults
    for k in sizes:
        sizes[k] = conf.get(k, sizes[k])
        if type(sizes[k]) is not int or sizes[k] <= 0:
            die(f"{conf_path}: {k} is {sizes[k]!r}, not a positive integer")
    C, L, NH, V, T = sizes.values()
    if not isinstance(conf.get("layer_norm_epsilon", 1e-5), (int, float)):
        die(f"{conf_path}: layer_norm_epsilon is {conf.get('layer_norm_epsilon')!r}, not a number")
    if conf.get("n_inner") not in (None, 4 * C):
        die(f"{src}: n_inner is {conf.get('n_inner')!r}; tp's GPT-2 MLP is 4 x n_embd = {4 * C}")
    if abs(conf.get("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12:
        die(f"{src}: layer_norm_epsilon is {conf.get('layer_norm_epsilon')}; tp's layernorms use 1e-5")
    if C % NH:
        die(f"{src}: n_embd {C} is not a multiple of n_head {NH}")
    cfg = {"maxT": T, "V": V, "L": L, "NH": NH, "C": C, "Vp": (V + 127) // 128 * 128}
    t = from_hf(cfg, read_weights(src), PROG)
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

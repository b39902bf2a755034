#!/usr/bin/env python3
"""The Python side of dev/test_bpe.cuh's tests (Hugging Face tokenizers and numpy as the reference).

    python3 dev/test_bpe.py ids TOKENIZER TEXT OUT.json N   [text, ids] pairs: TEXT's lines, TEXT whole, N random strings
    python3 dev/test_bpe.py words OUT.json N                           [text, words] pairs: the pre-tokenizer's words (byte
                                                                       ranges) of N random strings and of every contraction
    python3 dev/test_bpe.py split TOKENIZER TEXT TRAIN.bin VAL.bin   whether the token files are TEXT's tokens, split
    python3 dev/test_bpe.py chunks TOKENIZER TEXT                      whether prepare.py's pieces of TEXT (and of it with
                                                                       spaces before its newlines) encode to its tokens
    python3 dev/test_bpe.py legacy TOKENIZER OUT.json                  TOKENIZER as older files (GPT-2's own) write it
    python3 dev/test_bpe.py hub HF_DIR OUT_DIR                         HF_DIR laid out as the Hub's gpt2 folder is
    python3 dev/test_bpe.py shards|torchzip|torchlegacy|torchshards|evil HF_DIR OUT_DIR
                                                                       HF_DIR's weights in another file layout (see save_as)
    python3 dev/test_bpe.py untied HF_DIR OUT_DIR                      HF_DIR with an lm_head.weight that is not its wte
    python3 dev/test_bpe.py torchload DIR HF_DIR                       whether torch.load reads DIR's pytorch_model.bin as HF_DIR's weights
    python3 dev/test_bpe.py bf16 MODEL.bin OUT.bin                     MODEL (version 3) as llm.c's bf16 version 5
    python3 dev/test_bpe.py same HF_DIR MODEL.bin [bf16]               whether HF_DIR holds MODEL's weights (rounded to bf16)
    python3 dev/test_bpe.py unicode OUT                                 every code point's class in OUT (a byte each: 1 letter,
                                                                       2 number, 0 other), and the Unicode version it is from
Each prints one line; "ok" at its start when the property holds.
"""
import io
import json
import os
import random
import shutil
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))


def read_tokens(path):
    """the uint16 tokens of an llm.c token file"""
    raw = open(path, "rb").read()
    h = struct.unpack("<256i", raw[:1024])
    return list(np.frombuffer(raw, dtype="<u2", count=h[2], offset=1024))


def random_texts(n, seed):
    """n strings that stress the pre-tokenizer: scripts, spaces of every kind, digits, contractions, emoji"""
    rnd = random.Random(seed)
    atoms = list(" \n\t\r\x0b\x0c'sStmdrevl0123456789.,;!?-") + [
        "é", "日", "本", "語", "한", "ä", "\u0301", "\u00a0", "\u3000", "\u2003", "\u0085", "\x1c", "٣", "½", "Ⅻ", "🙂", "🙃",
        "—", "…", "“", "”", "'s", "'re", "'ll", "'ve", " the", " harbour", "  ", "\n\n", "<|endoftext|>", "Ελ", "ки", "ไทย"]
    return ["".join(rnd.choice(atoms) for _ in range(rnd.randint(1, 80))) for _ in range(n)]


def repeat_texts(text):
    """words of one piece said 2 to 7 times (the text's common letters and letter pairs: "eee", "ththth"), bare and
    after a space: where a pair occurs twice in a word, which merges first (the leftmost) decides the ids"""
    def common(items):
        counts = {}
        for x in items:
            if not any(ch.isspace() for ch in x):
                counts[x] = counts.get(x, 0) + 1
        return sorted(counts, key=lambda x: -counts[x])[:30]
    pieces = common(text) + common(text[i:i + 2] for i in range(len(text) - 1))
    return [pre + p * k for p in pieces for k in range(2, 8) for pre in ("", " ")]


def contraction_texts():
    """each of the regex's seven contractions and its upper case (not one: the regex is case-sensitive) at the
    start, after a letter, a space, a quote and another contraction, before letters, doubled, and the near
    misses ('x, 'l, 'v, 'r)"""
    out = []
    for c in ["s", "t", "re", "ve", "m", "ll", "d", "S", "T", "RE", "VE", "M", "LL", "D", "x", "l", "v", "r"]:
        out += [f"'{c}", f"I'{c}", f"I'{c} go", f" '{c}", f"''{c}", f"'{c}'{c}", f"'{c}{c}", f"x'{c}y", f"é'{c}", f"1'{c}2"]
    return out


def to_bf16(x):
    """float32 -> bf16 bits (uint16), rounded to nearest even"""
    w = np.ascontiguousarray(x, dtype="<f4").reshape(-1).view(np.uint32).astype(np.uint64)
    return ((w + 0x7FFF + ((w >> 16) & 1)) >> 16).astype("<u2")


def main():
    cmd = sys.argv[1]
    if cmd in ("ids", "split", "chunks"):
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(sys.argv[2])
        text = open(sys.argv[3], encoding="utf-8", newline="").read()
    if cmd == "ids":
        texts = text.splitlines(keepends=True)[:200] + [text] + random_texts(int(sys.argv[5]), 7) + repeat_texts(text)
        cases = [[t, tok.encode(t).ids] for t in texts]
        with open(sys.argv[4], "w", encoding="utf-8") as f:
            json.dump(cases, f)
        print(f"ok {len(cases)} texts, {sum(len(c[1]) for c in cases)} tokens")
    elif cmd == "words":
        from tokenizers import pre_tokenizers
        pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        cases = []
        for t in contraction_texts() + random_texts(int(sys.argv[3]), 11):
            # the library's offsets count characters; tp's count bytes
            cases.append([t, [[len(t[:a].encode()), len(t[:b].encode())] for _, (a, b) in pre.pre_tokenize_str(t)]])
        with open(sys.argv[2], "w", encoding="utf-8") as f:
            json.dump(cases, f)
        print(f"ok {len(cases)} texts, {sum(len(c[1]) for c in cases)} words")
    elif cmd == "chunks":
        # prepare.py encodes a big text in pieces of about 1 MB cut only where the pre-tokenizer cuts; pieces of
        # 40 to 3000 characters here, so the text has hundreds of cuts, and lines that end in every kind of space
        # (which the regex joins to the newline: no cut may fall after them)
        import prepare
        from tokenizers import pre_tokenizers
        pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        words = lambda t: [w for w, _ in pre.pre_tokenize_str(t)]  # the ids can agree where these do not
        ends = [" ", "  ", "\t", "\r", "\u00a0", "\u3000", "\u2003", "\u0085", "\x0b", ""]
        lines = text.split("\n")
        spaced = "\n".join(l + ends[i % len(ends)] + ("\n" if i % 7 == 0 else "") for i, l in enumerate(lines))
        bad, cuts = [], 0
        for name, t in (("the text", text), ("the text with spaces before its newlines", spaced)):
            whole, whole_words = tok.encode(t).ids, words(t)
            for size in (40, 333, 3000):
                pieces = list(prepare.chunks(t, size))
                cuts += len(pieces) - 1
                ids = [i for p in pieces for i in tok.encode(p).ids]
                if "".join(pieces) != t or ids != whole or [w for p in pieces for w in words(p)] != whole_words:
                    bad.append(f"{name} in pieces of {size}")
        print(f"FAIL {', '.join(bad)}: not the whole text's words and tokens" if bad else
              f"ok the pieces have the whole text's words and tokens ({cuts} cuts, at 3 piece sizes, 2 texts)")
    elif cmd == "split":
        train, val = read_tokens(sys.argv[4]), read_tokens(sys.argv[5])
        eot = tok.token_to_id("<|endoftext|>")
        whole = tok.encode(text).ids
        joined = train[1:] + val[1:]
        val_text = tok.decode(val[1:])
        if train[0] != eot or val[0] != eot:
            print("FAIL the splits do not start with <|endoftext|>")
        elif [int(x) for x in joined] != whole:
            print(f"FAIL train + val tokens ({len(joined)}) are not the tokens of the whole text ({len(whole)})")
        elif not text.endswith(val_text) or tok.decode(train[1:]) + val_text != text:
            print("FAIL the val tokens do not decode to the end of the text")
        else:
            print(f"ok train {len(train) - 1} + val {len(val) - 1} tokens are the whole text's {len(whole)}; val decodes to its last {len(val_text)} characters")
    elif cmd == "legacy":  # merges as "left right" strings, "" for the unused affixes, no use_regex
        tj = json.load(open(sys.argv[2], encoding="utf-8"))
        tj["model"]["merges"] = [" ".join(m) for m in tj["model"]["merges"]]
        tj["model"]["continuing_subword_prefix"] = ""
        tj["model"]["end_of_word_suffix"] = ""
        tj["model"].pop("ignore_merges", None)
        tj["pre_tokenizer"].pop("use_regex", None)
        json.dump(tj, open(sys.argv[3], "w", encoding="utf-8"), indent=2)
        print(f"ok wrote {sys.argv[3]}")
    elif cmd == "hub":  # names without "transformer.", the attention mask buffers, an lm_head equal to wte, F16-free
        from export import read_safetensors, write_safetensors
        os.makedirs(sys.argv[3], exist_ok=True)
        conf = json.load(open(os.path.join(sys.argv[2], "config.json")))
        w = {k[len("transformer."):]: v for k, v in read_safetensors(os.path.join(sys.argv[2], "model.safetensors")).items()}
        T = conf["n_positions"]
        for layer in range(conf["n_layer"]):
            w[f"h.{layer}.attn.bias"] = np.tril(np.ones((T, T), dtype=np.float32))[None, None]
        w["lm_head.weight"] = w["wte.weight"]
        write_safetensors(os.path.join(sys.argv[3], "model.safetensors"), w)
        for k in ("architectures", "bos_token_id", "eos_token_id", "n_inner", "scale_attn_weights", "tie_word_embeddings"):
            conf.pop(k, None)
        json.dump(conf, open(os.path.join(sys.argv[3], "config.json"), "w"))
        print(f"ok wrote {sys.argv[3]}")
    elif cmd == "untied":  # an lm_head that is not wte: a model tp's GPT-2 (tied head) cannot hold
        from export import read_safetensors, write_safetensors
        os.makedirs(sys.argv[3], exist_ok=True)
        w = read_safetensors(os.path.join(sys.argv[2], "model.safetensors"))
        w["lm_head.weight"] = w["transformer.wte.weight"] * 1.5
        write_safetensors(os.path.join(sys.argv[3], "model.safetensors"), w)
        shutil.copyfile(os.path.join(sys.argv[2], "config.json"), os.path.join(sys.argv[3], "config.json"))
        print(f"ok wrote {sys.argv[3]}")
    elif cmd in ("shards", "torchzip", "torchlegacy", "torchshards", "evil"):
        save_as(cmd, sys.argv[2], sys.argv[3])
        print(f"ok wrote {sys.argv[3]}")
    elif cmd == "torchload":  # the stand-in's files as torch itself reads them, where torch is installed
        try:
            import torch
        except ImportError:
            print("skip torch is not installed")
            return
        from export import read_safetensors
        want = read_safetensors(os.path.join(sys.argv[3], "model.safetensors"))
        got = torch.load(os.path.join(sys.argv[2], "pytorch_model.bin"), weights_only=True)
        bad = [k for k in want if k not in got or not np.array_equal(got[k].numpy(), want[k])]
        print(f"ok torch.load reads {len(got)} tensors, equal" if not bad and len(got) == len(want) else f"FAIL {len(bad)} tensors differ, e.g. {bad[:2]}")
    elif cmd == "bf16":
        raw = bytearray(open(sys.argv[2], "rb").read())
        h = list(struct.unpack("<256i", raw[:1024]))
        h[1] = 5
        bf = to_bf16(np.frombuffer(bytes(raw[1024:]), dtype="<f4"))
        with open(sys.argv[3], "wb") as f:
            f.write(struct.pack("<256i", *h))
            f.write(bf.tobytes())
        print(f"ok wrote {sys.argv[3]}: {bf.size} bf16 weights")
    elif cmd == "unicode":
        import unicodedata
        major = [unicodedata.category(chr(cp))[0] for cp in range(0x110000)]
        with open(sys.argv[2], "wb") as f:
            f.write(bytes(1 if m == "L" else 2 if m == "N" else 0 for m in major))
        print(f"ok Unicode {unicodedata.unidata_version}")
    elif cmd == "same":
        from export import read_llmc, read_safetensors, to_hf
        cfg, t = read_llmc(sys.argv[3])
        want = to_hf(cfg, t)
        if sys.argv[4:] == ["bf16"]:
            want = {k: (to_bf16(v).astype(np.uint32) << 16).view(np.float32).reshape(v.shape) for k, v in want.items()}
        got = read_safetensors(os.path.join(sys.argv[2], "model.safetensors"))
        bad = [k for k in want if k not in got or not np.array_equal(got[k], want[k])]
        note = ""
        try:  # the safetensors package, when installed, must read the file the same
            from safetensors.numpy import load_file
            lib = load_file(os.path.join(sys.argv[2], "model.safetensors"))
            note = " (and so does the safetensors package)" if all(np.array_equal(lib[k], got[k]) for k in got) and len(lib) == len(got) else ""
            if not note:
                bad.append("the safetensors package reads other values")
        except ImportError:
            note = " (safetensors package not installed)"
        print(f"ok {len(want)} tensors equal{note}" if not bad and len(got) == len(want) else f"FAIL {len(bad)} tensors differ, e.g. {bad[:2]}")


def save_as(layout, src, out):
    """src's model.safetensors written into out as
    shards        three safetensors files and model.safetensors.index.json
    torchzip      pytorch_model.bin as torch.save writes it (a zip of data.pkl and one file per storage); wte,
                  wpe and the layers' c_attn share one storage (views at offsets) and c_attn is stored transposed
                  (a strided view), as torch.save keeps views
    torchlegacy   the same in torch's format before 1.6 (pickles, then the storages, in one stream)
    torchshards   two torchzip files and pytorch_model.bin.index.json
    evil          a pytorch_model.bin whose pickle calls os.system (an importer must not run it)
    torch is not used: a module named torch with the two names the pickle refers to stands in for it here."""
    import collections
    import pickle
    import types
    import zipfile
    from export import read_safetensors, write_safetensors
    os.makedirs(out, exist_ok=True)
    shutil.copyfile(os.path.join(src, "config.json"), os.path.join(out, "config.json"))
    w = read_safetensors(os.path.join(src, "model.safetensors"))
    names = sorted(w)
    if layout == "shards":
        parts = [names[i::3] for i in range(3)]
        files = [f"model-0000{i + 1}-of-00003.safetensors" for i in range(3)]
        for part, f in zip(parts, files):
            write_safetensors(os.path.join(out, f), {k: w[k] for k in part})
        index = {"metadata": {}, "weight_map": {k: f for part, f in zip(parts, files) for k in part}}
        json.dump(index, open(os.path.join(out, "model.safetensors.index.json"), "w"))
        return
    torch, utils = types.ModuleType("torch"), types.ModuleType("torch._utils")
    FloatStorage = type("FloatStorage", (), {"__module__": "torch"})

    def _rebuild_tensor_v2(*args):
        raise AssertionError("only pickled here")
    _rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
    torch.FloatStorage, utils._rebuild_tensor_v2, torch._utils = FloatStorage, _rebuild_tensor_v2, utils
    sys.modules["torch"], sys.modules["torch._utils"] = torch, utils

    class Storage:
        def __init__(self, key, data):
            self.key, self.data = key, np.ascontiguousarray(data, dtype="<f4").ravel()

    class Tensor:  # pickles as torch.save pickles a tensor: a call of _rebuild_tensor_v2 on its storage
        def __init__(self, storage, offset, shape, stride):
            self.args = (storage, offset, tuple(shape), tuple(stride), False, collections.OrderedDict())

        def __reduce__(self):
            return (_rebuild_tensor_v2, self.args)

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + os.path.join(out, "ran"),))

    def state_dict(keys):
        """keys' tensors; wte, wpe and c_attn (transposed) packed into one shared storage when all are in keys"""
        shared = [k for k in keys if k.endswith(("wte.weight", "wpe.weight", "attn.c_attn.weight"))]
        sd, storages, at, parts = collections.OrderedDict(), [], 0, []
        for k in shared:
            x = w[k].T.copy() if k.endswith("c_attn.weight") else w[k]  # stored (out, in): a transposed view
            stride = (1, x.shape[1]) if k.endswith("c_attn.weight") else (w[k].shape[1], 1)
            parts.append(x.ravel())
            sd[k] = (at, w[k].shape, stride)
            at += x.size
        if shared:
            big = Storage("0", np.concatenate(parts))
            storages.append(big)
            sd = collections.OrderedDict((k, Tensor(big, *v)) for k, v in sd.items())
        for k in keys:
            if k not in sd:
                st = Storage(str(len(storages)), w[k])
                storages.append(st)
                shape = w[k].shape
                stride = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
                sd[k] = Tensor(st, 0, shape, stride)
        if layout == "evil":
            sd["h.0.attn.bias"] = Evil()
        return sd, storages

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, Storage):
                return ("storage", FloatStorage, obj.key, "cpu", obj.data.size) + ((None,) if layout == "torchlegacy" else ())
            return None

    def save_zip(path, keys):
        sd, storages = state_dict(keys)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
            buf = io.BytesIO()
            Pickler(buf, protocol=2).dump(sd)
            z.writestr("archive/data.pkl", buf.getvalue())
            z.writestr("archive/byteorder", "little")
            for st in storages:
                z.writestr(f"archive/data/{st.key}", st.data.tobytes())
            z.writestr("archive/version", "3\n")

    if layout in ("torchzip", "evil"):
        save_zip(os.path.join(out, "pytorch_model.bin"), names)
    elif layout == "torchshards":
        parts = [names[:len(names) // 2], names[len(names) // 2:]]
        files = ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
        for part, f in zip(parts, files):
            save_zip(os.path.join(out, f), part)
        json.dump({"metadata": {}, "weight_map": {k: f for part, f in zip(parts, files) for k in part}},
                  open(os.path.join(out, "pytorch_model.bin.index.json"), "w"))
    else:
        sd, storages = state_dict(names)
        with open(os.path.join(out, "pytorch_model.bin"), "wb") as f:
            for x in (0x1950a86a20f9469cfc6c, 1001, {"protocol_version": 1001, "little_endian": True,
                                                     "type_sizes": {"short": 2, "int": 4, "long": 4}}):
                pickle.dump(x, f, protocol=2)
            Pickler(f, protocol=2).dump(sd)
            pickle.dump([st.key for st in storages], f, protocol=2)
            for st in storages:
                f.write(struct.pack("<q", st.data.size))
                f.write(st.data.tobytes())


if __name__ == "__main__":
    main()

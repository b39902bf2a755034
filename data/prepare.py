#!/usr/bin/env python3
"""Turn a UTF-8 text file into llm.c token files.

    python3 data/prepare.py INPUT.txt OUTDIR [--val-frac 0.1] [--name NAME] [--bpe] [--tokenizer PATH]

Writes OUTDIR/NAME_train.bin (first part of the text) and OUTDIR/NAME_val.bin (the last
val-frac of the bytes); NAME defaults to the input's stem (plus "_gpt2" with --bpe, so the
two kinds never overwrite each other). Default tokens are bytes (id = byte value 0..255);
--bpe uses GPT-2 BPE via tiktoken, with the GPT-2 end-of-text token at the start of each split
as llm.c does. tiktoken downloads the GPT-2 encoding on its first use and caches it (in
$TIKTOKEN_CACHE_DIR, by default a folder in /tmp): run --bpe once online, or see the error's hint.
File format (llm.c): 256 little-endian int32 header [20240520, 1, ntokens, 0...], then the
tokens as little-endian uint16.
--tokenizer PATH also writes a tokenizer in llm.c's gpt2_tokenizer.bin format (version 2):
the 256-entry byte vocabulary (EOT id 0), or with --bpe the GPT-2 vocabulary (EOT 50256).
Standard library only (tiktoken only for --bpe). Ends by printing the ./tp command that trains on
what it wrote.
"""
import argparse
import os
import shlex
import struct
import sys
from array import array

DATA_MAGIC, DATA_VERSION = 20240520, 1
TOK_MAGIC, TOK_VERSION = 20240328, 2
GPT2_EOT = 50256


def die(msg):
    print(f"prepare.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


class Parser(argparse.ArgumentParser):
    # argparse would print usage and exit 2; keep every error to one line and exit 1
    def error(self, message):
        die(message)


def write_tokens(path, tokens):
    header = [0] * 256
    header[0], header[1], header[2] = DATA_MAGIC, DATA_VERSION, len(tokens)
    body = array("H", tokens)  # raises OverflowError for ids > 65535
    if sys.byteorder == "big":
        body.byteswap()  # the format is little-endian whatever the host is
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(body.tobytes())


def write_tokenizer(path, pieces, eot):
    header = [0] * 256
    header[0], header[1], header[2], header[3] = TOK_MAGIC, TOK_VERSION, len(pieces), eot
    with open(path, "wb") as f:
        f.write(struct.pack("<256I", *header))
        for p in pieces:
            f.write(struct.pack("<B", len(p)))
            f.write(p)


def load_tiktoken():
    try:
        import tiktoken
    except ImportError:
        die("--bpe needs the tiktoken package, which is not installed: pip install tiktoken")
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # no network for the download on first use, most often
        die(f"tiktoken could not load the GPT-2 encoding ({type(e).__name__}): it downloads it once, from "
            "openaipublic.blob.core.windows.net, and caches it in $TIKTOKEN_CACHE_DIR (default: data-gym-cache in the "
            "temp folder). Run this once on a machine that is online: TIKTOKEN_CACHE_DIR=~/.cache/tiktoken python3 -c "
            "\"import tiktoken; tiktoken.get_encoding('gpt2')\", copy that folder here if it is another machine, and run "
            "prepare.py with TIKTOKEN_CACHE_DIR=~/.cache/tiktoken set")


def main():
    ap = Parser(description="UTF-8 text -> llm.c token files (byte-level or GPT-2 BPE)")
    ap.add_argument("input")
    ap.add_argument("outdir")
    ap.add_argument("--val-frac", type=float, default=0.1, help="fraction of bytes for val (default 0.1)")
    ap.add_argument("--name", help="output name prefix (default: input file stem)")
    ap.add_argument("--bpe", action="store_true", help="GPT-2 BPE tokens via tiktoken")
    ap.add_argument("--tokenizer", metavar="PATH", help="also write an llm.c tokenizer file")
    args = ap.parse_args()

    if not (0.0 < args.val_frac < 1.0):  # also rejects nan
        die(f"--val-frac must be strictly between 0 and 1, got {args.val_frac}")
    try:
        with open(args.input, "rb") as f:
            data = f.read()
    except OSError as e:
        die(f"cannot read {args.input}: {e.strerror}")
    try:
        data.decode("utf-8")  # validate only; byte-level tokens are the raw bytes
    except UnicodeDecodeError as e:
        die(f"{args.input} is not valid UTF-8 (byte offset {e.start})")

    n_val = int(round(len(data) * args.val_frac))
    split = len(data) - n_val
    name = args.name or os.path.splitext(os.path.basename(args.input))[0] + ("_gpt2" if args.bpe else "")

    if args.bpe:
        enc = load_tiktoken()
        # cut on a character boundary so both halves decode (UTF-8 continuation bytes are 10xxxxxx)
        while 0 < split < len(data) and (data[split] & 0xC0) == 0x80:
            split += 1
        train = [GPT2_EOT] + enc.encode_ordinary(data[:split].decode("utf-8"))
        val = [GPT2_EOT] + enc.encode_ordinary(data[split:].decode("utf-8"))
    else:
        train, val = list(data[:split]), list(data[split:])
    # a split needs at least one (input, target) pair
    if len(train) < 2 or len(val) < 2:
        die(f"{args.input} is too small to split ({len(data)} bytes -> "
            f"{len(train)} train / {len(val)} val tokens, need at least 2 each)")

    try:
        os.makedirs(args.outdir, exist_ok=True)
        paths = [os.path.join(args.outdir, f"{name}_{s}.bin") for s in ("train", "val")]
        write_tokens(paths[0], train)
        write_tokens(paths[1], val)
        if args.tokenizer:
            if args.bpe:
                pieces = [enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)]
            else:
                pieces = [bytes([b]) for b in range(256)]
            write_tokenizer(args.tokenizer, pieces, GPT2_EOT if args.bpe else 0)
    except OSError as e:
        die(f"cannot write output: {e}")

    kind = "GPT-2 BPE" if args.bpe else "byte-level"
    print(f"wrote {paths[0]}: {len(train)} tokens ({kind})")
    print(f"wrote {paths[1]}: {len(val)} tokens ({kind})")
    if args.tokenizer:
        print(f"wrote {args.tokenizer}: vocab {len(pieces)}")
    # the command that trains on it, from the folder prepare.py ran in (tp picks the vocab from the tokens:
    # 256 for bytes, GPT-2's 50257 for BPE)
    tp = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tp"))
    rel = os.path.relpath(tp)
    tp = tp if rel.startswith("..") else rel if os.sep in rel else "./" + rel
    cmd = [tp, "-i", paths[0], "-j", paths[1], "-o", os.path.join(args.outdir, f"run_{name}")]
    if args.tokenizer and args.bpe:
        cmd += ["--tokenizer", args.tokenizer]
    print("train on it (checkpoints and log.csv go to the -o folder):")
    print("  " + " ".join(shlex.quote(c) for c in cmd))


if __name__ == "__main__":
    main()

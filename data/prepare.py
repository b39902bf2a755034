#!/usr/bin/env python3
"""Turn a UTF-8 text file into llm.c token files.

    python3 data/prepare.py INPUT.txt OUTDIR [--val-frac 0.1] [--name NAME] [--vocab N | --encode-with FILE | --bpe] [--tokenizer PATH]

Writes OUTDIR/NAME_train.bin (first part of the text) and OUTDIR/NAME_val.bin (the last
val-frac of the bytes); NAME defaults to the input's stem (plus "_bpeN" with --vocab N, "_gpt2"
with --bpe, so the kinds never overwrite each other). Default tokens are bytes (id = byte value
0..255).
--vocab N trains a byte-level BPE of N tokens (GPT-2's scheme, N <= 65536) on the train part of the
text, offline, with Hugging Face `tokenizers` (pip install tokenizers), and writes it next to the
token files: OUTDIR/NAME_tokenizer.json (Hugging Face's file; tp finds it next to -i, decodes samples
and encodes --prompt with it) and OUTDIR/NAME_tokenizer.bin (llm.c's format, for decoding in llm.c).
The last token, N-1, is <|endoftext|>.
--encode-with FILE encodes with an existing byte-level BPE tokenizer.json instead (GPT-2's, from a
local Hugging Face model directory, for fine-tuning an imported GPT-2: data/import.py), offline too;
NAME gets "_hf", and the file is copied as OUTDIR/NAME_tokenizer.json.
With --vocab or --encode-with the split falls where a line starts after a non-space character, where GPT-2's
pre-tokenizer always cuts: so the val tokens are exactly the tokens of the val text, and no merge
crosses the split.
--bpe uses GPT-2 BPE via tiktoken. With --vocab or --bpe the end-of-text token starts each split, as
llm.c does. tiktoken downloads the GPT-2 encoding on its first use and caches it (in
$TIKTOKEN_CACHE_DIR, by default a folder in /tmp): run --bpe once online, or see the error's hint.
File format (llm.c): 256 little-endian int32 header [20240520, 1, ntokens, 0...], then the
tokens as little-endian uint16.
--tokenizer PATH also writes a tokenizer in llm.c's gpt2_tokenizer.bin format (version 2):
the 256-entry byte vocabulary (EOT id 0), or with --bpe the GPT-2 vocabulary (EOT 50256).
Standard library only (tokenizers for --vocab, tiktoken for --bpe). Ends by printing the ./tp command that trains on
what it wrote.
"""
import argparse
import os
import shlex
import shutil
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


# Unicode's White_Space, the \\s of GPT-2's pre-tokenizer regex (str.isspace differs on a few controls)
WHITE_SPACE = set("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {chr(c) for c in range(0x2000, 0x200B)}


def safe_cut(text, i):
    """The first position at or after i (else the last before it) where a line starts after a non-space
    character: GPT-2's pre-tokenizer always cuts there, so text[:p] and text[p:] encode to the tokens of
    the whole text, split. Returns -1 when the text has no such place."""
    p = text.find("\n", max(i, 1))
    while p != -1 and text[p - 1] in WHITE_SPACE:
        p = text.find("\n", p + 1)
    if p != -1:
        return p
    p = text.rfind("\n", 1, max(i, 1))
    while p > 0 and text[p - 1] in WHITE_SPACE:
        p = text.rfind("\n", 1, p)
    return p if p > 0 else -1


def chunks(text, size=1 << 20):
    """text in pieces of about size characters, cut only at safe_cut places"""
    start = 0
    while start < len(text):
        end = safe_cut(text, start + size) if start + size < len(text) else -1
        if end <= start:
            end = len(text)
        yield text[start:end]
        start = end


def progress(what, done, total):
    """one line about a long job, rewritten in place on a terminal (only for inputs of 4 MB or more)"""
    if total < 4 << 20:
        return
    if sys.stderr.isatty():
        print(f"\r{what}: {done / total:4.0%} of {total / 1e6:.0f} MB", end="\n" if done >= total else "", file=sys.stderr, flush=True)
    elif done >= total:
        print(f"{what}: done, {total / 1e6:.0f} MB", file=sys.stderr, flush=True)


def train_bpe(text, vocab):
    """A byte-level BPE of `vocab` tokens trained on text (pairs seen at least twice), the last id
    <|endoftext|>"""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        die("--vocab needs Hugging Face's tokenizers package, which is not installed: pip install tokenizers")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab - 1, min_frequency=2, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=sys.stderr.isatty() and len(text) >= 4 << 20)
    tok.train_from_iterator(chunks(text), trainer=trainer, length=len(text) // (1 << 20) + 1)
    got = tok.get_vocab_size() + 1
    if got < vocab:
        die(f"the train text ({len(text.encode())} bytes) is too small for --vocab {vocab}: it repeats enough pairs for "
            f"{got - 257} merges, a vocab of {got}; give --vocab {got} or less, or more text")
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def bpe_encode(tok, text, what):
    """text -> ids, in chunks cut at safe places (the same ids as one encode of the whole text)"""
    ids, done, total = [], 0, len(text)
    batch = []
    for c in chunks(text):
        batch.append(c)
        if len(batch) == 16:
            ids.extend(i for e in tok.encode_batch(batch) for i in e.ids)
            done += sum(len(b) for b in batch)
            batch = []
            progress(what, done, total)
    ids.extend(i for e in tok.encode_batch(batch) for i in e.ids)
    progress(what, total, total)
    return ids


def tok_bytes(tok, i):
    """the bytes of token i of a byte-level BPE (an added token: its text)"""
    s = tok.id_to_token(i)
    if s == "<|endoftext|>" or any(c not in BYTE_OF for c in s):
        return s.encode()
    return bytes(BYTE_OF[c] for c in s)


def bytes_to_unicode():
    """GPT-2's map of the 256 bytes to printable characters, the alphabet of a byte-level BPE's vocab"""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


BYTE_OF = {c: b for b, c in bytes_to_unicode().items()}


def load_tokenizer_json(path):
    """an existing tokenizer.json for --encode-with"""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        die("--encode-with needs Hugging Face's tokenizers package, which is not installed: pip install tokenizers")
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:
        die(f"cannot read tokenizer {path} ({type(e).__name__}): give a Hugging Face tokenizer.json")
    if tok.get_vocab_size() > 65536:
        die(f"tokenizer {path} has vocab {tok.get_vocab_size()}: token files hold ids below 65536")
    return tok


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
    ap.add_argument("--vocab", type=int, metavar="N", help="train a byte-level BPE of N tokens on the text (Hugging Face tokenizers)")
    ap.add_argument("--encode-with", metavar="FILE", help="encode with an existing tokenizer.json (e.g. GPT-2's) instead")
    ap.add_argument("--bpe", action="store_true", help="GPT-2 BPE tokens via tiktoken")
    ap.add_argument("--tokenizer", metavar="PATH", help="also write an llm.c tokenizer file")
    args = ap.parse_args()

    if not (0.0 < args.val_frac < 1.0):  # also rejects nan
        die(f"--val-frac must be strictly between 0 and 1, got {args.val_frac}")
    if sum([args.vocab is not None, args.bpe, args.encode_with is not None]) > 1:
        die("--vocab N trains a BPE of your own, --encode-with FILE uses a tokenizer.json, --bpe uses tiktoken's GPT-2: give one of them")
    if args.vocab is not None and not (257 <= args.vocab <= 65536):
        die(f"--vocab {args.vocab}: a BPE vocab holds the 256 bytes, <|endoftext|> and the merges, and token files hold ids "
            "below 65536: give 257 <= N <= 65536 (e.g. 2048 or 8192; without --vocab the tokens are bytes)")
    try:
        with open(args.input, "rb") as f:
            data = f.read()
    except OSError as e:
        die(f"cannot read {args.input}: {e.strerror}")
    try:
        data.decode("utf-8")  # validate only; byte-level tokens are the raw bytes
    except UnicodeDecodeError as e:
        die(f"{args.input} is not valid UTF-8 (byte offset {e.start})")
    if not data.strip():
        die(f"{args.input} is empty{' (only whitespace)' if data else ''}: give a text file with the text to train on")

    n_val = int(round(len(data) * args.val_frac))
    split = len(data) - n_val
    suffix = f"_bpe{args.vocab}" if args.vocab else "_hf" if args.encode_with else "_gpt2" if args.bpe else ""
    name = args.name or os.path.splitext(os.path.basename(args.input))[0] + suffix

    if args.vocab or args.encode_with:
        text = data.decode("utf-8")
        cut = safe_cut(text, len(data[:split].decode("utf-8", errors="ignore")))
        if cut <= 0:
            die(f"{args.input} has no line that starts after a non-space character, where train and val can be split "
                "without changing the val text: give a text of several lines")
        tok = load_tokenizer_json(args.encode_with) if args.encode_with else train_bpe(text[:cut], args.vocab)
        eot = tok.token_to_id("<|endoftext|>")
        if eot is None:
            die(f"tokenizer {args.encode_with} has no <|endoftext|> token, which starts each split")
        train = [eot] + bpe_encode(tok, text[:cut], "encoding train")
        val = [eot] + bpe_encode(tok, text[cut:], "encoding val")
        val_bytes = len(text[cut:].encode("utf-8"))
    elif args.bpe:
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
        if args.vocab or args.encode_with:
            tok_json = os.path.join(args.outdir, f"{name}_tokenizer.json")
            if args.encode_with:
                if not (os.path.exists(tok_json) and os.path.samefile(args.encode_with, tok_json)):
                    shutil.copyfile(args.encode_with, tok_json)
            else:
                tok.save(tok_json)
            pieces = [tok_bytes(tok, i) for i in range(tok.get_vocab_size())]
            tok_bin = args.tokenizer or os.path.join(args.outdir, f"{name}_tokenizer.bin")
            if max(len(p) for p in pieces) <= 255:  # llm.c's file holds a token in at most 255 bytes
                write_tokenizer(tok_bin, pieces, eot)
            else:
                tok_bin = None
        elif args.tokenizer:
            if args.bpe:
                pieces = [enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)]
            else:
                pieces = [bytes([b]) for b in range(256)]
            write_tokenizer(args.tokenizer, pieces, GPT2_EOT if args.bpe else 0)
    except OSError as e:
        die(f"cannot write output: {e}")

    kind = f"BPE, vocab {args.vocab}" if args.vocab else f"BPE of {args.encode_with}" if args.encode_with else "GPT-2 BPE" if args.bpe else "byte-level"
    print(f"wrote {paths[0]}: {len(train)} tokens ({kind})")
    print(f"wrote {paths[1]}: {len(val)} tokens ({kind})")
    if args.vocab or args.encode_with:
        print(f"wrote {tok_json} (tp finds it next to -i) and " +
              (f"{tok_bin} (llm.c's format)" if tok_bin else "no llm.c tokenizer file (a token is longer than its 255 bytes)"))
        print(f"val text: {val_bytes} bytes in {len(val) - 1} tokens, {val_bytes / (len(val) - 1):.4f} bytes per token "
              f"(val loss per byte = val loss / {val_bytes / (len(val) - 1):.4f})")
    elif args.tokenizer:
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

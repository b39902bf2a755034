#!/usr/bin/env bash
# Download Tiny Shakespeare and write llm.c token files into data/tinyshakespeare/:
# byte-level tiny_shakespeare_{train,val}.bin, plus GPT-2 BPE tiny_shakespeare_gpt2_{train,val}.bin
# when tiktoken and its GPT-2 encoding are available. Needs internet and curl or wget. Run from anywhere.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="$here/tinyshakespeare"
url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
mkdir -p "$dir"

if [ ! -s "$dir/input.txt" ]; then
    # download to a temp name so a failed transfer never leaves a truncated input.txt behind
    tmp="$dir/input.txt.part"
    if command -v curl >/dev/null 2>&1; then
        curl -fsSL "$url" -o "$tmp" || { rm -f "$tmp"; echo "error: download failed: $url" >&2; exit 1; }
    elif command -v wget >/dev/null 2>&1; then
        wget -q "$url" -O "$tmp" || { rm -f "$tmp"; echo "error: download failed: $url" >&2; exit 1; }
    else
        echo "error: need curl or wget to download $url" >&2
        exit 1
    fi
    mv "$tmp" "$dir/input.txt"
fi

python3 "$here/prepare.py" "$dir/input.txt" "$dir" --name tiny_shakespeare
# the GPT-2 BPE version is a bonus: without tiktoken, or without the encoding it downloads on first use,
# the byte-level files above are kept and the script still succeeds
if ! python3 -c "import tiktoken" >/dev/null 2>&1; then
    echo "note: tiktoken is not installed, so no GPT-2 BPE version (pip install tiktoken, then run this again)"
elif ! python3 "$here/prepare.py" "$dir/input.txt" "$dir" --name tiny_shakespeare_gpt2 --bpe; then
    echo "note: no GPT-2 BPE version (the error above says why and how to fix it); the byte-level files are ready"
fi

#!/usr/bin/env bash
# Download Tiny Shakespeare and write llm.c token files into data/tinyshakespeare/:
# byte-level tiny_shakespeare_{train,val}.bin, plus GPT-2 BPE tiny_shakespeare_gpt2_{train,val}.bin
# when tiktoken is installed. Needs internet and curl or wget. Run from anywhere.
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
if python3 -c "import tiktoken" >/dev/null 2>&1; then
    python3 "$here/prepare.py" "$dir/input.txt" "$dir" --name tiny_shakespeare_gpt2 --bpe
else
    echo "tiktoken not installed: skipping the GPT-2 BPE version (pip install tiktoken)"
fi

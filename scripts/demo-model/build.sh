#!/usr/bin/env bash
# Rebuilds engine/data/demo/gemma4-tiny-demo.gguf, the built-in demo model
# (engine/src/synth/demo.rs):
#   1. `gemtune synth tiny f32` writes the template: the tiny preset's
#      metadata, tokenizer and tensor layout;
#   2. train.py trains every tensor of that layout on the English prose of
#      engine/data/corpus/ with JAX on the CPU (tokenized by the template's
#      own tokenizer through `gemtune tokenize`) and writes the F32 weights;
#   3. `gemtune synth tiny q8_0 --weights` stores them in the engine's Q8_0
#      layout.
# The Python packages go into a virtual environment under target/.
# Usage: scripts/demo-model/build.sh [train.py options, e.g. --steps 160]
set -euo pipefail
cd "$(dirname "$0")/../.."
work=target/demo-model
venv=$work/venv
mkdir -p "$work"
if [[ ! -x $venv/bin/python ]]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check \
    "jax==0.10.2" "jaxlib==0.10.2" "numpy==2.4.6" "gguf==0.19.0"
cargo build --quiet --locked --release -p gemtune
bin=target/release/gemtune
"$bin" synth tiny f32 "$work/template.gguf" >/dev/null
"$venv/bin/python" scripts/demo-model/train.py --template "$work/template.gguf" \
    --gemtune "$bin" --out "$work/trained-f32.gguf" "$@"
"$bin" synth tiny q8_0 engine/data/demo/gemma4-tiny-demo.gguf --weights "$work/trained-f32.gguf"
echo "rebuild gemtune to embed it; check with: cargo run --release -p gemtune -- run -p Hello" >&2

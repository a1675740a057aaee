#!/usr/bin/env bash
# Rebuilds every test vector: the tiny models and pipeline goldens, then the
# noise and schedule vectors and the DF11 files written by the official
# compressor (generate.py clears goldens/, so this order).
set -euo pipefail
# The TAESD-layout preview decoder is built from taesd.py's modules (github.com/madebyollin/taesd).
: "${TAESD_PY:?set TAESD_PY to taesd.py from github.com/madebyollin/taesd}"
export TAESD_PY
cd "$(dirname "$0")/.."
python3 test_vectors/generate.py
python3 test_vectors/generate_wide_heads.py
python3 test_vectors/generate_numerics.py
python3 test_vectors/generate_negative.py
python3 test_vectors/generate_df11.py
python3 test_vectors/generate_configs.py
python3 test_vectors/generate_vae_encoder.py
python3 test_vectors/generate_references.py
(cd test_vectors && python3 generate_inpaint.py)
python3 test_vectors/generate_mask_crop.py
python3 test_vectors/generate_lora.py
python3 test_vectors/generate_gguf.py
(cd test_vectors && python3 generate_gguf_model.py)
python3 test_vectors/generate_kquants.py
python3 test_vectors/generate_quantize.py
python3 test_vectors/generate_previews.py
python3 test_vectors/generate_tiny_decoder.py

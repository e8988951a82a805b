#!/usr/bin/env bash
# One short GPU check for a lent GPU machine: the CUDA-marked tests, then one
# real search of resnet50 at 224 px. Writes its logs and outputs under $OUT
# (or ./device-check-out). Usage: bash benchmarks/device_check.sh
set -uo pipefail
OUT_DIR="${OUT:-device-check-out}"
mkdir -p "$OUT_DIR"
python3 -m venv .venv-gpu && .venv-gpu/bin/pip install -q -e ".[test]" > "$OUT_DIR/install.log" 2>&1
.venv-gpu/bin/autotune probe --json > "$OUT_DIR/probe.json" 2>&1
.venv-gpu/bin/python -m pytest -m cuda -q tests 2>&1 | tee "$OUT_DIR/pytest-cuda.log" | tail -5
( time .venv-gpu/bin/autotune search --model resnet50 --image-size 224 --trials 12 --trial-seconds 5 \
      --device cuda --out "$OUT_DIR/search" --json > "$OUT_DIR/search.json" ) 2> "$OUT_DIR/search.log"
tail -5 "$OUT_DIR/search.log"
# DDP trials with nccl (one rank per GPU; needs 2 GPUs, one line of the search otherwise says why).
( time .venv-gpu/bin/autotune search --model resnet18 --image-size 64 --trials 6 --trial-seconds 3 \
      --device cuda --nproc-per-node 2 --out "$OUT_DIR/search-ddp" --json > "$OUT_DIR/search-ddp.json" ) 2> "$OUT_DIR/search-ddp.log"
tail -3 "$OUT_DIR/search-ddp.log"
# Parallel single-GPU trials on every GPU the probe sees.
( time .venv-gpu/bin/autotune search --model resnet18 --image-size 64 --trials 6 --trial-seconds 3 \
      --devices all --out "$OUT_DIR/search-devices" --json > "$OUT_DIR/search-devices.json" ) 2> "$OUT_DIR/search-devices.log"
tail -3 "$OUT_DIR/search-devices.log"

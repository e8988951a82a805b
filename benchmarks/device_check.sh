#!/usr/bin/env bash
# One short GPU check for a lent GPU machine (under 8 minutes): the CUDA-marked
# tests, one `autotune trial` per torch knob, then one real search of resnet50
# at 224 px with 30 trials. Writes its logs and outputs under $OUT (or
# ./device-check-out). Usage: bash benchmarks/device_check.sh
set -uo pipefail
OUT_DIR="${OUT:-device-check-out}"
mkdir -p "$OUT_DIR"
python3 -m venv .venv-gpu && .venv-gpu/bin/pip install -q -e ".[test]" > "$OUT_DIR/install.log" 2>&1
.venv-gpu/bin/autotune probe --json > "$OUT_DIR/probe.json" 2>&1
.venv-gpu/bin/python -m pytest -m cuda -q tests 2>&1 | tee "$OUT_DIR/pytest-cuda.log" | tail -5
# One trial per torch knob (resnet18 at 64 px, 2 s): each line: the knob, then the TrialResult as JSON.
for knob in "num_threads=4" "cudnn_benchmark=true" "tf32=true" "optimizer_impl=fused" "optimizer_impl=foreach" \
            "decode=gpu" "compile=default" "compile=reduce-overhead"; do
  printf '%s ' "$knob" >> "$OUT_DIR/knob-trials.txt"
  .venv-gpu/bin/autotune trial --model resnet18 --image-size 64 --device cuda --trial-seconds 2 --batch-size 128 \
      --workers 4 --prefetch 2 --pin-memory --set "$knob" --json >> "$OUT_DIR/knob-trials.txt" 2>> "$OUT_DIR/knob-trials.log" \
      || echo '{"status": "cli error, see knob-trials.log"}' >> "$OUT_DIR/knob-trials.txt"
done
cat "$OUT_DIR/knob-trials.txt" | cut -c1-200
( time .venv-gpu/bin/autotune search --model resnet50 --image-size 224 --trials 30 --trial-seconds 2 \
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

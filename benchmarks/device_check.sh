#!/usr/bin/env bash
# The GPU check for a lent GPU machine, in two stages of under 5 minutes each
# (one `run` call each; both by default):
#   bash benchmarks/device_check.sh tests    # probe, the CUDA-marked tests, one `autotune trial` per torch knob
#   bash benchmarks/device_check.sh search   # one real search of resnet50 at 224 px, 30 trials; --devices all
# Before the first call, run benchmarks/device_wheels.sh here and carry .whl
# (the GPU machine has torch but not optuna, and fetches nothing). Logs and
# outputs go under $OUT (or ./device-check-out).
set -uo pipefail
cd "$(dirname "$0")/.."
STAGE="${1:-all}"
case "$STAGE" in all|tests|search) ;; *) echo "device_check: unknown stage '$STAGE' (all, tests or search)" >&2; exit 2 ;; esac
OUT_DIR="${OUT:-device-check-out}"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
if ! python3 -c "import optuna" 2>/dev/null; then
    if ! ls .whl/*.whl > /dev/null 2>&1; then
        echo "device_check: optuna is missing and there is no .whl; run benchmarks/device_wheels.sh here first and carry .whl" >&2
        exit 1
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        > "$OUT_DIR/install.log" 2>&1 || { echo "device_check: installing .whl failed, see install.log" >&2; exit 1; }
fi
# The checkout itself is the package (no install): the repository root first, then the carried wheels.
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
AUTOTUNE=(python3 -m autotune)

if [ "$STAGE" = all ] || [ "$STAGE" = tests ]; then
    python3 -c "import torch, torchvision, optuna; print('torch', torch.__version__, 'torchvision', torchvision.__version__, \
'optuna', optuna.__version__, 'cuda', torch.cuda.is_available())" | tee "$OUT_DIR/versions.txt"
    "${AUTOTUNE[@]}" probe --json > "$OUT_DIR/probe.json" 2>&1
    # -o addopts='': one process (one GPU; the machine has no pytest-xdist), the slowest tests listed.
    timeout 180 python3 -m pytest -o addopts='-ra --durations=20' -m cuda -q -p no:cacheprovider tests 2>&1 | tee "$OUT_DIR/pytest-cuda.log" | tail -15
    # One trial per torch knob (resnet18 at 64 px, 2 s): each line: the knob, then the TrialResult as JSON.
    for knob in "num_threads=4" "cudnn_benchmark=true" "tf32=true" "optimizer_impl=fused" "optimizer_impl=foreach" \
                "decode=gpu" "compile=default" "compile=reduce-overhead"; do
        printf '%s ' "$knob" >> "$OUT_DIR/knob-trials.txt"
        timeout 90 "${AUTOTUNE[@]}" trial --model resnet18 --image-size 64 --device cuda --trial-seconds 2 --batch-size 128 \
            --workers 4 --prefetch 2 --pin-memory --set "$knob" --json >> "$OUT_DIR/knob-trials.txt" 2>> "$OUT_DIR/knob-trials.log" \
            || echo '{"status": "failed or over 90 s, see knob-trials.log"}' >> "$OUT_DIR/knob-trials.txt"
    done
    cut -c1-240 "$OUT_DIR/knob-trials.txt"
fi

if [ "$STAGE" = all ] || [ "$STAGE" = search ]; then
    # compile=off: compiling resnet50 takes minutes per trial and is checked on resnet18 above.
    ( time timeout 240 "${AUTOTUNE[@]}" search --model resnet50 --image-size 224 --trials 30 --trial-seconds 2 \
          --device cuda --set compile=off --out "$OUT_DIR/search" --json > "$OUT_DIR/search.json" ) 2> "$OUT_DIR/search.log"
    tail -8 "$OUT_DIR/search.log"
    # Parallel single-GPU trials on every GPU the probe sees (one slot on a 1-GPU machine); DDP needs 2 GPUs.
    ( time timeout 90 "${AUTOTUNE[@]}" search --model resnet18 --image-size 64 --trials 6 --trial-seconds 2 \
          --devices all --out "$OUT_DIR/search-devices" --json > "$OUT_DIR/search-devices.json" ) 2> "$OUT_DIR/search-devices.log"
    tail -3 "$OUT_DIR/search-devices.log"
fi

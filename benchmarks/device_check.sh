#!/usr/bin/env bash
# The GPU check for a lent GPU machine, in two `run` calls made back to back (the machine stays warm 30 s),
# each time-boxed to BUDGET_S seconds so that it ends inside its timeout_s with every stage's output kept:
#   bash benchmarks/device_check.sh tests    # env, tests, knobs   (BUDGET_S default 280: timeout_s=300)
#   bash benchmarks/device_check.sh search   # env, search, script (BUDGET_S default 420: timeout_s=450)
#   env     versions, nvidia-smi, `autotune probe --json`
#   search  one real search: resnet50 at 224 px on the synthetic JPEGs, 12 trials of 2 s, compile off (at most 240 s,
#           less where the budget leaves the script stage under 150 s)
#   script  the emitted train.py for 40 optimizer steps, plain and under torchrun (DDP, NCCL, one rank)
#   tests   benchmarks/gpu_decode_check.py's variants, then the CUDA-marked tests (4 pytest-xdist processes on the
#           one GPU: correctness, not speed)
#   knobs   one `autotune trial` of resnet18 at 64 px per torch knob, while time is left
# Before the call, run benchmarks/device_wheels.sh here and carry .whl (the GPU machine has torch but not
# optuna, and fetches nothing):  run(command="bash benchmarks/device_check.sh tests", carry=[".whl"], timeout_s=300)
# Everything lands in $OUT (or ./device-check-out): summary.log, pytest-cuda.log, device-check.tgz (the search directory and logs), knobs.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
STAGE="${1:-}"
case "$STAGE" in
    tests) BUDGET_S="${BUDGET_S:-280}" ;;
    search) BUDGET_S="${BUDGET_S:-420}" ;;
    *) echo "device_check: name the stage: tests or search" >&2; exit 2 ;;
esac
OUT_DIR="${OUT:-device-check-out}"
WORK=/tmp/device-check
mkdir -p "$OUT_DIR" "$WORK"
exec > >(tee -a "$OUT_DIR/summary.log") 2>&1
export PYTHONUNBUFFERED=1
left() { echo $(( BUDGET_S - SECONDS )); }
stage() { echo; echo "=== $1 (at ${SECONDS} s of ${BUDGET_S})"; }

if ! python3 -c "import optuna, typer" 2>/dev/null || [ -d .whl ]; then
    if ! ls .whl/*.whl > /dev/null 2>&1; then
        echo "device_check: optuna is missing and there is no .whl; run benchmarks/device_wheels.sh here first and carry .whl"
        exit 1
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        > "$WORK/install.log" 2>&1 || { cat "$WORK/install.log"; echo "device_check: installing .whl failed"; exit 1; }
fi
# The checkout itself is the package (no install): the repository root first, then the carried wheels.
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
AUTOTUNE=(python3 -m autotune)

stage env
date -u +%Y-%m-%dT%H:%M:%SZ
python3 -c "import torch, torchvision, optuna, typer; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'torchvision', torchvision.__version__, 'optuna', optuna.__version__, 'typer', typer.__version__, \
'gpu', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
nproc
"${AUTOTUNE[@]}" probe --json > "$WORK/probe.json"; echo "probe exit $?"
"${AUTOTUNE[@]}" probe | head -30

# The search's synthetic JPEGs (16384 on CUDA), written once into the cache: beside the tests (one core), or here
# before the search's time box when the machine was not kept warm between the two calls.
SYNTHETIC=(python3 -c "from autotune.workloads.data import ensure_synthetic, SYNTHETIC_IMAGES_CUDA; ensure_synthetic(None, SYNTHETIC_IMAGES_CUDA)")

if [ "$STAGE" = search ]; then
stage search
start=$SECONDS
"${SYNTHETIC[@]}"
echo "synthetic JPEGs ready after $(( SECONDS - start )) s"
# Ctrl-C (SIGINT) at its time box: a stopped search keeps its measured trials (trials.csv, study.db).
S=(--model resnet50 --image-size 224 --trials 12 --trial-seconds 2 --device cuda --set compile=off --out "$WORK/search")
echo "autotune search ${S[*]}"
start=$SECONDS
box=$(( $(left) - 150 )); [ "$box" -gt 240 ] && box=240  # the script stage needs about 140 s after it
echo "search time box ${box} s"
timeout -s INT -k 30 "$box" "${AUTOTUNE[@]}" search "${S[@]}" > "$WORK/search-summary.txt" 2> "$WORK/search.log"
echo "search exit $? after $(( SECONDS - start )) s"
tail -30 "$WORK/search.log"
cat "$WORK/search-summary.txt"
cut -d, -f1-40 "$WORK/search/trials.csv" 2>/dev/null | head -40
tar czf "$OUT_DIR/device-check.tgz" -C "$WORK" --exclude='*.pt' . 2>/dev/null

stage script
if [ -f "$WORK/search/train.py" ] && [ "$(left)" -gt 140 ]; then
    grep -n "^# \|default=" "$WORK/search/train.py" | head -5
    start=$SECONDS
    # 40 steps: at batch 1024 the first epoch's steps took 27 s on the H200 host (workers' first batches, cuDNN autotuning)
    timeout 70 python3 "$WORK/search/train.py" --max-steps 40 > "$WORK/train-plain.log" 2>&1
    echo "train.py exit $? after $(( SECONDS - start )) s"; tail -6 "$WORK/train-plain.log"
    start=$SECONDS
    timeout 70 torchrun --standalone --nproc-per-node 1 "$WORK/search/train.py" --max-steps 40 --output-dir "$WORK/train-ddp" \
        > "$WORK/train-ddp.log" 2>&1
    echo "torchrun train.py exit $? after $(( SECONDS - start )) s"; tail -6 "$WORK/train-ddp.log"
    tar czf "$OUT_DIR/device-check.tgz" -C "$WORK" --exclude='*.pt' . 2>/dev/null
fi

fi

if [ "$STAGE" = tests ]; then
stage tests
"${SYNTHETIC[@]}" > "$WORK/synthetic.log" 2>&1 &
synthetic_pid=$!
# Where a decode=gpu loader stops, one variant per process; workers-torchvision-read is expected to hang (exit 1, stacks).
checks=()
for variant in no-workers workers workers-torchvision-read; do
    timeout 40 python3 -m benchmarks.gpu_decode_check "$variant" > "$WORK/decode-$variant.log" 2>&1 &
    checks+=($!)
done
wait "${checks[@]}"
for variant in no-workers workers workers-torchvision-read; do echo "decode check $variant: $(tail -1 "$WORK/decode-$variant.log")"; done
# -o addopts='...': 4 processes on the one GPU, each test file split across them; the slowest tests listed.
timeout "$(( $(left) - 60 ))" python3 -m pytest -o addopts='-ra --durations=25' -n 4 --dist load -m cuda -q -p no:cacheprovider tests \
    > "$OUT_DIR/pytest-cuda.log" 2>&1
echo "pytest exit $?"
tail -40 "$OUT_DIR/pytest-cuda.log"

stage knobs
# One trial per torch knob (resnet18 at 64 px, 2 s): each line: the knob, then the TrialResult as JSON. The quick knobs
# first: each compile trial warms up for about 30 s (2026-12-04), and the time box ended the stage before the last two.
# cudnn_benchmark=false then =true (the others leave it off) isolate cuDNN autotuning's share of a GPU trial's warm-up.
for knob in "cudnn_benchmark=false" "cudnn_benchmark=true" "decode=gpu" "optimizer_impl=fused" "tf32=true" "num_threads=4" "compile=default" "compile=reduce-overhead"; do
    [ "$(left)" -gt 45 ] || { echo "knobs: out of time before $knob"; break; }
    result=$(timeout "$(( $(left) - 10 ))" "${AUTOTUNE[@]}" trial --model resnet18 --image-size 64 --device cuda --trial-seconds 2 \
        --batch-size 128 --workers 4 --prefetch 2 --pin-memory --set "$knob" --json 2>> "$WORK/knobs.log")
    killed='{"status": "no result: killed at its time box, see knobs.log"}'
    echo "$knob ${result:-$killed}" >> "$OUT_DIR/knobs.txt"
done
cut -c1-300 "$OUT_DIR/knobs.txt"
# The search stage reuses the JPEGs written beside the tests: wait for them while time is left (else it writes them).
while kill -0 "$synthetic_pid" 2> /dev/null && [ "$(left)" -gt 5 ]; do sleep 1; done
if kill -0 "$synthetic_pid" 2> /dev/null; then echo "synthetic JPEGs: still being written at the time box"
else wait "$synthetic_pid"; echo "synthetic JPEGs: exit $?"; tail -2 "$WORK/synthetic.log"; fi
tar czf "$OUT_DIR/device-check.tgz" -C "$WORK" --exclude='*.pt' . 2>/dev/null
fi
echo "=== done at ${SECONDS} s"

#!/usr/bin/env bash
# One device call that verifies and measures everything (about 15 minutes of device
# time in two parts; each step has its own time limit and writes under $OUT):
#   bash perf/gpu_run.sh tests   # GPU test suite (PTX test excluded), nbdnn check
#   bash perf/gpu_run.sh perf    # nbdnn bench, SGEMM and conv vs cuBLAS/cuDNN, host cost
# Run from the repository root on the GPU machine (no install: PYTHONPATH=.).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/nbdnn-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
python3 -c "import numba, numba_cuda, numpy, torch; print(numba.__version__, \
numba_cuda.__version__, numpy.__version__, torch.__version__, torch.backends.cudnn.version())" \
    >> "$OUT/gpu.txt" 2>&1
case "${1:-tests}" in
tests)
    NBDNN_HYPOTHESIS_PROFILE=dev timeout 420 python3 -m pytest -q -p no:cacheprovider tests \
        --ignore=tests/test_ptx.py > "$OUT/pytest.log" 2>&1
    timeout 120 python3 -m nbdnn check --examples 2 > "$OUT/check.log" 2>&1
    tail -5 "$OUT/pytest.log" "$OUT/check.log" ;;
perf)
    # at most 8 files come back from a device call: one log for every step
    timeout 240 python3 -m nbdnn bench --no-cpu --json "$OUT/bench.json" --plot "$OUT/bench.png" \
        > "$OUT/perf.log" 2>&1
    timeout 150 python3 perf/sgemm.py --json "$OUT/sgemm.json" >> "$OUT/perf.log" 2>&1
    timeout 240 python3 perf/conv.py --json "$OUT/conv.json" >> "$OUT/perf.log" 2>&1
    timeout 60 python3 perf/launch_overhead.py --json "$OUT/launch.json" >> "$OUT/perf.log" 2>&1
    tail -40 "$OUT/perf.log" ;;
esac

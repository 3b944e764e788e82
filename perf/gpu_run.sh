#!/usr/bin/env bash
# Device calls that verify and measure everything; each step has its own time limit
# and writes under $OUT. JIT-compiling every kernel signature makes the whole suite
# longer than one 10-minute call in one process; `suite` runs it in fourteen parallel
# pytest processes (JIT is CPU-bound; the machine has 16 cores): ~5-8 minutes, and
# `gemm` the tensor-core tests in ten.
#   bash perf/gpu_run.sh suite                # the whole suite minus the PTX test and the
#                                             # tensor-core tests (`gemm`), + check
#                                             # (14 processes, one log: $OUT/suite.log)
#   bash perf/gpu_run.sh tests [pytest args]   # default: tests/ minus the PTX test
#       e.g. ... tests tests/test_crosscheck.py -k "softmax or reduce or activation"
#            ... tests tests/test_crosscheck.py -k "matmul or conv or norm or dropout"
#            ... tests tests --ignore=tests/test_crosscheck.py --ignore=tests/test_ptx.py
#   bash perf/gpu_run.sh check                # nbdnn check, every op and dtype
#   bash perf/gpu_run.sh perf                 # nbdnn bench: every row, against PyTorch
#   bash perf/gpu_run.sh compute              # GEMM (perf/suites/gemm.py) and conv vs
#                                             # cuBLAS/cuDNN, host cost
#   bash perf/gpu_run.sh dtypes               # the memory-bound rows in float32, float16 and
#                                             # bfloat16 (issue 23: bf16 at fp16's % of copy)
#   bash perf/gpu_run.sh norm                 # pool and norm ops: path tests, crosscheck and
#                                             # the graph-timed bench rows, in parallel
#   bash perf/gpu_run.sh gemm                 # tests/test_tensorcore*.py, the SASS of the
#                                             # shipped tensor-core kernels, host cost
#   bash perf/gpu_run.sh knobs                # the GEMM's switches: their tests (both ways),
#                                             # the sanitizer over tc_paths' "[knob]" ones
#                                             # (ONLY="[alt]": the others' non-default
#                                             # sides), skinny speed (VARIANTS), timeline
#                                             # (TIMELINE=1)
#   bash perf/gpu_run.sh conv-tc              # issue 24: the tensor-core convolution's and
#                                             # mixed precision's tests, the probe, the demo
#                                             # in bf16 / fp16, 16-bit NHWC ResNet rows
#                                             # (SAN=1: and the sanitizer)
#   bash perf/gpu_run.sh conv-train           # issue 24's training step: the filter gradient's
#                                             # GPU tests (SAN=1: and the sanitizer), run AK's
#                                             # backward fixes against torch, its SASS
#   bash perf/gpu_run.sh train-step           # the training step's kernels tested both
#                                             # ways (SAN=1: sanitized), the step's profile
#                                             # (SWITCHES; SIDES="on off"), ResNet-50; the
#                                             # three do not fit one call (*_LIMIT_S=0)
#   bash perf/gpu_run.sh tf32-conv            # float32 conv in math tf32: tests, then the
#                                             # NHWC ResNet layers against cuDNN's TF32
#   bash perf/gpu_run.sh conv-speed           # the tensor-core conv's tests, conv.py's bf16
#                                             # NHWC layers fwd + bwd against cuDNN, then
#                                             # ALT_LAYERS with each of ALT's switches
#   bash perf/gpu_run.sh ap-checks            # run AO's unfinished tests (16 shards), the
#                                             # new conv kernels' SASS, the 1x1 layers'
#                                             # GEMM tiles (pointwise_tiles.py)
#   bash perf/gpu_run.sh attention            # issue 25: attention's GPU tests (SAN=1: the
#                                             # sanitizer), perf/suites/attention.py
#   bash perf/gpu_run.sh flash                # issue 25's tensor-core forward: tests, (SAN=1)
#                                             # sanitizer, SASS, perf/suites/attention.py
#   bash perf/gpu_run.sh att-verify           # the attention kernels still off or unsanitised:
#                                             # tests, (SAN=1) memcheck and racecheck
#   bash perf/gpu_run.sh att-speed            # decoding (decode.py against decode_split.py),
#                                             # D 64's forward
#                                             # F3 against F1 persistent
#   bash perf/gpu_run.sh att-gemm             # attention as GEMMs: tests, (SAN=1) memcheck,
#                                             # bf16 masked and D 96 rows, float32 3xtf32,
#                                             # the fp32 "gpt" step
#   bash perf/gpu_run.sh att-tf32             # float32's fused TF32 forward: tests, (SAN=1)
#                                             # sanitizer, SASS
#   bash perf/gpu_run.sh att-tf32-speed       # its 3xtf32 / tf32 rows against gemm.py's
#   bash perf/gpu_run.sh torch                # nbdnn.torch: its tests, sharded (CUDA and CPU)
#   bash perf/gpu_run.sh torch-perf           # its host cost, ResNet-50 steps against native
#   bash perf/gpu_run.sh capture              # TMA maps inside stream captures (run AX): the
#                                             # tensor-core tests and torch.cuda.graph ones,
#                                             # (SAN=1) sanitizer, then CONFIGS' steps
#   bash perf/gpu_run.sh capture-probe        # capture_probe.py's four ways (run AX call 2)
#   bash perf/gpu_run.sh owed-all             # issue 26's compiling parts side by side
#                                             # (the torch tests, the graph-leak race,
#                                             # ResNet-50 rows), the kernel cache packed
#   bash perf/gpu_run.sh owed                 # then its timed rows alone: ResNet-50 in
#                                             # CONFIGS, host cost, torch-profile
#   bash perf/gpu_run.sh pack                 # the kernel cache (.kcache/) into $OUT, to
#                                             # carry to a later machine
#   bash perf/gpu_run.sh torch-profile        # issue 26: where the converted ResNet-50's
#                                             # eager step spends its time beside native's
#                                             # (GPU busy, nbdnn/PyTorch kernels, blocking
#                                             # calls, numba's driver-layer calls, maps)
#   bash perf/gpu_run.sh devices              # issue 27's tests on this machine's GPUs
#   bash perf/gpu_run.sh ddp                  # nvidia-h200-x2: those, then perf/suites/ddp.py
#   bash perf/gpu_run.sh att-all              # every attention test, 8 shards (<= 330 s)
#   bash perf/gpu_run.sh att-tf32-tiles       # its block shapes (KEY_TILES, Q_RAW) timed
#   bash perf/gpu_run.sh att-decode           # decode_split's chunking swept: decode rows
#   bash perf/gpu_run.sh att-train            # the tensor-core backward's speed, the
#                                             # transformer step (transformer_step.py)
#   bash perf/gpu_run.sh ap-final             # conv.py bf16 NHWC "auto" and "gemm", both
#                                             # gradients; NCHW against channels_first.ON
#   bash perf/gpu_run.sh layout-moves         # run AN's tiled transpose, 1x1 data-gradient
#                                             # GEMM, NCHW through NHWC: tests, A/B, conv.py
#   bash perf/gpu_run.sh bn-columns           # batch_norm/columns.py: tests, crosscheck,
#                                             # (SAN=1) sanitizer, A/B, the step's profile
#   bash perf/gpu_run.sh ncu-gemm             # Nsight Compute: the tensor-core GEMM's skinny,
#                                             # ragged, square and tf32 cases beside cuBLAS's
#   bash perf/gpu_run.sh gemm-speed           # perf/suites/gemm.py: every dtype and math mode
#                                             # against cuBLAS, then the mma.sync kernel (forced),
#                                             # tf32's operand pass (tf32_gemm.py, 4096)
#   bash perf/gpu_run.sh sanitize OPS...      # compute-sanitizer memcheck, then racecheck,
#                                             # over `nbdnn check --ops OPS --examples 1`;
#                                             # OPS "tc": over perf/tools/tc_paths.py
#                                             # ("tc --only maps": the paths so labelled)
#   bash perf/gpu_run.sh compare DIR          # same behaviour, proved: host cost per call and
#                                             # graph-timed bench rows of the checkout in DIR
#                                             # (its perf/ and nbdnn/) and of this tree,
#                                             # alternated in one call (ratios hold, hosts drift)
# Run from the repository root on the GPU machine (no install: PYTHONPATH=.).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
# compiled kernels kept between processes and calls (nbdnn/cuda/runtime/kernel_cache/):
# .kcache/ stays on a warm machine; `pack` sends it back under $OUT, and a later call
# that carries ".kcache" starts from it (NBDNN_KERNEL_CACHE=0: off)
export NBDNN_KERNEL_CACHE=${NBDNN_KERNEL_CACHE-$PWD/.kcache}
OUT=${OUT:-/tmp/nbdnn-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
python3 -c "import numba, numba_cuda, numpy, torch; print(numba.__version__, \
numba_cuda.__version__, numpy.__version__, torch.__version__, torch.backends.cudnn.version())" \
    >> "$OUT/gpu.txt" 2>&1
summary() {  # each log's sanitizer verdicts and last line, its first failures
    for f in "$@"; do
        [ -f "$OUT/$f.log" ] || continue
        echo "$f: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$f.log" | tr '\n' ' ')\
$(tail -1 "$OUT/$f.log")"
        grep -E "^(FAILED|ERROR)" "$OUT/$f.log" | head -8
    done
}
sanitized() {  # SAN=1: memcheck, then racecheck, over pytest ARGS, in the background;
    # logs $OUT/NAME-memcheck.log, $OUT/NAME-racecheck.log
    local name=$1 limit=$2
    shift 2
    [ -n "${SAN:-}" ] || return 0
    for tool in memcheck racecheck; do
        timeout $limit compute-sanitizer --report-api-errors no --print-limit 10 --tool $tool \
            python3 -m pytest -q -p no:cacheprovider "$@" > "$OUT/$name-$tool.log" 2>&1
    done &
}
sharded() {  # NAME SHARDS LIMIT FILES...: the files' tests in SHARDS processes of
    # consecutive tests (the kernels' JIT is CPU-bound: 16 cores), -v to name a hung
    # test; one log $OUT/NAME.log, each shard's last line and first failures printed
    local name=$1 S=$2 limit=$3 i n
    shift 3
    python3 -m pytest -q --collect-only -p no:cacheprovider "$@" | grep "::" > "$OUT/$name.ids"
    n=$(wc -l < "$OUT/$name.ids")
    for i in $(seq 0 $((S - 1))); do
        mapfile -t ids < <(sed -n "$((i * n / S + 1)),$(((i + 1) * n / S))p" "$OUT/$name.ids")
        [ ${#ids[@]} -gt 0 ] || continue  # (ids hold spaces: "(3, 136, 72)")
        timeout $limit python3 -m pytest -v -p no:cacheprovider "${ids[@]}" \
            > "$OUT/$name.$i.log" 2>&1 &
    done
    wait
    for i in $(seq 0 $((S - 1))); do
        [ -f "$OUT/$name.$i.log" ] || continue
        echo "$name shard $i: $(tail -1 "$OUT/$name.$i.log")"
        grep -E "FAILED|ERROR" "$OUT/$name.$i.log" | head -5
    done
    cat "$OUT/$name".*.log > "$OUT/$name.log"; rm -f "$OUT/$name".*.log "$OUT/$name.ids"
}
mode=${1:-tests}
shift || true
case "$mode" in
suite)
    export NBDNN_HYPOTHESIS_PROFILE=dev
    T=${SUITE_LIMIT_S:-540}  # less when the call runs something else first
    P="timeout $T python3 -m pytest -q -p no:cacheprovider"
    X=tests/test_crosscheck.py
    L="$OUT/suite"
    mkdir -p "$L"
    $P $X -k "softmax or reduce or activation" > "$L/t1.log" 2>&1 &
    $P $X -k "(matmul or conv) and not bfloat16" > "$L/t2.log" 2>&1 &
    $P $X -k "(matmul or conv) and bfloat16" > "$L/t9.log" 2>&1 &  # (t2 took 436 s alone)
    $P $X -k "not (softmax or reduce or activation or matmul or conv)" > "$L/t3.log" 2>&1 &
    $P $(ls tests/test_[a-f]*.py | grep -v crosscheck) > "$L/t4.log" 2>&1 &
    # test_gpu outgrew 460 s beside the rest of test_[g-z], and its GEMM/conv spill
    # test (JIT of 63 kernels) in any one process (runs O, R, Y): by kernel family
    G=tests/test_gpu.py
    S=spill_at_most
    $P $G -k bit_identical > "$L/t5.log" 2>&1 &
    $P $G -k "$S and not igemm and not dw_tile" > "$L/t6.log" 2>&1 &
    $P $G -k "$S and dw_tile" > "$L/s4.log" 2>&1 &  # (12 tiles at 10-35 s of JIT each)
    $P $G -k "$S and igemm_chunked_t" > "$L/s1.log" 2>&1 &
    $P $G -k "$S and igemm_chunked and not igemm_chunked_t" > "$L/s2.log" 2>&1 &
    $P $G -k "$S and igemm and not igemm_chunked" > "$L/s3.log" 2>&1 &
    $P $G -k "not (bit_identical or $S)" > "$L/t8.log" 2>&1 &
    # test_tensorcore*.py apart: with them, t7 ran out of 560 s at 97% (run AG); alone
    # they JIT ~270 kernel variants, ~30 min of CPU (run AI): `gpu_run.sh gemm` runs them
    # in 10 processes
    $P $(ls tests/test_[g-z]*.py | grep -v "test_ptx\|test_gpu\|test_tensorcore") > "$L/t7.log" 2>&1 &
    timeout $T python3 -m nbdnn check --examples 2 > "$L/check.log" 2>&1 &
    wait  # (a pgrep loop on "pytest" matches this script's own command line)
    for f in "$L"/t?.log "$L"/s?.log "$L/check.log"; do  # the summary, or say none
        echo "$(basename $f): $(grep -E '[0-9]+ (passed|failed|error)|op/dtype pairs' "$f" \
            | tail -n 1 || true)"
    done | sed 's/: $/: no summary (timed out?)/'
    # one file back (a device call returns at most 8)
    for f in "$L"/t?.log "$L"/s?.log "$L/check.log"; do echo "=== $f"; cat "$f"; echo
    done > "$OUT/suite.log"
    rm -r "$L" ;;
tests)
    [ $# -gt 0 ] || set -- tests --ignore=tests/test_ptx.py
    NBDNN_HYPOTHESIS_PROFILE=dev timeout 540 python3 -m pytest -q -p no:cacheprovider "$@" \
        > "$OUT/pytest.log" 2>&1
    tail -15 "$OUT/pytest.log" ;;
check)
    timeout 540 python3 -m nbdnn check --examples 2 > "$OUT/check.log" 2>&1
    tail -25 "$OUT/check.log" ;;
perf)
    # at most 8 files come back from a device call
    timeout 540 python3 -m nbdnn bench --no-cpu --json "$OUT/bench.json" --plot "$OUT/bench.png" \
        > "$OUT/perf.log" 2>&1
    tail -45 "$OUT/perf.log" ;;
dtypes)
    ops=${OPS:-"activation reduce_tensor softmax pool batch_norm layer_norm rms_norm group_norm"}
    for dt in float32 float16 bfloat16; do
        timeout ${DT_LIMIT_S:-170} python3 -m nbdnn bench --no-cpu --graph --dtype $dt --ops $ops \
            --json "$OUT/bench-$dt.json" > "$OUT/bench-$dt.log" 2>&1
        grep -v "^\[" "$OUT/bench-$dt.log" | tail -32
    done ;;
norm)
    export NBDNN_HYPOTHESIS_PROFILE=dev
    P="timeout 400 python3 -m pytest -q -p no:cacheprovider"
    $P tests/test_norm_paths.py tests/test_bn_paths.py tests/test_reference_norm.py \
        tests/test_reference_lrn.py tests/test_reference_dropout.py tests/test_pool_paths.py \
        > "$OUT/t1.log" 2>&1 &
    $P tests/test_crosscheck.py -k "norm or lrn or dropout or pool" > "$OUT/t2.log" 2>&1 &
    $P tests/test_gpu.py -k "norm or pool or dropout or batch or past_2_24" > "$OUT/t3.log" 2>&1 &
    wait
    timeout 200 python3 -m nbdnn bench --no-cpu --graph --json "$OUT/bench.json" --ops pool \
        batch_norm layer_norm rms_norm group_norm instance_norm lrn dropout > "$OUT/perf.log" 2>&1
    for f in "$OUT"/t?.log; do tail -n 2 "$f"; done
    tail -24 "$OUT/perf.log" ;;
compare)
    base=${1:?compare needs the baseline folder}
    ops=${OPS:-"activation softmax matmul conv2d pool2d batch_norm layer_norm reduce_tensor"}
    lo_base=$(ls "$base"/perf/launch_overhead.py "$base"/perf/suites/launch_overhead.py 2>/dev/null | head -1)
    for round in $(seq 1 ${ROUNDS:-1}); do
        for side in base new; do
            if [ $side = base ]; then pp=$PWD/$base; lo=$lo_base; else pp=$PWD; lo=perf/suites/launch_overhead.py; fi
            echo "=== launch_overhead $side round $round" >> "$OUT/compare.log"
            PYTHONPATH=$pp timeout ${LO_LIMIT_S:-100} python3 $lo --json "$OUT/launch-$side-$round.json" \
                >> "$OUT/compare.log" 2>&1
            [ $round = 1 ] || continue
            echo "=== bench $side" >> "$OUT/compare.log"
            PYTHONPATH=$pp timeout ${BENCH_LIMIT_S:-150} python3 -m nbdnn bench --no-cpu --graph --ops $ops \
                --json "$OUT/bench-$side.json" >> "$OUT/compare.log" 2>&1
        done
    done
    grep -A 40 "=== bench" "$OUT/compare.log" | grep -v "^\[" ;;
gemm)
    # test_tensorcore*.py in ${SHARDS:-10} processes (one process ran out of 400 s at 98
    # of 190 tests in run AH: the kernels' JIT; run AI: 234 tests in 8, 74-381 s each)
    sharded tensorcore ${SHARDS:-10} ${TC_LIMIT_S:-420} tests/test_tensorcore.py \
        tests/test_tensorcore_variants.py
    for k in wgmma_gemm_bf16_km_om_ts_ls wgmma_gemm_f16_kk_om_ts_ls \
            wgmma_gemm_bf16_km_b_gelu_beta_om_ls wgmma_gemm_tf32_kk_b_om_ts_ls \
            wgmma_gemm_bf16_mk_partial_om_ts_ls_m64n256s4; do
        echo "$k: $(timeout 60 python3 perf/tools/sass_dump.py nbdnn.cuda.matmul.wgmma_gemm \
            $k uint64 2>&1 >/dev/null | tr '\n' ' ')"  # HGMMA count, local memory (LDL/STL)
    done
    echo "mma_gemm_bf16_kk: $(timeout 60 python3 perf/tools/sass_dump.py \
        nbdnn.cuda.matmul.mma_gemm mma_gemm_bf16_kk uint16 2>&1 >/dev/null | tr '\n' ' ')"
    timeout 45 python3 perf/experiments/tc_host_cost.py > "$OUT/tc_host_cost.log" 2>&1
    cat "$OUT/tc_host_cost.log" ;;  # (host cost; OWN_MAPS right and planned?)
knobs)
    # the tensor-core GEMM's switches (wgmma_gemm.py, split_k.py): the tests of LEAN_SETUP,
    # TMA_STORE_F32, SKINNY_TILE (on since run AI), SKINNY_ROWS, WIDTHS, ONE_WAVE (on since
    # run AJ), CLUSTER_SPLIT (off: racecheck hazards, run AJ), NARROW (written after run
    # AJ), each both ways; the
    # sanitizer over tc_paths' "[knob]" paths, the skinny speed of skinny_gemm.py's VARIANTS
    # (default: the shipped, run AI's defaults, the cluster on top), the block timeline
    # (TIMELINE=1); and the compile-time clusters' one-tile test (tensorcore/cluster.py)
    # (four processes at once: each JITs its variants; one process would take ~6 min)
    i=0
    for k in "lean or clusters or width or narrow" "float32_c" "cluster_split" "skinny_tile"; do
        timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_tensorcore_variants.py \
            tests/test_tensorcore.py -k "$k" > "$OUT/knobs-tests-$i.log" 2>&1 &
        i=$((i + 1))
    done
    wait
    for i in 0 1 2 3; do tail -2 "$OUT/knobs-tests-$i.log"; done
    CS="compute-sanitizer --report-api-errors no --print-limit 20"
    for tool in memcheck racecheck; do
        timeout 90 $CS --tool $tool python3 perf/tools/tc_paths.py --only "${ONLY:-[knob]}" \
            > "$OUT/knobs-$tool.log" 2>&1
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^BAD|^ok" "$OUT/knobs-$tool.log" | tail -6
    done
    timeout 200 python3 perf/experiments/skinny_gemm.py --variants ${VARIANTS:-ship ai narrow} \
        > "$OUT/knobs-skinny.log" 2>&1
    grep -v -i warn "$OUT/knobs-skinny.log"
    [ -z "${TIMELINE:-}" ] || timeout 50 python3 perf/experiments/gemm_timeline.py 2>&1 \
        | grep -v -i warn ;;
ncu-gemm)
    # Nsight Compute over the tensor-core GEMM's cases (perf/tools/ncu_cases.py tc*,
    # tf32nn): our kernels and cuBLAS's for the same product; one text report back
    export TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1  # (tf32nn: cuBLAS in TF32 too)
    K='regex:wgmma_gemm|_splitk_sum|tf32_parts|nvjet|xmma|cutlass|sm90_'
    timeout ${NCU_LIMIT_S:-480} ncu --set full -k "$K" -o "$OUT/gemm" \
        python3 perf/tools/ncu_cases.py ${CASES:-tc64 tc256 tc512 tc1000 tc4096 tf32nn} \
        > "$OUT/ncu.log" 2>&1
    ncu --import "$OUT/gemm.ncu-rep" --page details > "$OUT/ncu-details.txt" 2>&1
    grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|L2 Hit|Achieved Occupancy|Registers Per|Elapsed Cycles" \
        "$OUT/ncu-details.txt" | head -150 ;;
gemm-speed)
    # (SWITCHES: --set MODULE.NAME=VALUE ..., e.g.
    # "--set nbdnn.cuda.matmul.split_k.NARROW=0", for the first table)
    timeout 300 python3 perf/suites/gemm.py --json "$OUT/gemm.json" ${SWITCHES:-} \
        > "$OUT/gemm.log" 2>&1
    timeout 120 python3 perf/suites/gemm.py --quick --no-fp32 --no-mlp --tc-path mma_sync \
        >> "$OUT/gemm.log" 2>&1  # the sm_80-89 kernel's speed, forced on the H200
    timeout 90 python3 perf/experiments/tf32_gemm.py --sizes 4096 >> "$OUT/gemm.log" 2>&1
    # (tf32's operand pass, variants 3 and 4: tf32_parts.VECTOR)
    cat "$OUT/gemm.log" ;;
sanitize)
    [ $# -gt 0 ] || set -- matmul
    CS="compute-sanitizer --report-api-errors no --print-limit 20"
    for tool in memcheck racecheck; do
        echo "=== $tool: $*"
        if [ "$1" = tc ]; then  # every tensor-core GEMM path once, small (perf/tools/tc_paths.py)
            timeout ${SAN_LIMIT_S:-270} $CS --tool $tool python3 perf/tools/tc_paths.py "${@:2}" \
                > "$OUT/$tool.log" 2>&1
        else
            timeout ${SAN_LIMIT_S:-270} $CS --tool $tool python3 -m nbdnn check --ops "$@" \
                --examples 1 > "$OUT/$tool.log" 2>&1
        fi
        grep -E "ERROR SUMMARY|op/dtype pairs|Error|^BAD" "$OUT/$tool.log" | tail -5
    done ;;
conv-tc)
    # issue 24: the tensor-core convolution (nbdnn/cuda/conv/wgmma_conv.py): its tests
    # (every geometry its limits allow, VERIFIED_ONLY off), run AJ's failing case varied
    # one factor at a time, the ResNet-50 layers' forward in 16-bit NHWC against cuDNN
    # (perf/suites/conv.py), and with SAN=1 memcheck and racecheck over its epilogue test
    P="timeout 240 python3 -m pytest -q -p no:cacheprovider"
    $P tests/test_conv_tensorcore.py > "$OUT/conv-tests.log" 2>&1 &
    $P tests/test_nn_precision.py > "$OUT/conv-nn.log" 2>&1 &
    $P tests/test_reference_tensor.py tests/test_crosscheck.py -k "cast_tensor or op_tensor" \
        > "$OUT/conv-cast.log" 2>&1 &  # (cast_tensor and op_tensor "finite" kernels)
    timeout 120 python3 perf/experiments/conv_tc_probe.py 2>&1 | grep -v -i warn
    wait
    summary conv-tests conv-nn conv-cast
    for p in bf16 fp16; do  # mixed precision on the GPU, eager and graphed
        timeout 90 python3 -m nbdnn demo --backend cuda --mode both --precision $p 2>/dev/null
    done
    timeout ${CONV_LIMIT_S:-200} python3 perf/suites/conv.py --nhwc --dtype ${DTYPE:-bfloat16} \
        --no-backward --layers s1 s2 s3 s4 --json "$OUT/conv-tc.json" 2>&1 | grep -v -i warn
    if [ -n "${SAN:-}" ]; then
        for tool in memcheck racecheck; do
            timeout 120 compute-sanitizer --report-api-errors no --print-limit 10 --tool $tool \
                python3 -m pytest -q -p no:cacheprovider tests/test_conv_tensorcore.py \
                -k "conv_order" > "$OUT/conv-$tool.log" 2>&1
            grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/conv-$tool.log" | tail -3
        done
    fi ;;
conv-train)
    # issue 24's training step: the tensor-core filter gradient, the padded stem columns,
    # im2col_words and max pool's argmax backward - their tests and (SAN=1) memcheck and
    # racecheck over them, in parallel; then each against torch (bwd_fixes_check.py),
    # the filter kernel's SASS
    P="timeout 200 python3 -m pytest -q -p no:cacheprovider"
    $P tests/test_conv_tensorcore.py > "$OUT/conv-tests.log" 2>&1 &
    $P tests/test_conv_paths.py tests/test_pool_paths.py > "$OUT/conv-paths.log" 2>&1 &
    sanitized train 110 tests/test_conv_tensorcore.py tests/test_conv_paths.py \
        tests/test_pool_paths.py -k "filter_gradient_on or narrow_channels or im2col_words or \
        nan_rules"
    wait
    summary conv-tests conv-paths train-memcheck train-racecheck
    timeout 120 python3 perf/experiments/bwd_fixes_check.py 2>&1 | grep -v -i warn
    echo "convdw SASS: $(timeout 60 python3 perf/tools/sass_dump.py nbdnn.cuda.matmul.wgmma_gemm \
        'wgmma_convdw.*' uint64 2>&1 >/dev/null | tr '\n' ' ')"
    ;;  # (the step's profile and ResNet-50: train-step; both compile every kernel again)
train-step)
    # issue 24's training step: the step's kernels' tests (SAN=1: memcheck and racecheck
    # over them), then its kernels by GPU time with SWITCHES (--set MODULE.NAME=VALUE ...:
    # perf/tools/switches.py, e.g. "--set nbdnn.cuda.conv.col2im_quads.ON=0") and, with
    # SIDES="on off", without, then ResNet-50 with them. Every step writes its log under
    # $OUT and prints as it goes (run AL lost a call's output to `| tail` when the 600 s
    # ran out). The first eager step compiles every kernel (run AM: 117 s) and
    # resnet50.py took 394 s: a 600 s call runs one or two of the three (a limit of 0
    # skips: TEST_LIMIT_S, PROFILE_LIMIT_S, RESNET_LIMIT_S). The step's buffer reuse
    # (written in run AN, off): SWITCHES="--set nbdnn.nn.train.REUSE_BUFFERS=1".
    SW=${SWITCHES:-}
    TL=${TEST_LIMIT_S:-130} PL=${PROFILE_LIMIT_S:-170} RL=${RESNET_LIMIT_S:-430}
    P="timeout $TL python3 -m pytest -q -p no:cacheprovider"
    if [ "$TL" != 0 ]; then
        $P tests/test_pool_paths.py tests/test_conv_paths.py tests/test_nn_precision.py \
            tests/test_reference_optim.py tests/test_bn_paths.py \
            -k "backward or col2im or im2col_words or fused or sgd or chunks" \
            > "$OUT/train-tests.log" 2>&1 &
        $P tests/test_crosscheck.py -k sgd_update > "$OUT/train-cross.log" 2>&1 &
        sanitized train 65 tests/test_conv_paths.py tests/test_crosscheck.py \
            tests/test_bn_paths.py -k "(col2im or im2col_words or sgd_update) and float16 or chunks"
        wait
        summary train-tests train-cross train-memcheck train-racecheck
    fi
    for side in ${SIDES:-on}; do
        [ "$PL" != 0 ] || break
        [ $side = on ] && S=$SW || S=
        timeout $PL python3 perf/experiments/resnet50_profile.py --top 16 $S \
            > "$OUT/profile-$side.log" 2>&1
        grep -v -i warn "$OUT/profile-$side.log" | cut -c1-110
    done
    [ "$RL" = 0 ] || timeout $RL python3 perf/suites/resnet50.py --json "$OUT/resnet50.json" \
        $SW > "$OUT/resnet50.log" 2>&1
    [ "$RL" = 0 ] || grep -v -i warn "$OUT/resnet50.log" ;;
ap-checks)
    # run AP: the tests run AO's call could not finish in 200 s (the TMA-store race fix,
    # the data gradient's filter as stored) in 16 shards, the SASS of the
    # new conv kernels (the data gradient's "_wn", the filter gradient's column words:
    # HGMMA, no LDL/STL) beside them, then pointwise_tiles.py (the 1x1 layers' GEMM
    # tiles and splits against cuDNN and cuBLAS)
    if [ "${TEST_LIMIT_S:-240}" != 0 ]; then
        for k in 'wgmma_conv_bf16.*_wn.*' 'wgmma_convdw_bf16.*'; do
            echo "$k: $(timeout 200 python3 perf/tools/sass_dump.py nbdnn.cuda.matmul.wgmma_gemm \
                "$k" uint64 2>&1 >/dev/null | tr '\n' ' ')"
        done > "$OUT/ap-sass.log" &
        sharded ap-tests 15 ${TEST_LIMIT_S:-240} tests/test_tensorcore_variants.py \
            tests/test_conv_tensorcore.py tests/test_conv_tc_data.py
        wait
        cat "$OUT/ap-sass.log"
    fi
    timeout ${TILES_LIMIT_S:-300} python3 perf/experiments/pointwise_tiles.py ${TILES_ARGS:-} \
        2>&1 | grep -v -i warn ;;
ap-final)
    # run AP's record: conv.py bf16 NHWC, every ResNet-50 layer, the forward "auto" (TMA
    # im2col) and "gemm" (a gather kernel's columns, then the GEMM: the gather against
    # TMA's im2col), both gradients, each error over 3e-2 named; AGAINST="--against
    # MODULE.NAME=VALUE": each layer again with it. Then channels-first (NCHW) inputs,
    # forward: the SIMT / winograd paths against channels_first.py's copies around the
    # channels-last kernel (NCHW_LIMIT_S=0 skips)
    C="python3 perf/suites/conv.py --dtype bfloat16"
    timeout ${CONV_LIMIT_S:-300} $C --nhwc --algos auto gemm --json "$OUT/ap-conv.json" \
        ${AGAINST:-} 2>&1 | grep -v -i warn
    [ "${NCHW_LIMIT_S:-200}" = 0 ] || timeout ${NCHW_LIMIT_S:-200} $C --algos auto \
        --no-backward --against nbdnn.cuda.conv.channels_first.ON=1 --json "$OUT/ap-nchw.json" \
        2>&1 | grep -v -i warn ;;
attention)
    # issue 25: the attention tests on the GPU (the cross-check rows with the gpu
    # profile's 25 draws, the reference's tests, the named errors, the fuzz, the paths,
    # the transformer layers; SAN=1: memcheck and racecheck over the cross-check rows),
    # the transformer demo eager and graphed, then perf/suites/attention.py
    # (ATT_ARGS, default "--quick --decode": S 512 and 2048, D 128, then decoding,
    # against torch's SDPA)
    P="timeout ${TEST_LIMIT_S:-240} python3 -m pytest -q -p no:cacheprovider"
    if [ "${TEST_LIMIT_S:-240}" != 0 ]; then
        $P tests/test_crosscheck.py -k attention > "$OUT/att-cross.log" 2>&1 &
        $P tests/test_reference_attention.py tests/test_errors_attention.py \
            tests/test_fuzz_errors.py tests/test_attention_paths.py tests/test_nn_transformer.py \
            -k "attention or decode or exact or block or cuda or graphed or heads" \
            > "$OUT/att-tests.log" 2>&1 &
        sanitized att 200 tests/test_crosscheck.py -k "attention and extremes"
        # (run AP's leftovers: the stem's row kernels sanitized, channels_first on the GPU)
        sanitized rows 150 tests/test_conv_paths.py -k "im2col_rows"
        $P tests/test_conv_tensorcore.py -k channels_first > "$OUT/cf.log" 2>&1 &
        wait
        summary att-cross att-tests att-memcheck att-racecheck rows-memcheck rows-racecheck cf
        timeout 120 python3 -m nbdnn demo --backend cuda --mode both --model transformer \
            --epochs 10 2>&1 | grep -v -i warn  # (the example, eager and graphed)
    fi
    timeout ${PERF_LIMIT_S:-300} python3 perf/suites/attention.py ${ATT_ARGS:---quick --decode} \
        --json "$OUT/attention.json" 2>&1 | grep -v -i warn ;;
flash)
    # issue 25's tensor-core forward (cuda/attention/flash.py): its tests, the attention
    # cross-check rows and paths beside them, (SAN=1) memcheck and racecheck over its
    # tests, the SASS of both head dims, then perf/suites/attention.py forward rows
    # (ATT_ARGS, default: bf16, D 64 and 128, S 512 .. 16k, causal and not)
    P="timeout ${TEST_LIMIT_S:-200} python3 -m pytest -q -p no:cacheprovider"
    $P tests/test_attention_flash.py > "$OUT/flash-tests.log" 2>&1 &
    $P tests/test_crosscheck.py tests/test_attention_paths.py -k "attention or decode or exact" \
        > "$OUT/flash-cross.log" 2>&1 &
    sanitized flash ${SAN_LIMIT_S:-200} tests/test_attention_flash.py -k "not long"
    for k in attention_flash_fwd_bf16_d64_n128s4 attention_flash_fwd_bf16_d128_n128s2; do
        echo "$k: $(timeout 90 python3 perf/tools/sass_dump.py nbdnn.cuda.attention.flash \
            $k uint64 2>&1 >/dev/null | tr '\n' ' ')"  # HGMMA count, local memory (LDL/STL)
    done
    wait
    summary flash-tests flash-cross flash-memcheck flash-racecheck
    timeout ${PERF_LIMIT_S:-300} python3 perf/suites/attention.py ${ATT_ARGS:---no-backward} \
        --json "$OUT/flash.json" 2>&1 | grep -v -i warn ;;
att-verify)
    # the attention kernels not yet fully verified: the whole flash test file (sharded),
    # the split decode kernel with its reference tests; (SAN=1) memcheck and
    # racecheck over a backward case (run AR's memcheck ran out of time on it), the
    # persistent forward and the split decode
    # (AV_K, AV_SAN_K: other -k selections of the flash tests and of the sanitised ones)
    P="timeout ${TEST_LIMIT_S:-240} python3 -m pytest -q -p no:cacheprovider"
    [ -n "${AV_K:-}" ] || $P tests/test_attention_paths.py -k "decode_split or forced" \
        > "$OUT/av-paths.log" 2>&1 &
    sanitized av ${SAN_LIMIT_S:-240} tests/test_attention_flash.py tests/test_attention_paths.py \
        -k "${AV_SAN_K:-(backward_matches and 257) or (persistent and 128) or (decode_split and kw0)}"
    for w in dkv dq; do for d in 64 128; do  # the backward's SASS: HGMMA, no LDL/STL
        timeout 90 python3 perf/experiments/flash_bwd_cases.py --sass $w bfloat16 $d 0 | tail -1
    done; done > "$OUT/av-sass.log" 2>&1 &
    sharded av-tests 3 ${TEST_LIMIT_S:-240} tests/test_attention_flash.py -k "${AV_K:-}"
    wait
    cat "$OUT/av-sass.log"
    summary av-paths av-memcheck av-racecheck ;;
att-speed)
    # decoding: decode.py's part kernel against decode_split.py's, K/V GB/s beside a
    # copy's and PyTorch's; D 64's forward both ways (at most 320 s of limits)
    for variant in decode decode_split; do
        timeout 120 python3 perf/suites/attention.py --decode --seqs --no-backward \
            --variant $variant 2>&1 | grep -v -i warn
    done
    # D 64's forward: F3 everywhere against F1 persistent everywhere
    S="perf/suites/attention.py --no-backward --seqs 512 2048 16384 --dims 64"
    timeout 50 python3 $S 2>&1 | grep -v -i warn
    timeout 50 python3 $S --set "nbdnn.cuda.attention.flash.VARIANT={64:'F1',128:'F1'}" \
        --set "nbdnn.cuda.attention.flash.PERSISTENT={64:999999999,128:999999999}" 2>&1 | grep -v -i warn ;;
att-gemm)
    # attention as GEMMs (cuda/attention/gemm.py: float32, and 16-bit with masks, dropout
    # or other head dims): its tests, (SAN=1) memcheck and racecheck over GPU-sized ones, the flash
    # forward's tests; then bf16 rows with a key-padding mask and at D 96 against
    # PyTorch's, float32 in 3xtf32, and the "gpt" step in fp32
    P="timeout ${TEST_LIMIT_S:-150} python3 -m pytest -q -p no:cacheprovider"
    $P tests/test_attention_gemm.py > "$OUT/ag-tests.log" 2>&1 &
    $P tests/test_attention_flash.py -k "forward_matches or persistent" \
        > "$OUT/ag-flash.log" 2>&1 &
    $P tests/test_attention_tf32.py > "$OUT/ag-tf32.log" 2>&1 &
    sanitized ag ${SAN_LIMIT_S:-75} tests/test_attention_gemm.py -k "gpu_sizes and ieee"
    wait
    summary ag-tests ag-flash ag-tf32 ag-memcheck ag-racecheck
    S="perf/suites/attention.py --seqs 1024 4096"
    timeout 150 python3 $S --dims 64 128 --masked 2>&1 | grep -v -i warn
    timeout 60 python3 $S --dims 96 2>&1 | grep -v -i warn
    timeout 80 python3 $S --dtypes float32 --dims 64 128 \
        --set "nbdnn._math_mode._default=['3xtf32']" 2>&1 | grep -v -i warn
    timeout 100 python3 perf/suites/transformer_step.py --models gpt --precisions fp32 2>&1 \
        | grep -v -i warn ;;
att-tf32)
    # flash_tf32.py (float32's forward fused on mma.sync): its tests, (SAN=1)
    # memcheck and racecheck over its D 64 cases, its SASS (HMMA, no LDL/STL); then
    # `att-tf32-speed`
    P="timeout ${TEST_LIMIT_S:-150} python3 -m pytest -q -p no:cacheprovider"
    $P tests/test_attention_tf32.py > "$OUT/at-tests.log" 2>&1 &
    sanitized at ${SAN_LIMIT_S:-120} tests/test_attention_tf32.py -k "64"
    for k in attention_flash_tf32_d64_3x_qr attention_flash_tf32_d64_1x_k16 \
        attention_flash_tf32_d128_1x_k16; do
        echo "$k: $(timeout 90 python3 perf/tools/sass_dump.py nbdnn.cuda.attention.flash_tf32 \
            $k float32 2>&1 >/dev/null | tr '\n' ' ')"
    done
    wait
    summary at-tests at-memcheck at-racecheck ;;
att-tf32-speed)
    # float32 forward rows (D 64 and 128, S 1k and 4k) in 3xtf32 and tf32 fused
    # (flash_tf32), and 3xtf32 on gemm.py, each against PyTorch's (<= 360 s)
    for mo in "3xtf32 flash_tf32" "tf32 flash_tf32" "3xtf32 gemm"; do
        set -- $mo
        timeout 120 python3 perf/suites/attention.py --dtypes float32 --seqs 1024 4096 \
            --dims 64 128 --no-backward --set "nbdnn._math_mode._default=['$1']" \
            --variant $2 2>&1 | grep -v -i warn
    done ;;
torch)
    # nbdnn.torch (issue 26): its tests (CPU reference and CUDA: every function against F,
    # its second order and its jvp/vjp under torch.func, the TF32 flags, opcheck, compile,
    # CUDA graphs, inductor, the converted models and transformers' BERT), sharded (<= TEST_LIMIT_S; log $OUT/torch-tests.log); beside
    # them torchvision's full-size ResNet-50 and ViT-B/16 checks, one process each (their
    # JIT and float64 truth runs: > 250 s in one shard, run AU; <= FULL_LIMIT_S; logs
    # $OUT/torch-full-ARCH.log, -rP: the loss-curve distances they print)
    for a in resnet50 vit_b_16; do
        timeout ${FULL_LIMIT_S:-420} python3 -m pytest -q -rP -p no:cacheprovider \
            "tests/test_torch_models.py::test_torchvision_full_size_on_cuda[$a]" \
            > "$OUT/torch-full-$a.log" 2>&1 &
    done
    sharded torch-tests ${SHARDS:-10} ${TEST_LIMIT_S:-300} tests/test_torch_*.py \
        tests/test_pool_paths.py ${EXTRA_TESTS:-} -k "not full_size"  # (the pool kernels: run AW's ceil-mode
    # windows past the padded input, simulator-checked only)
    wait
    for a in resnet50 vit_b_16; do
        echo "full size $a: $(grep -h "float32 losses" "$OUT/torch-full-$a.log") $(tail -1 "$OUT/torch-full-$a.log")"
        grep -E "^E  " "$OUT/torch-full-$a.log" | cut -c1-300 | head -5
    done ;;
torch-perf)
    # torch_models.py: the host cost of a wrapped call (with --profile: where it goes),
    # ResNet-50 training steps against native in CONFIGS (<= MODELS_LIMIT_S; log
    # $OUT/torch-models.log; run AU: the fp32 rows alone take ~250 s, most of it JIT)
    timeout ${MODELS_LIMIT_S:-300} python3 perf/suites/torch_models.py --host --profile \
        --models --configs ${CONFIGS:-bf16-cl fp32} > "$OUT/torch-models.log" 2>&1
    grep -v -i warn "$OUT/torch-models.log" ;;
capture)
    # run AX: tensormap.py writes a new address's map on a capturing stream, and plans
    # replay the maps' calls (plan_record's derived numbers). The tests of
    # the kernels that read maps and of torch.cuda.graph captures (<= TEST_LIMIT_S), the
    # sanitizer over the capture test beside them, then torch_models.py's steps in
    # CONFIGS (graphed: run AW's failing capture; <= MODELS_LIMIT_S)
    sanitized capture ${TEST_LIMIT_S:-240} tests/test_tensormap_capture.py
    sharded capture-tests ${SHARDS:-12} ${TEST_LIMIT_S:-240} tests/test_tensormap_capture.py \
        tests/test_conv_tensorcore.py tests/test_attention_flash.py tests/test_graph.py \
        tests/test_plan.py tests/test_torch_convert.py tests/test_torch_functional.py -k \
        "capture or graph or tensor_core or flash or conv or plan or derived"
    wait
    summary capture-memcheck capture-racecheck
    timeout ${MODELS_LIMIT_S:-300} python3 perf/suites/torch_models.py --models \
        --configs ${CONFIGS:-bf16-cl} > "$OUT/torch-models.log" 2>&1
    grep -v -i warn "$OUT/torch-models.log" | cut -c1-300 | tail -40 ;;
capture-probe)
    # run AX call 2: why the bf16 channels-last ResNet-50 step failed to capture (a
    # legacy-stream dependency in backward): capture_probe.py four ways at once (ours
    # alone after eager steps; native first, parameters shared, as torch_models.py;
    # gc.collect() before the capture; no eager steps: the first calls on a side stream)
    P="timeout ${PROBE_LIMIT_S:-240} python3 perf/experiments/capture_probe.py"
    $P > "$OUT/probe-ours.log" 2>&1 &
    $P --native-first > "$OUT/probe-native-first.log" 2>&1 &
    $P --collect > "$OUT/probe-collect.log" 2>&1 &
    $P --eager 0 > "$OUT/probe-noeager.log" 2>&1 &
    wait
    grep -h "live graph" "$OUT"/probe-*.log | sort | uniq -c | head -12
    for f in ours native-first collect noeager; do
        echo "probe $f: $(grep -E "^(native|nbdnn.torch):" "$OUT/probe-$f.log" | tr '\n' ' ')"
    done ;;
pack)
    # .kcache/ as $OUT/kcache.tar.aa, .ab ... (15 MB each: 8 files of 16 MiB come back);
    # here: cat kcache.tar.* | tar -x -C .kcache, then carry ".kcache"
    du -sh .kcache 2>/dev/null; ls .kcache 2>/dev/null | wc -l
    tar -C .kcache -cf - . | split -b 15m - "$OUT/kcache.tar." ;;
owed)
    # issue 26's timed rows, one after another on a quiet machine (start from a warm
    # .kcache: `owed-all` first, or carry one): torch_models.py's ResNet-50 rows (eager
    # and graphed, native beside nbdnn.torch) in CONFIGS, the host cost of a wrapped call,
    # then torch-profile's split of the eager step
    for c in ${CONFIGS:-bf16-cl fp32}; do
        timeout ${MODELS_LIMIT_S:-200} python3 perf/suites/torch_models.py --models \
            --configs $c > "$OUT/torch-models-$c.log" 2>&1
        grep -v -i warn "$OUT/torch-models-$c.log" | grep -E "^(ResNet|converted|eval)|Error" | \
            cut -c1-300 | head -20
    done
    timeout ${HOST_LIMIT_S:-90} python3 perf/suites/torch_models.py --host --profile \
        > "$OUT/torch-host.log" 2>&1
    grep -v -i warn "$OUT/torch-host.log" | head -8  # (the profiles: torch-host.log)
    PROFILE_LIMIT_S=${PROFILE_LIMIT_S:-120} bash "$0" torch-profile ;;
owed-all)
    # everything of issue 26 that compiles, side by side on 16 cores, filling .kcache for
    # `owed`: the torch tests (`torch`: shards and the full-size models; capture tests and
    # the tensor maps' captures among them), graph_leak_race.py (runs AZ, BA: eager
    # steps' AccumulateGrad nodes outlived them on CUDA; run BB: in no way, cause
    # unknown), torch_models.py's ResNet-50 rows in CONFIGS
    # (contended: `owed` times them again); then the kernel cache packed
    timeout ${MODELS_LIMIT_S:-540} python3 perf/suites/torch_models.py --models --configs \
        ${CONFIGS:-bf16-cl fp32} > "$OUT/torch-models.log" 2>&1 &
    timeout ${LEAK_LIMIT_S:-420} python3 perf/experiments/graph_leak_race.py 12 \
        > "$OUT/leak-race.log" 2>&1 &
    EXTRA_TESTS=tests/test_tensormap_capture.py bash "$0" torch
    wait
    grep -v -i warn "$OUT/leak-race.log" | cut -c1-400 | head -24
    grep -v -i warn "$OUT/torch-models.log" | grep -E "^(ResNet|converted|eval)|Error" | \
        cut -c1-300 | head -20
    bash "$0" pack ;;
torch-profile)
    # one profiled eager step of native and converted ResNet-50 per config, after warm-up
    # (perf/experiments/torch_step_profile.py; run AX: bf16-cl 62.6 ms against native's
    # 23.8, nbdnn.nn's own step 0.57x of PyTorch's: how much is not the kernels?)
    for c in ${CONFIGS:-bf16-cl fp32}; do
        timeout ${PROFILE_LIMIT_S:-240} python3 perf/experiments/torch_step_profile.py \
            --config $c > "$OUT/torch-profile-$c.log" 2>&1
        grep -E "^(===|GPU|split|call)" "$OUT/torch-profile-$c.log" | cut -c1-200 | head -30
    done ;;
devices)
    # several GPUs (issue 27) on whatever this machine has: the device plumbing's tests
    # (test_devices.py: the driver's answers on one GPU counted as two), DDP of a
    # converted model and of nbdnn.nn (gloo; NCCL where two GPUs), the example under
    # torchrun (logs $OUT/devices.log)
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 timeout ${TEST_LIMIT_S:-300} \
        python3 -m pytest -v -p no:cacheprovider tests/test_devices.py tests/test_torch_ddp.py \
        tests/test_nn_ddp.py tests/test_examples_ddp.py > "$OUT/devices.log" 2>&1
    summary devices ;;
ddp)
    # nvidia-h200-x2: `devices`, then perf/suites/ddp.py (ResNet-50 bf16 steps on 1 and 2
    # GPUs: nbdnn.nn, nbdnn.torch, PyTorch's DDP; <= DDP_LIMIT_S; $OUT/ddp.json)
    bash "$0" devices
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 timeout ${DDP_LIMIT_S:-480} \
        python3 perf/suites/ddp.py --json "$OUT/ddp.json" 2>&1 | grep -v -i warn ;;
att-all)
    # every attention test (the four kernel files, errors, the reference, the model
    # layer, the demo) in 8 shards, and the crosscheck's attention rows (<= 330 s)
    timeout ${TEST_LIMIT_S:-330} python3 -m pytest -q -p no:cacheprovider tests/test_crosscheck.py \
        -k attention > "$OUT/att-cross.log" 2>&1 &
    sharded att-all 8 ${TEST_LIMIT_S:-330} tests/test_attention_*.py tests/test_errors_attention.py \
        tests/test_reference_attention.py tests/test_nn_transformer.py tests/test_demo.py
    wait
    summary att-cross ;;
att-tf32-tiles)
    # flash_tf32's block shapes: its tests (every KEY_TILES / Q_RAW shape), then D 64 and
    # 128 float32 rows at S 4k in each mode and shape against PyTorch's (<= 300 s)
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_attention_tf32.py \
        > "$OUT/att-tiles.log" 2>&1 &
    F=nbdnn.cuda.attention.flash_tf32
    for mo in "3xtf32 {} 0" "3xtf32 {} 1" "3xtf32 {(64,3):16,(128,3):16} 0" \
              "3xtf32 {(64,3):16,(128,3):16} 1" "tf32 {} 0" "tf32 {(64,1):16,(128,1):16} 0"; do
        set -- $mo
        echo "KEY_TILES $2 Q_RAW $3"
        timeout 60 python3 perf/suites/attention.py --dtypes float32 --seqs 4096 --dims 64 128 \
            --no-backward --set "nbdnn._math_mode._default=['$1']" --set $F.ON=1 \
            --set "$F.KEY_TILES=$2" --set $F.Q_RAW=$3 2>&1 | grep "^float32"
    done
    wait
    summary att-tiles ;;
att-decode)
    # decode_split's chunking: blocks an SM (BLOCKS_PER_SM) and a chunk's least tiles
    # (MIN_CHUNK_TILES), the decode rows each way (at most ~420 s)
    for set in "BLOCKS_PER_SM=16" "BLOCKS_PER_SM=8" "BLOCKS_PER_SM=32" "MIN_CHUNK_TILES=4"; do
        timeout 100 python3 perf/suites/attention.py --decode --seqs --no-backward \
            --set nbdnn.cuda.attention.decode_split.$set 2>&1 | grep -v -i warn
    done ;;
att-train)
    # the tensor-core backward against cuDNN's, then the transformer step
    # (transformer_step.py: the demo model and the 4-block causal "gpt")
    timeout 240 python3 perf/suites/attention.py --seqs 512 4096 --dims 64 128 2>&1 | grep -v -i warn
    timeout 200 python3 perf/suites/transformer_step.py 2>&1 | grep -v -i warn ;;
tf32-conv)
    # float32 convolution in the TF32 modes: the tests (the tensor-core forward forced on,
    # the "gemm" path, the crosscheck's float32 conv rows; SAN=1: the sanitizer over the
    # tensor-core test), then conv.py's NHWC ResNet layers against cuDNN's TF32 with
    # the tensor-core forward off ("gemm") and on
    P="timeout ${TEST_LIMIT_S:-150} python3 -m pytest -q -p no:cacheprovider"
    $P tests/test_conv_tf32.py tests/test_reference_conv.py -k "tf32" > "$OUT/tf32-tests.log" 2>&1 &
    $P tests/test_crosscheck.py -k "conv and float32" > "$OUT/tf32-cross.log" 2>&1 &
    sanitized tf32 90 tests/test_conv_tf32.py
    wait
    summary tf32-tests tf32-cross tf32-memcheck tf32-racecheck
    for on in 0 1; do
        timeout 150 python3 perf/suites/conv.py --nhwc --math tf32 --algos auto --no-backward \
            --layers s1 s2 s3 s4 --set nbdnn.cuda.conv.wgmma_conv.TF32_ON_TENSOR_CORES=$on \
            --json "$OUT/tf32-$on.json" > "$OUT/tf32-$on.log" 2>&1
        grep -v -i warn "$OUT/tf32-$on.log"
    done ;;
conv-speed)
    # the tensor-core convolution's tests (and the TF32 crosscheck rows), then
    # conv.py's bf16 NHWC ResNet layers forward and backward (each gradient against
    # cuDNN's alone; every error over 3e-2 named, run AO's TMA-store race), then
    # ALT_LAYERS again with each of ALT's switches, forward and backward (default: the
    # stem with im2col_rows.ON, then col2im_rows.ON: run AO's narrow-channel kernels)
    P="timeout ${TEST_LIMIT_S:-240} python3 -m pytest -q -p no:cacheprovider"
    if [ "${TEST_LIMIT_S:-240}" != 0 ]; then
        $P tests/test_conv_tensorcore.py tests/test_conv_tf32.py tests/test_conv_tc_data.py \
            > "$OUT/speed-tc.log" 2>&1 &
        $P tests/test_tensorcore_variants.py tests/test_tensorcore.py -k "narrow or store or \
192 or skinny" > "$OUT/speed-gemm.log" 2>&1 &  # (the staged stores' widths: run AO's race)
        $P tests/test_conv_paths.py > "$OUT/speed-paths.log" 2>&1 &
        $P tests/test_crosscheck.py -k "conv and float32" > "$OUT/speed-cross.log" 2>&1 &
        wait
        summary speed-tc speed-gemm speed-paths speed-cross
    fi
    timeout ${CONV_LIMIT_S:-240} python3 perf/suites/conv.py --nhwc --dtype ${DTYPE:-bfloat16} \
        --algos auto --layers ${LAYERS:-stem s1 s2 s3 s4} --json "$OUT/conv-speed.json" \
        > "$OUT/conv-speed.log" 2>&1
    grep -v -i warn "$OUT/conv-speed.log"
    for sw in ${ALT:-nbdnn.cuda.conv.im2col_rows.ON=1 nbdnn.cuda.conv.col2im_rows.ON=1}; do
        timeout ${ALT_LIMIT_S:-90} python3 perf/suites/conv.py --nhwc --dtype ${DTYPE:-bfloat16} \
            --algos auto --layers ${ALT_LAYERS:-stem} --set $sw 2>&1 | grep -v -i warn
    done ;;
layout-moves)
    # run AN's work, timed in run AO: the tiled transpose (tensor.TILED_TRANSPOSE), the
    # 1x1 data and filter gradients as one GEMM each (conv.DATA_1X1_GEMM,
    # FILTER_1X1_GEMM): on since; 16-bit NCHW forward through channels-last copies
    # (conv/channels_first.py, on since run AP: "nchw" times it both ways). PARTS
    # (default all; ~950 s together, so two calls): tests (SAN=1: memcheck and racecheck
    # over the transpose's), ab (the transpose's A/B), 1x1 (conv.py's 1x1 gradients
    # both ways), profile (the backward passes' kernels, conv_bwd_profile.py), algos
    # (conv_algos.py bf16 NHWC: auto's picks), nchw (conv.py NCHW forward both ways)
    PARTS=${PARTS:-tests ab 1x1 profile algos nchw}
    has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
    P="timeout ${TEST_LIMIT_S:-200} python3 -m pytest -q -p no:cacheprovider"
    if has tests; then
        $P tests/test_transpose_tiles.py tests/test_conv_paths.py tests/test_graph_reuse.py \
            > "$OUT/moves-tests.log" 2>&1 &  # (and the graph buffer reuse's tests)
        $P tests/test_conv_tensorcore.py tests/test_crosscheck.py -k \
            "transform or channels_first or 1x1" > "$OUT/moves-tc.log" 2>&1 &
        sanitized moves 80 tests/test_transpose_tiles.py
        wait
        summary moves-tests moves-tc moves-memcheck moves-racecheck
    fi
    has ab && timeout 60 python3 perf/experiments/transpose_ab.py 2>&1 | grep -v -i warn
    C="timeout ${CONV_LIMIT_S:-120} python3 perf/suites/conv.py --dtype bfloat16 --algos auto"
    for on in 0 1; do  # the 1x1 layers' gradients, NHWC
        has 1x1 || break
        $C --nhwc --layers 1x1 --set nbdnn.cuda.conv.DATA_1X1_GEMM=$on \
            --set nbdnn.cuda.conv.FILTER_1X1_GEMM=$on 2>&1 | grep -v -i warn | grep -E "bwd|geometric"
    done
    has profile && timeout ${PROF_LIMIT_S:-120} python3 perf/experiments/conv_bwd_profile.py \
        2>&1 | grep -v -i warn  # (where the backward passes' time goes, kernel by kernel)
    has algos && timeout ${ALGOS_LIMIT_S:-90} python3 perf/suites/conv_algos.py --batches 32 \
        --dtype bfloat16 --nhwc 2>&1 | grep -v -i warn  # (auto's 16-bit channels-last picks)
    for on in 0 1; do  # NCHW forward
        has nchw || break
        $C --no-backward --layers s1 s2 s3 s4 --set nbdnn.cuda.conv.channels_first.ON=$on 2>&1 \
            | grep -v -i warn
    done ;;
bn-columns)
    # batch_norm/columns.py: the batch-norm tests and crosscheck rows (SAN=1: memcheck and
    # racecheck over the columns tests), its A/B against the general kernels and
    # PyTorch, then the training step's profile
    P="timeout ${TEST_LIMIT_S:-150} python3 -m pytest -q -p no:cacheprovider"
    $P tests/test_bn_paths.py tests/test_nn_precision.py > "$OUT/bn-tests.log" 2>&1 &
    $P tests/test_crosscheck.py -k "batch_norm" > "$OUT/bn-cross.log" 2>&1 &
    sanitized bn 70 tests/test_bn_paths.py -k "columns or infinity"
    wait
    summary bn-tests bn-cross bn-memcheck bn-racecheck
    timeout 120 python3 perf/experiments/bn_columns_ab.py > "$OUT/bn-ab.log" 2>&1
    grep -v -i warn "$OUT/bn-ab.log"
    timeout ${PROFILE_LIMIT_S:-170} python3 perf/experiments/resnet50_profile.py --top 24 \
        > "$OUT/profile.log" 2>&1
    grep -v -i warn "$OUT/profile.log" | cut -c1-110 ;;
compute)
    timeout 200 python3 perf/suites/gemm.py --json "$OUT/gemm.json" > "$OUT/perf.log" 2>&1
    timeout 300 python3 perf/suites/conv.py --json "$OUT/conv.json" >> "$OUT/perf.log" 2>&1
    timeout 60 python3 perf/suites/launch_overhead.py --json "$OUT/launch.json" >> "$OUT/perf.log" 2>&1
    tail -40 "$OUT/perf.log" ;;
esac

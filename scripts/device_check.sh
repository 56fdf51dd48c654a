#!/usr/bin/env bash
# The GPU check, run on a machine with a GPU (the H200 through the device tool): every CUDA
# specialisation compiled, the GPU tests, then the benchmark. Output goes to $OUT (or ./device_out)
# so that it comes back.
# Usage: bash scripts/device_check.sh [compile|tests|bench|tune|sanitize|all] [pytest or sanitize_cases.py args...]
# (Nothing can be installed on the device: carry pytest-xdist and execnet as wheels in .whl/ beside
# tinygrad's for parallel tests.)
# `compile` (also first in `tests` and `all` on CUDA; COMPILE_CHECK=0 leaves it out there) compiles
# every CUDA specialisation the plan can emit with nvrtc as tinygrad does (tools/compile_cuda.py,
# one line per family) into compile_cuda.log; a failure fails the check, and the tests still run.
# BENCHMARKS picks the benchmarks (default: attention gated_delta linear quant), BENCH_ARGS adds options;
# TUNE picks the sweep for `tune` (default: decode, i.e. tools/tune_decode.py; qmv: tools/tune_qmv.py; linear:
# tools/tune_linear.py).
# `sanitize` (not part of `all`) runs tools/sanitize_cases.py under compute-sanitizer, one run per tool in
# SANITIZE_TOOLS (default: memcheck racecheck initcheck), each stopped after SANITIZE_TIMEOUT seconds
# (default 170), into sanitize_<tool>.log, then prints a summary line per tool.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .whl/*.whl && export PYTHONPATH="$HOME/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
# NUVEC_REQUIRE_GPU: a GPU that fails to open fails the tests (instead of skipping every GPU test).
export DEV=${DEV:-CUDA} PYTHONUNBUFFERED=1 NUVEC_REQUIRE_GPU=1
what=${1:-all}; shift || true
status=0 compile_failed=
if [ "$what" = compile ] || { [ "$DEV" = CUDA ] && [ "${COMPILE_CHECK:-1}" != 0 ] && { [ "$what" = tests ] || [ "$what" = all ]; }; }; then
  python3 tools/compile_cuda.py 2>&1 | tee "$out/compile_cuda.log"
  [ "${PIPESTATUS[0]}" = 0 ] || { status=1; compile_failed="compile check FAILED: the first error is in $out/compile_cuda.log"; echo "$compile_failed"; }
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
  # GPU_TEST_WORKERS pytest-xdist workers on the one GPU where xdist imports (default 8: the GPU
  # tests are mostly compiles and host work; 911 tests took 320 s on an H100 with 8), else one.
  workers=()
  python3 -c "import xdist" 2>/dev/null && workers=(-n "${GPU_TEST_WORKERS:-8}")
  python3 -m pytest -q -m gpu -p no:cacheprovider "${workers[@]}" "$@" tests 2>&1 | tee "$out/gpu_tests.log" || status=1
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  for benchmark in ${BENCHMARKS:-attention gated_delta linear quant}; do
    python3 -m nuvec_tg.bench "$benchmark" ${BENCH_ARGS:-} --markdown "$out/$benchmark.md" 2>&1 | tee "$out/bench_$benchmark.log" || status=1
  done
fi
if [ "$what" = tune ]; then
  python3 "tools/tune_${TUNE:-decode}.py" ${TUNE_ARGS:-} 2>&1 | tee "$out/tune_${TUNE:-decode}.log" || status=1
fi
if [ "$what" = sanitize ]; then
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  # Each tinygrad buffer its own allocation (no memory planner's arenas, no reuse of freed ones): an
  # access past a buffer leaves every allocation, and a new buffer starts uninitialized.
  export NO_MEMORY_PLANNER=1 LRU=0
  # --error-exitcode 86 tells the tool's errors from failed cases (exit 1); explicit API errors only:
  # tinygrad raises on any failing driver call itself. --target-processes: not tinygrad's compile
  # workers. --launch-timeout: Python's imports come before the target initialises CUDA.
  common=(--error-exitcode 86 --print-limit 200 --report-api-errors explicit --target-processes application-only
          --launch-timeout 60)
  limit=${SANITIZE_TIMEOUT:-170} summary=()
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck initcheck}; do
    log="$out/sanitize_$tool.log"
    case $tool in
      # our kernels only; padding: an access just past a buffer lands in no neighbour; a bad access
      # ends its kernel, not the context, so the later cases still run
      memcheck) options=(--kernel-name kns=nuvec_ --padding 1024 --destroy-on-device-error kernel --leak-check no) ;;
      # every kernel: the writes of an unchecked kernel (tinygrad's, making our inputs) might go unseen
      initcheck) options=() ;;
      *) options=(--kernel-name kns=nuvec_) ;;
    esac
    if [ -z "$sanitizer" ]; then
      echo "compute-sanitizer not found" | tee "$log"; rc=127
    else
      { "$sanitizer" --version | tail -1; echo "$sanitizer --tool $tool ${options[*]} ${common[*]}"; } > "$log"
      timeout -k 10 "$limit" "$sanitizer" --tool "$tool" "${options[@]}" "${common[@]}" \
        python3 tools/sanitize_cases.py "$@" 2>&1 | tee -a "$log"
      rc=${PIPESTATUS[0]}
    fi
    [ "$rc" = 0 ] || status=1
    found=$(grep -E "(ERROR|RACECHECK) SUMMARY" "$log" | tail -1 | sed -E 's/^=+ *//')
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && found="timed out after ${limit}s"
    grep -q "Device not supported" "$log" && found="the sanitizer refused the device (a gVisor machine?)"
    ours=$(grep -cE "^=+ .*nuvec_" "$log")
    cases=$(grep -E "^[0-9]+ cases passed" "$log" | tail -1)
    summary+=("sanitize $tool: exit $rc; ${found:-no sanitizer summary}; $ours report lines name a nuvec_ kernel; ${cases:-no case summary}")
  done
  printf '%s\n' "${summary[@]}" | tee "$out/sanitize_summary.txt"
fi
[ -z "$compile_failed" ] || echo "$compile_failed"  # again, after the tests' output
exit $status

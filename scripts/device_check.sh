#!/usr/bin/env bash
# The GPU check, run on a machine with a GPU (the H200 through the device tool): the GPU tests,
# then the benchmark. Output goes to $OUT (or ./device_out) so that it comes back.
# Usage: bash scripts/device_check.sh [tests|bench|tune|all] [pytest args...]
# BENCHMARKS picks the benchmarks (default: attention gated_delta quant), BENCH_ARGS adds options;
# TUNE picks the sweep for `tune` (default: decode, i.e. tools/tune_decode.py; qmv: tools/tune_qmv.py).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .whl/*.whl && export PYTHONPATH="$HOME/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
export DEV=${DEV:-CUDA} PYTHONUNBUFFERED=1
what=${1:-all}; shift || true
status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider "$@" tests 2>&1 | tee "$out/gpu_tests.log" || status=1
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  for benchmark in ${BENCHMARKS:-attention gated_delta quant}; do
    python3 -m nuvec_tg.bench "$benchmark" ${BENCH_ARGS:-} --markdown "$out/$benchmark.md" 2>&1 | tee "$out/bench_$benchmark.log" || status=1
  done
fi
if [ "$what" = tune ]; then
  python3 "tools/tune_${TUNE:-decode}.py" ${TUNE_ARGS:-} 2>&1 | tee "$out/tune_${TUNE:-decode}.log" || status=1
fi
exit $status

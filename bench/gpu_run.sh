#!/usr/bin/env bash
# On a GPU machine, with a kit that bench/gpu_kit.py made where LLVM is: the CUDA runtime's tests, every
# example and gradient checked against the reference interpreter (outputs poisoned with NaN before the
# launch), then the benchmark against cuBLAS and cuDNN (bench/run_bench.py: ratios, results.json).
#   bench/gpu_run.sh KIT [OUT]     (OUT: where results.json, ratios.png and variant_NAME.json go; default KIT)
#   bench/gpu_run.sh --polytile-only KIT [OUT]
#                                  only polytile's side of the kit's bundles (OUT/default.json) and of each
#                                  variant's (OUT/NAME.json), each checked against its peer first: half the
#                                  device time, to compare models within one run
# Exit 0 only when every test and check passes.
set -uo pipefail
only_polytile=0
if [ "${1:-}" = --polytile-only ]; then only_polytile=1; shift; fi
kit=$(cd "$1" && pwd)
out=${2:-$kit}
here=$(cd "$(dirname "$0")" && pwd)
# The toolkit's libraries, and cuDNN / cuBLAS from Python's NVIDIA wheels where the toolkit has none.
LD_LIBRARY_PATH="$kit/lib:${CUDA_PATH:-/usr/local/cuda}/lib64:${LD_LIBRARY_PATH:-}"
for d in $(python3 -c "import os, nvidia
for p in nvidia.__path__:
    for s in sorted(os.listdir(p)):
        if os.path.isdir(os.path.join(p, s, 'lib')): print(os.path.join(p, s, 'lib'))" 2>/dev/null); do
  LD_LIBRARY_PATH+=":$d"
done
export LD_LIBRARY_PATH
failed=0
"$kit/bin/polytile-run-bundle" --status || exit 1
if [ $only_polytile = 1 ]; then
  for v in "$kit/bundles" "$kit"/variants/*/; do
    [ -d "$v" ] || continue
    name=$(basename "$v"); [ "$name" = bundles ] && name=default
    echo "== $name"
    "$kit/bin/polytile_gpu_bench" --bundles "$v" --benchmark_filter=/polytile/ --benchmark_min_time="${MIN_TIME:-0.05}" \
      --benchmark_out="$out/$name.json" --benchmark_out_format=json --benchmark_format=console || failed=1
  done
  exit $failed
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader || true

echo "== the CUDA runtime's tests"
POLYTILE_SOURCE_DIR="$(dirname "$here")" "$kit/bin/cuda_runtime_test" --gtest_brief=1 || failed=1

echo "== examples and gradients against the reference interpreter"
pass=0; fail=0
while read -r name; do
  [ -n "$name" ] || continue
  if res=$(cd "$kit" && bin/polytile-run-bundle $(cat "check/$name/args") 2>&1); then
    pass=$((pass + 1))
  else
    fail=$((fail + 1)); failed=1
    echo "FAIL $name:"; echo "$res" | sed 's/^/    /'
  fi
done < "$kit/checks.txt"
echo "checks: $pass passed, $fail failed"
if (cd "$kit" && bin/polytile-run-bundle $(cat control_args) > /dev/null 2>&1); then
  echo "FAIL: the control check (an expectation off in one element) passed"; failed=1
else
  echo "control: an expectation off in one element fails, as it must"
fi

echo "== benchmark"
python3 "$here/run_bench.py" --binary "$kit/bin/polytile_gpu_bench" --out "$out" --min-time "${MIN_TIME:-0.2}" -- --bundles "$kit/bundles" || failed=1

# Each variant's bundles (gpu_kit.py --variant), polytile's side only: each is checked against its peer
# before it is timed, as above.
for v in "$kit"/variants/*/; do
  [ -d "$v" ] || continue
  name=$(basename "$v")
  echo "== variant $name"
  "$kit/bin/polytile_gpu_bench" --bundles "$v" --benchmark_filter=/polytile/ --benchmark_min_time="${MIN_TIME:-0.2}" \
    --benchmark_out="$out/variant_$name.json" --benchmark_out_format=json --benchmark_format=console || failed=1
done
exit $failed

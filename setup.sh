#!/usr/bin/env bash
# Installs polytile's system dependencies (Debian packages) and builds it.
#   ./setup.sh               Release build in build/, and the Python package in the venv build/python-venv
#   ./setup.sh --sanitize    AddressSanitizer + UndefinedBehaviorSanitizer build in build-asan/
#   ./setup.sh --tsan        ThreadSanitizer build of the thread tests in build-tsan/ (ctest -L threads)
#   ./setup.sh --fuzz        clang + libFuzzer build of the fuzz targets in build-fuzz/ (then fuzz/run.sh)
set -euo pipefail
cd "$(dirname "$0")"

packages=(
  cmake ninja-build g++ pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  libisl-dev libntl-dev libgmp-dev
  llvm-16-dev llvm-16-tools
  libdnnl-dev ocl-icd-opencl-dev libopenblas-dev libtbb-dev
  python3 python3-dev python3-venv libzip-dev
)

if [ "${1:-}" = "--fuzz" ]; then
  packages+=(clang libclang-rt-14-dev)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

build_dir=build
target=()
venv="$PWD/build/python-venv"
flags=(-DCMAKE_BUILD_TYPE=Release -DPOLYTILE_BUILD_BENCH=ON -DPOLYTILE_PYTHON_VENV="$venv")
if [ "${1:-}" = "--sanitize" ]; then
  build_dir=build-asan
  flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DPOLYTILE_SANITIZE=ON -DPOLYTILE_BUILD_BENCH=ON)
elif [ "${1:-}" = "--tsan" ]; then
  build_dir=build-tsan
  flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DPOLYTILE_TSAN=ON)
  target=(--target threads_test)
elif [ "${1:-}" = "--fuzz" ]; then
  build_dir=build-fuzz
  flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DPOLYTILE_FUZZ=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)
fi
cmake -S . -B "$build_dir" -G Ninja "${flags[@]}" > /dev/null
cmake --build "$build_dir" -j "$(nproc)" "${target[@]}"

# The Python package (default build only): a virtual environment in build/python-venv with numpy, pytest
# and the package's build tools from PyPI, and polytile installed into it (pip builds the nanobind
# extension against the libraries just built in build/; the tests reinstall it before they run).
if [ "$build_dir" = build ]; then
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  pip_install=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip_install[@]}" "numpy>=1.22" "pytest>=7" "scikit-build-core>=0.10" "nanobind>=2.0"
  "${pip_install[@]}" --no-build-isolation --no-deps .
fi

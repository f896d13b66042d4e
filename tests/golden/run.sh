#!/usr/bin/env bash
# A small lit: runs every `// RUN:` line of a golden test with %polytile, %FileCheck and %s substituted,
# under pipefail, and fails on the first line that fails.  Usage: run.sh POLYTILE FILECHECK TEST.tile
set -uo pipefail
polytile=$1
filecheck=$2
test=$3
# `// REQUIRES: libdevice`: the test needs the CUDA toolkit's libdevice; without it, skip (CTest: 77).
if grep -q '^// REQUIRES: libdevice' "$test"; then
  found=
  for d in "${POLYTILE_LIBDEVICE:-}" "${CUDA_PATH:+$CUDA_PATH/nvvm/libdevice/libdevice.10.bc}" /usr/local/cuda/nvvm/libdevice/libdevice.10.bc; do
    [ -n "$d" ] && [ -f "$d" ] && found=$d && break
  done
  if [ -z "$found" ]; then
    echo "skipped: no libdevice.10.bc (CUDA toolkit) in POLYTILE_LIBDEVICE, CUDA_PATH or /usr/local/cuda"
    exit 77
  fi
fi
n=0
while IFS= read -r line; do
  cmd=${line#*RUN: }
  cmd=${cmd//%polytile/$polytile}
  cmd=${cmd//%FileCheck/$filecheck}
  cmd=${cmd//%s/$test}
  echo "+ $cmd"
  if ! bash -o pipefail -c "$cmd"; then
    echo "FAILED: $line"
    exit 1
  fi
  n=$((n + 1))
done < <(grep '^// RUN: ' "$test")
echo "$n RUN lines passed"
[ "$n" -gt 0 ]

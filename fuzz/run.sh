#!/usr/bin/env bash
# Runs the libFuzzer targets built by ./setup.sh --fuzz, seeded with the examples:
#   fuzz/run.sh [PARSER_RUNS] [PIPELINE_RUNS] [FILE_RUNS]     (defaults 10000000, 1000000 and 5000000)
# Crashes are written to build-fuzz/artifacts/; the corpus grows in build-fuzz/corpus-*/.
set -euo pipefail
cd "$(dirname "$0")/.."
parser_runs=${1:-10000000}
pipeline_runs=${2:-1000000}
file_runs=${3:-5000000}
mkdir -p build-fuzz/artifacts build-fuzz/corpus-parser build-fuzz/corpus-pipeline build-fuzz/corpus-file
for f in examples/*.tile; do
  grep -v '^//' "$f" > "build-fuzz/corpus-parser/$(basename "$f")"
  cp "build-fuzz/corpus-parser/$(basename "$f")" build-fuzz/corpus-pipeline/
done
# The pipeline target's corpus from earlier runs (minimized, its inputs of over 150 ms left out), which the
# tests replay (pipeline_fuzzer_corpus).
cp fuzz/corpus/pipeline/* build-fuzz/corpus-pipeline/
# The file target's first byte picks the reader: 0 .npy, 1 .npz, 2 a bundle manifest. fuzz/corpus/file is
# its corpus, minimized (-merge=1) after a run seeded with .npy files of each dtype and a gradient's
# manifest; the tests replay it (file_fuzzer_corpus).
cp fuzz/corpus/file/* build-fuzz/corpus-file/
for f in tests/data/*.npz; do
  { printf '\001'; cat "$f"; } > "build-fuzz/corpus-file/$(basename "$f")"
done
for f in tests/data/bundles/*/manifest.txt; do
  { printf '\002'; cat "$f"; } > "build-fuzz/corpus-file/manifest-$(basename "$(dirname "$f")")"
done
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
build-fuzz/fuzz/parser_fuzzer -runs="$parser_runs" -max_len=1024 -artifact_prefix=build-fuzz/artifacts/ \
  -print_final_stats=1 build-fuzz/corpus-parser
build-fuzz/fuzz/pipeline_fuzzer -runs="$pipeline_runs" -max_len=1024 -timeout=20 -rss_limit_mb=4096 \
  -artifact_prefix=build-fuzz/artifacts/ -print_final_stats=1 build-fuzz/corpus-pipeline
build-fuzz/fuzz/file_fuzzer -runs="$file_runs" -max_len=4096 -artifact_prefix=build-fuzz/artifacts/ \
  -print_final_stats=1 build-fuzz/corpus-file

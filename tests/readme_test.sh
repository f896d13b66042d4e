#!/usr/bin/env bash
# Keeps the README true: the API tour it shows is examples/api/api_tour.cpp verbatim, and every
# `build/polytile ...` command it shows runs successfully (with this build's binary).
set -euo pipefail
src=$1
bin=$2
cd "$src"
block=$(awk '/^```cpp$/{on=1; next} /^```$/{if(on){exit}} on' README.md)
if [ "$block" != "$(cat examples/api/api_tour.cpp)" ]; then
  echo "README's C++ block differs from examples/api/api_tour.cpp"
  exit 1
fi
n=0
while IFS= read -r line; do
  cmd=${line#./setup.sh && }
  cmd=${cmd/build\/polytile/$bin}
  echo "+ $cmd"
  eval "$cmd" > /dev/null
  n=$((n + 1))
done < <(awk '/^```bash$/{on=1; next} /^```$/{on=0} on' README.md | grep -E '^(\./setup\.sh && )?build/polytile ')
echo "ran $n README commands"
[ "$n" -ge 8 ]

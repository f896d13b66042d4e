#!/usr/bin/env bash
# Keeps the README true: every C++, C or Python block marked "<!-- example: FILE -->" is FILE verbatim, and
# every `build/polytile ...` or `cc ...` command it shows runs successfully (with this build's binary), and
# so does every `build/python-venv/bin/python ...` command where ./setup.sh made that environment.
set -euo pipefail
src=$1
bin=$2
cd "$src"
blocks=0
while IFS= read -r file; do
  block=$(awk -v f="$file" '$0 == "<!-- example: " f " -->" {armed=1; next}
                            armed && /^```(cpp|c|python)$/ {on=1; next}
                            on && /^```$/ {exit}
                            on' README.md)
  if [ "$block" != "$(cat "$file")" ]; then
    echo "README's block for $file differs from the file"
    exit 1
  fi
  blocks=$((blocks + 1))
done < <(sed -n 's/^<!-- example: \(.*\) -->$/\1/p' README.md)
n=0
while IFS= read -r line; do
  cmd=${line#./setup.sh && }
  cmd=${cmd/build\/polytile/$bin}
  echo "+ $cmd"
  eval "$cmd" > /dev/null
  n=$((n + 1))
done < <(awk '/^```bash$/{on=1; next} /^```$/{on=0} on' README.md | grep -E '^((\./setup\.sh && )?build/polytile |cc )')
python_commands=$(awk '/^```bash$/{on=1; next} /^```$/{on=0} on' README.md | grep -E '^build/python-venv/bin/python ' || true)
if [ -z "$python_commands" ]; then
  :
elif [ -x build/python-venv/bin/python ]; then
  while IFS= read -r cmd; do
    echo "+ $cmd"
    eval "$cmd" > /dev/null
    n=$((n + 1))
  done <<< "$python_commands"
else
  echo "not running $(echo "$python_commands" | wc -l) Python commands: no build/python-venv here (./setup.sh makes it)"
fi
# The repository stands alone: nothing a user reads points outside it.
if grep -rn '\.\./shared' README.md docs ./*/include 2>/dev/null; then
  echo "README, docs or a public header points outside the repository"
  exit 1
fi
echo "checked $blocks C++ and C examples, ran $n README commands"
[ "$blocks" -ge 6 ] && [ "$n" -ge 21 ]

#!/usr/bin/env bash
# The structural rules of ARCHITECTURE.md that a compiler can check, over src/:
#  1. nothing under server/ (the transport and the OpenAI routes) reaches a header under
#     backend/cuda/, directly or through other headers (the compiler's dependency list);
#  2. no getenv: switches are Options fields with flags, not environment variables;
#  3. no file over 800 lines.
# Usage: check.sh SOURCE_DIR CXX   (a CTest test; prints each violation, exits 1 on any)
set -uo pipefail
src=$1/src
cxx=$2
fail=0
for f in "$src"/server/*.cpp "$src"/server/*.h "$src"/server/http/*.cpp "$src"/server/http/*.h; do
  deps=$("$cxx" -std=c++20 -MM -I "$src" -x c++ "$f" 2>&1) || { echo "layering: cannot scan $f: $deps"; fail=1; continue; }
  if grep -q 'backend/cuda/' <<<"$deps"; then
    echo "layering: ${f#"$src"/} reaches $(tr ' ' '\n' <<<"$deps" | grep 'backend/cuda/' | sed "s|$src/||" | sort -u | tr '\n' ' ')"
    fail=1
  fi
done
if grep -rn --include='*.cpp' --include='*.h' --include='*.cu' --include='*.cuh' -E '\b(std::)?(secure_)?getenv\s*\(' "$src"; then
  echo "layering: getenv in src/ (above): make it an Options field with a flag"
  fail=1
fi
while read -r n f; do
  [[ $f == total ]] && continue
  if ((n > 800)); then
    echo "layering: ${f#"$src"/} has $n lines (800 at most)"
    fail=1
  fi
done < <(find "$src" -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0 | xargs -0 wc -l)
((fail == 0)) && echo "layering: server/ free of backend/cuda, no getenv, every file within 800 lines"
exit $fail

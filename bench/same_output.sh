#!/usr/bin/env bash
# Byte-identity check for restructurings (issue 10): run alloc-audit on a tree,
# write every report format into a folder, and compare with a stored reference.
#
#   bench/same_output.sh record TREE REFDIR [PATHS...]   # with the code before the change
#   bench/same_output.sh compare TREE REFDIR [PATHS...]  # after each step: exit 1 on any difference
#
# TREE is the project root (the command runs there); PATHS default to ".".
# REFDIR must live outside the repository (e.g. /work/trees/ref/flashinfer).
# Runs are honest: --jobs 2 and --no-cache. JSON drops stats.seconds, the only
# wall-clock value in any output (the terminal tables show it too: masked). `check` needs an allowlist: if TREE has
# none, record it once with `alloc-audit allowlist init` before recording.
set -uo pipefail
mode=$1; tree=$(cd "$2" && pwd); ref=$3; shift 3
paths=("$@"); [ ${#paths[@]} -eq 0 ] && paths=(.)
here=$(cd "$(dirname "$0")/.." && pwd)
aa=${ALLOC_AUDIT:-$here/.venv/bin/alloc-audit}
py=${PYTHON:-$here/.venv/bin/python}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export NO_COLOR=1 COLUMNS=120
run() { # name, then the alloc-audit arguments; stdout, stderr and exit code all count
  local name=$1; shift
  (cd "$tree" && "$aa" "$@" >"$out/$name" 2>"$out/$name.err"; echo "rc=$?" >>"$out/$name.err")
}
opts=(--jobs 2 --no-cache)
run scan.json scan "${paths[@]}" --format json "${opts[@]}"
"$py" - "$out/scan.json" <<'EOF'
import json, sys
path = sys.argv[1]
data = json.loads(open(path, encoding="utf-8").read())
data["stats"].pop("seconds", None)
open(path, "w", encoding="utf-8").write(json.dumps(data, indent=1, sort_keys=True) + "\n")
EOF
run scan.sarif scan "${paths[@]}" --format sarif "${opts[@]}"
run scan.md scan "${paths[@]}" --format markdown "${opts[@]}"
run report.md report "${paths[@]}" --format markdown "${opts[@]}"
run check.txt check "${paths[@]}" "${opts[@]}"
if [ -n "${SAME_OUTPUT_ALL:-}" ]; then # the other surfaces, for small trees
  run scan.table scan "${paths[@]}" --verbose "${opts[@]}"
  run scan.html scan "${paths[@]}" --format html "${opts[@]}"
  run scan.github scan "${paths[@]}" --format github "${opts[@]}"
  run report.table report "${paths[@]}" "${opts[@]}"
  run report.file.table report "${paths[@]}" --by file "${opts[@]}"
  run report.html report "${paths[@]}" --format html "${opts[@]}"
  run check.github check "${paths[@]}" --format github "${opts[@]}"
  run check.json check "${paths[@]}" --format json --fail-on never "${opts[@]}"
  run scan.norules.json scan "${paths[@]}" --format json --no-rules "${opts[@]}"
  "$py" - "$out/scan.norules.json" "$out/check.json" <<'EOF'
import json, sys
for path in sys.argv[1:]:
    data = json.loads(open(path, encoding="utf-8").read())
    data["stats"].pop("seconds", None)
    open(path, "w", encoding="utf-8").write(json.dumps(data, indent=1, sort_keys=True) + "\n")
EOF
  sed -i -E 's/ · [0-9]+\.[0-9]+ s$/ · <seconds>/' "$out"/*.table  # wall clock, like stats.seconds
  run rules.list rules list
  run rules.explain rules explain alloc-in-capture
fi
case $mode in
  record) rm -rf "$ref"; mkdir -p "$ref"; cp "$out"/* "$ref"/; echo "recorded $(ls "$ref" | wc -l) files in $ref";;
  compare)
    if diff -r "$ref" "$out" >"$out.diff"; then echo "same: $tree ($(ls "$ref" | wc -l) files)"; rm -f "$out.diff"
    else echo "DIFFERENT: $tree (diff in $out.diff)"; head -40 "$out.diff"; exit 1; fi;;
  *) echo "usage: $0 record|compare TREE REFDIR [PATHS...]" >&2; exit 2;;
esac

#!/usr/bin/env bash
# Reads `go test -bench -benchmem` output on stdin and prints it as a
# Markdown table, one row per benchmark, every metric in its own column.
set -euo pipefail
awk '
/^pkg: / { pkg = $2; sub(".*/carve/", "", pkg) }
/^Benchmark/ {
  name = $1; sub(/-[0-9]+$/, "", name)
  row = pkg " | " name " | " $2
  for (i = 3; i < NF; i += 2) {
    unit = $(i + 1)
    if (!(unit in seen)) { seen[unit] = 1; units[++nunits] = unit }
    val[NR, unit] = $i
  }
  rows[++nrows] = NR; label[NR] = row
}
/^(FAIL|panic|--- FAIL)/ { failed = 1; print > "/dev/stderr" }
END {
  header = "| package | benchmark | runs"; sep = "|---|---|---:"
  for (u = 1; u <= nunits; u++) { header = header " | " units[u]; sep = sep "|---:" }
  print header " |"; print sep "|"
  for (r = 1; r <= nrows; r++) {
    line = "| " label[rows[r]]
    for (u = 1; u <= nunits; u++) { v = val[rows[r], units[u]]; line = line " | " (v == "" ? "" : v) }
    print line " |"
  }
  if (failed) exit 1
}'

#!/usr/bin/env bash
# Reads `go test -bench -benchmem` output on stdin and prints it as a
# Markdown table, one row per benchmark, every metric in its own column;
# then, for each benchmark run against carve and the do-nothing driver in
# the same run (<name>/carve, <name>/library-floor), their ratio a metric.
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
  # carve against the do-nothing driver in the same run: a row a metric
  # for each benchmark that has both (<name>/carve, <name>/library-floor).
  npairs = 0
  for (r = 1; r <= nrows; r++) {
    split(label[rows[r]], f, " [|] ")
    if (f[2] !~ /\/carve$/) continue
    base = f[2]; sub(/\/carve$/, "", base)
    # The reference runs after carve (its next row of that name).
    for (q = r + 1; q <= nrows; q++) {
      split(label[rows[q]], g, " [|] ")
      if (g[1] != f[1] || g[2] != base "/library-floor") continue
      for (u = 1; u <= nunits; u++) {
        if (units[u] == "samples" || units[u] == "warm-rounds") continue
        a = val[rows[r], units[u]]; b = val[rows[q], units[u]]
        if (a == "" || b == "" || b + 0 == 0) continue
        if (++npairs == 1) {
          print ""
          print "| package | benchmark | metric | carve | do-nothing driver | carve / do-nothing |"
          print "|---|---|---|---:|---:|---:|"
        }
        printf "| %s | %s | %s | %s | %s | %.3f |\n", f[1], base, units[u], a, b, a / b
      }
      break
    }
  }
  if (failed) exit 1
}'

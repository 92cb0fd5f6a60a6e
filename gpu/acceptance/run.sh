#!/bin/sh
# The acceptance run of GPU memory slices.
#
# Here (with Go):    gpu/acceptance/run.sh build   -> gpu/acceptance/carve-acceptance.test
# On the GPU host:   ./run.sh record DIR   (environment, nvidia-smi, NVML as the driver answers)
# On the GPU host:   ./run.sh [--keep-compute-mode] [--dry-run]
#   (needs only the test binary, this script, client.py, python3 and
#   PyTorch; root, for the compute mode, cgroups and the MPS daemon)
#
# --keep-compute-mode never changes the GPU's compute mode (the lent
# machines): the row "skips MPS" then reads "not enforced: compute mode
# Default". --dry-run prints the plan and touches nothing.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = build ]; then
	cd "$here/../.."
	CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations go test -c -tags acceptance -o "$here/carve-acceptance.test" ./gpu/acceptance
	CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations go build -o "$here/carve" ./cmd/carve
	echo "built $here/carve-acceptance.test and $here/carve; copy it with run.sh and client.py to the GPU host"
	exit 0
fi
if [ "${1:-}" = record ]; then
	# The environment record: what the card and its driver answer, through
	# nvidia-smi, through libnvidia-ml directly (nvmlrecord.py, ctypes) and
	# through carve (discover, snapshot) when a carve binary is beside it.
	out=${2:?usage: $0 record DIR}
	mkdir -p "$out"
	{ date -u; uname -a; cat /etc/os-release; nvidia-smi; nvidia-smi -q; nvidia-smi mig -lgip; nvidia-smi mig -lgipp; } >"$out/environment.txt" 2>&1 || true
	python3 "$here/nvmlrecord.py" >"$out/nvmlrecord.json" 2>"$out/nvmlrecord.err" || true
	if [ -x "$here/carve" ]; then
		"$here/carve" discover -o json >"$out/discover.json" 2>"$out/discover.err" || true
		"$here/carve" snapshot -o "$out/snapshot.tar.gz" >"$out/snapshot.err" 2>&1 || true
	fi
	exit 0
fi
flags=""
for a in "$@"; do
	case "$a" in
	--keep-compute-mode) flags="$flags -keep-compute-mode" ;;
	--dry-run) flags="$flags -dry-run" ;;
	*) echo "usage: $0 build | [--keep-compute-mode] [--dry-run]" >&2; exit 2 ;;
	esac
done
cd "$here"
# shellcheck disable=SC2086
exec ./carve-acceptance.test -test.run '^TestAcceptance$' -test.v -test.timeout 20m -client "$here/client.py" $flags

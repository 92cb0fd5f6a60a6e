#!/bin/sh
# The acceptance run of carve's GPU paths on a real GPU.
#
# Here (with Go):    gpu/acceptance/run.sh build   -> gpu/acceptance/carve-acceptance.test, carve
# On the GPU host:   ./run.sh record DIR   (environment, nvidia-smi, NVML as the driver answers)
# On the GPU host:   ./run.sh [PART] [--keep-compute-mode] [--enable-mig] [--driver-root DIR] [--tenant-uid N] [--torch] [--dry-run]
#   PART is one of discovery, mig, slices, chart, or all (the default); each
#   part runs in well under 10 minutes. Needs only the test binary, this
#   script, cudaclient.py (ctypes on libcuda.so.1) and python3; root, for
#   the compute mode, cgroups, mount namespaces and the MPS daemon.
#
# --keep-compute-mode never changes the GPU's compute mode, and without
# --enable-mig its MIG mode is never changed (the lent machines: their MIG
# rows then need MIG on already, and are skipped saying so). --enable-mig
# turns MIG on for the MIG rows and off after. --driver-root is where the
# driver's files are (the chart's nvidiaDriverRoot, /usr/local/nvidia on
# the lent machines). --torch runs the PyTorch client.py instead.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = build ]; then
	cd "$here/../.."
	CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations go test -c -tags acceptance -o "$here/carve-acceptance.test" ./gpu/acceptance
	CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations go build -tags "$(grep -v '^#' cmd/carve/buildtags)" -o "$here/carve" ./cmd/carve
	echo "built $here/carve-acceptance.test and $here/carve; copy them with run.sh and cudaclient.py to the GPU host"
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
tests='^(TestDiscovery|TestMIG|TestAcceptance|TestAgentAsChart)$'
flags="-client $here/cudaclient.py"
while [ $# -gt 0 ]; do
	case "$1" in
	all) ;;
	discovery) tests='^TestDiscovery$' ;;
	mig) tests='^TestMIG$' ;;
	slices) tests='^TestAcceptance$' ;;
	chart) tests='^TestAgentAsChart$' ;;
	--keep-compute-mode) flags="$flags -keep-compute-mode" ;;
	--enable-mig) flags="$flags -enable-mig" ;;
	--dry-run) flags="$flags -dry-run"; tests='^TestAcceptance$' ;;
	--torch) flags="$flags -client $here/client.py" ;;
	--driver-root) shift; flags="$flags -driver-root ${1:?--driver-root DIR}" ;;
	--tenant-uid) shift; flags="$flags -tenant-uid ${1:?--tenant-uid N}" ;;
	*) echo "usage: $0 build | record DIR | [all|discovery|mig|slices|chart] [--keep-compute-mode] [--enable-mig] [--driver-root DIR] [--tenant-uid N] [--torch] [--dry-run]" >&2; exit 2 ;;
	esac
	shift
done
cd "$here"
# shellcheck disable=SC2086
exec ./carve-acceptance.test -test.run "$tests" -test.v -test.timeout 30m $flags

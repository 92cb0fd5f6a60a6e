#!/bin/sh
# The acceptance run of carve's GPU paths on a real GPU.
#
# Here (with Go):    gpu/acceptance/run.sh build   -> gpu/acceptance/carve-acceptance.test, carve
# Here (with Go):    gpu/acceptance/run.sh pack    -> gpu/acceptance/pack/ (make gpu-acceptance-pack)
# On a lent machine: cd gpu/acceptance/pack && OUT=$OUT ./run.sh device
#   (every part below in one call of at most 7 minutes; results in $OUT)
# On the GPU host:   ./run.sh record DIR [DRIVER_ROOT]   (environment, nvidia-smi, NVML as the driver answers)
# On the GPU host:   ./run.sh [PART] [--keep-compute-mode] [--enable-mig] [--driver-root DIR] [--tenant-uid N] [--torch] [--dry-run] [--timeout D]
#   PART is one of discovery, mig, probe, slices, chart, or all (the
#   default); each part runs in well under 10 minutes. Needs only the test binary, this
#   script, cudaclient.py (ctypes on libcuda.so.1) and python3; root, for
#   the compute mode, cgroups, mount namespaces and the MPS daemon.
#
# --keep-compute-mode never changes the GPU's compute mode, and without
# --enable-mig its MIG mode is never changed (the lent machines: their MIG
# rows then need MIG on already, and are skipped saying so). --enable-mig
# turns MIG on for the MIG rows and off after. --driver-root is where the
# driver's files are (the chart's nvidiaDriverRoot, /usr/local/nvidia on
# the lent machines). --torch runs the PyTorch client.py instead.
# --timeout is the test binary's -test.timeout (30m unless given).
set -eu
here=$(cd "$(dirname "$0")" && pwd)

# gobuild DIR LDFLAGS: the test binary and carve into DIR, cgo on (go-nvml)
# and carve with its build tags (cmd/carve/buildtags says why).
gobuild() {
	(
		cd "$here/../.."
		CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations go test -c -tags acceptance -ldflags "$2" -o "$1/carve-acceptance.test" ./gpu/acceptance
		CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations go build -tags "$(grep -v '^#' cmd/carve/buildtags)" -ldflags "$2" -o "$1/carve" ./cmd/carve
	)
}

if [ "${1:-}" = build ]; then
	gobuild "$here" ""
	echo "built $here/carve-acceptance.test and $here/carve; copy them with run.sh and cudaclient.py to the GPU host"
	exit 0
fi

if [ "${1:-}" = pack ]; then
	# What a lent machine's call carries: at most 64 MiB of untracked
	# files. Stripped (-s -w: no symbol table or DWARF; a panic's trace
	# still names its functions) and gzipped, the binaries fit.
	pack=$here/pack
	rm -rf "$pack"
	mkdir -p "$pack"
	gobuild "$pack" "-s -w"
	gzip -9 "$pack/carve-acceptance.test" "$pack/carve"
	cp "$here/run.sh" "$here/cudaclient.py" "$here/client.py" "$here/nvmlrecord.py" "$pack/"
	ls -l "$pack"
	size=$(cat "$pack"/* | wc -c)
	echo "$pack: $size bytes ($((size / 1048576)) MiB; a lent machine's call carries 64 MiB)"
	if [ "$size" -gt $((64 * 1048576)) ]; then
		echo "$pack is over 64 MiB: a lent machine's call cannot carry it" >&2
		exit 1
	fi
	echo "on the lent machine, carrying gpu/acceptance/pack: cd gpu/acceptance/pack && OUT=\$OUT ./run.sh device"
	exit 0
fi

if [ "${1:-}" = record ]; then
	# The environment record: what the card and its driver answer, through
	# nvidia-smi, through libnvidia-ml directly (nvmlrecord.py, ctypes) and
	# through carve (discover, snapshot) when a carve binary is beside it.
	out=${2:?usage: $0 record DIR [DRIVER_ROOT]}
	droot=${3:-/}
	mkdir -p "$out"
	{ date -u; uname -a; cat /etc/os-release; nvidia-smi; nvidia-smi -q; nvidia-smi mig -lgip; nvidia-smi mig -lgipp; } >"$out/environment.txt" 2>&1 || true
	python3 "$here/nvmlrecord.py" >"$out/nvmlrecord.json" 2>"$out/nvmlrecord.err" || true
	if [ -x "$here/carve" ]; then
		"$here/carve" discover --nvidia-driver-root "$droot" -o json >"$out/discover.json" 2>"$out/discover.err" || true
		"$here/carve" snapshot --nvidia-driver-root "$droot" -o "$out/snapshot.tar.gz" >"$out/snapshot.err" 2>&1 || true
	fi
	exit 0
fi

# driverroot prints where the NVIDIA driver is, as the chart's
# nvidiaDriverRoot would be set: the first of the usual roots holding
# libnvidia-ml.so.1 where carve looks below a driver root (gpu's libDirs),
# else the first holding nvidia-smi, else / where the loader knows the
# library; nothing where no driver is found.
driverroot() {
	roots="/ /usr/local/nvidia /run/nvidia/driver /home/kubernetes/bin/nvidia"
	for r in $roots; do
		for d in lib64 lib lib/x86_64-linux-gnu lib/aarch64-linux-gnu usr/lib64 usr/lib/x86_64-linux-gnu usr/lib/aarch64-linux-gnu usr/lib; do
			if [ -e "${r%/}/$d/libnvidia-ml.so.1" ]; then echo "$r"; return; fi
		done
	done
	for r in $roots; do
		if [ -x "${r%/}/bin/nvidia-smi" ] || [ -x "${r%/}/usr/bin/nvidia-smi" ]; then echo "$r"; return; fi
	done
	if ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml\.so\.1 '; then echo /; fi
}

# gvisor prints why this is gVisor, or nothing. Lent H200s may run under
# it, where MPS cannot work (nor the cgroups and mount namespaces the later
# parts use): there the run stops after discovery.
gvisor() {
	if [ "$(uname -r)" = 4.4.0 ]; then
		echo "uname -r is 4.4.0, gVisor's"
	elif grep -qi gvisor /proc/version 2>/dev/null; then
		echo "/proc/version names gVisor"
	elif timeout 5 dmesg 2>/dev/null | grep -qi gvisor; then
		echo "dmesg names gVisor"
	fi
}

if [ "${1:-}" = device ]; then
	# Every part in one call of a lent machine (10 minutes a call): each
	# under its own timeout, all within 7 minutes, the results under $OUT
	# in at most 8 files (what such a call brings back): summary.txt,
	# environment.txt, record.tar.gz and one log a test part (discovery,
	# mig, probe, slices, chart).
	out=${OUT:-./out}
	mkdir -p "$out"
	out=$(cd "$out" && pwd)
	cd "$here"
	for b in carve-acceptance.test carve; do
		if [ -f "$b.gz" ]; then gunzip -f "$b.gz"; fi
		if [ -f "$b" ]; then chmod +x "$b"; fi
	done
	deadline=$(($(date +%s) + 420))
	: >"$out/summary.txt"
	failed=0
	# say PART RC SECONDS VERDICT: a line of the summary.
	say() {
		line=$(printf '%-11s rc=%-3s %4ss  %s' "$1" "$2" "$3" "$4" | cut -c1-400)
		echo "$line" >>"$out/summary.txt"
		echo "== $line"
		case $4 in FAIL*) failed=1 ;; esac
	}
	# budget PART SECONDS: sets t, the part's timeout, within what is left
	# of the 7 minutes; fails, saying SKIP, where too little is left.
	budget() {
		left=$((deadline - $(date +%s)))
		t=$2
		if [ "$t" -gt "$left" ]; then t=$left; fi
		if [ "$t" -lt 20 ]; then
			say "$1" - 0 "SKIP ${left}s left of the 7 minutes"
			return 1
		fi
	}
	# runpart LOG CMD...: CMD under timeout t (killed 5 s after), its
	# output in LOG; sets rc and took. timeout signals CMD's whole
	# process group, so a chrooted agent or client goes too.
	runpart() {
		log=$1
		shift
		start=$(date +%s)
		rc=0
		timeout -k 5 "$t" "$@" >"$log" 2>&1 || rc=$?
		took=$(($(date +%s) - start))
	}
	# verdict LOG: PASS, FAIL or SKIP and why, from the test binary's -v
	# output and rc: the why is the last file:line message before the
	# first top-level --- FAIL or --- SKIP (t.Fatal's, t.Skip's). A PASS
	# carries the part's RESULT: line where it prints one (probe's
	# numbers).
	verdict() {
		why=$(awk '/^[ \t]+[A-Za-z0-9_]+\.go:[0-9]+: /{l=$0} /^--- (FAIL|SKIP)/{sub(/^[ \t]+/, "", l); print l; exit}' "$1")
		panic=$(grep -m1 '^panic: ' "$1" || true)
		result=$(sed -n 's/^RESULT: //p' "$1" | head -n1)
		case $rc in
		124 | 137) echo "FAIL killed at its ${t}s timeout: ${panic:-$(tail -n1 "$1")}" ;;
		0)
			if grep -q '^--- PASS' "$1"; then
				echo "PASS${result:+ $result}"
			elif grep -q '^--- SKIP' "$1"; then
				echo "SKIP $why"
			else
				echo "FAIL no test ran: $(tail -n1 "$1")"
			fi
			;;
		*) echo "FAIL ${panic:-${why:-$(tail -n1 "$1")}}" ;;
		esac
	}
	# testpart PART SECONDS ARGS...: run.sh PART ARGS as a part; the test
	# binary's own timeout 10 s inside the part's, so that a hang ends in
	# Go's report of where, not in a kill.
	testpart() {
		p=$1
		if ! budget "$p" "$2"; then return; fi
		shift 2
		runpart "$out/$p.log" "$@" --timeout "$((t - 10))s"
		say "$p" "$rc" "$took" "$(verdict "$out/$p.log")"
	}

	droot=$(driverroot)
	gv=$(gvisor)
	# nvidia-smi below a driver root that is not / (the lent machines'
	# /usr/local/nvidia) may not be on PATH: discovery holds carve against it.
	if [ -n "$droot" ] && [ "$droot" != / ]; then PATH=$droot/bin:$PATH; fi

	start=$(date +%s)
	{
		echo "# date"; date -u
		echo "# uname -a"; uname -a
		echo "# /proc/version"; cat /proc/version
		echo "# /etc/os-release"; cat /etc/os-release
		echo "# gVisor: ${gv:-no}"
		echo "# driver root: ${droot:-none found}"
		echo "# nvidia-smi"; timeout 20 nvidia-smi
		echo "# nvidia-smi -q"; timeout 30 nvidia-smi -q
	} >"$out/environment.txt" 2>&1 || true
	say environment 0 $(($(date +%s) - start)) "PASS recorded; gVisor: ${gv:-no}; driver root: ${droot:-none found}"

	if budget record 45; then
		tmp=$(mktemp -d)
		runpart "$tmp/record.log" "$here/run.sh" record "$tmp/record" "${droot:-/}"
		tar -czf "$out/record.tar.gz" -C "$tmp" .
		# A record is judged by what it holds: NVML's answer through
		# ctypes and carve's, each file's error where it is empty.
		missing=
		for f in nvmlrecord.json discover.json snapshot.tar.gz; do
			if [ ! -s "$tmp/record/$f" ]; then
				err=$(grep -v '^$' "$tmp/record/${f%%.*}.err" 2>/dev/null | tail -n1)
				missing="$missing $f (${err:-no error output});"
			fi
		done
		rm -rf "$tmp"
		if [ "$rc" != 0 ]; then
			say record "$rc" "$took" "FAIL killed at its ${t}s timeout; record.tar.gz has what it wrote"
		elif [ -n "$missing" ]; then
			say record "$rc" "$took" "FAIL missing:$missing"
		else
			say record "$rc" "$took" "PASS record.tar.gz"
		fi
	fi

	# Never changes the card's settings: the compute mode is kept, and
	# without --enable-mig (never given here) neither is the MIG mode.
	testpart discovery 45 "$here/run.sh" discovery --keep-compute-mode --driver-root "${droot:-/}"

	why=
	if [ -n "$gv" ]; then
		why="gVisor ($gv): MPS, cgroups and mount namespaces do not work there; stopped after discovery"
	elif [ -z "$droot" ]; then
		why="no NVIDIA driver found (libnvidia-ml.so.1 or nvidia-smi below / /usr/local/nvidia /run/nvidia/driver /home/kubernetes/bin/nvidia); discovery's log says what NVML answered"
	fi
	if [ -n "$why" ]; then
		for p in mig probe slices chart; do say "$p" - 0 "SKIP $why"; done
	else
		testpart mig 90 "$here/run.sh" mig --keep-compute-mode --driver-root "$droot"
		# The MPS probe: a uid-1001 client of carve's claim daemon, the
		# largest allocation its ceiling allows against NVML's figure,
		# the server's own memory (about 7 clients, well under its 60 s).
		testpart probe 60 "$here/run.sh" probe --keep-compute-mode --driver-root "$droot" --tenant-uid 1001
		testpart slices 150 "$here/run.sh" slices --keep-compute-mode --driver-root "$droot" --tenant-uid 1001
		# As the chart runs the agent: nothing of this shell's environment
		# (LD_LIBRARY_PATH above all) but PATH; the driver only through
		# its root.
		testpart chart 75 env -i PATH="$PATH" "$here/run.sh" chart --keep-compute-mode --driver-root "$droot"
	fi
	echo "results in $out:"
	ls -l "$out"
	echo "summary:"
	cat "$out/summary.txt"
	exit "$failed"
fi

tests='^(TestDiscovery|TestMIG|TestMPSProbe|TestAcceptance|TestAgentAsChart)$'
flags="-client $here/cudaclient.py"
timeout=30m
while [ $# -gt 0 ]; do
	case "$1" in
	all) ;;
	discovery) tests='^TestDiscovery$' ;;
	mig) tests='^TestMIG$' ;;
	probe) tests='^TestMPSProbe$' ;;
	slices) tests='^TestAcceptance$' ;;
	chart) tests='^TestAgentAsChart$' ;;
	--keep-compute-mode) flags="$flags -keep-compute-mode" ;;
	--enable-mig) flags="$flags -enable-mig" ;;
	--dry-run) flags="$flags -dry-run"; tests='^TestAcceptance$' ;;
	--torch) flags="$flags -client $here/client.py" ;;
	--driver-root) shift; flags="$flags -driver-root ${1:?--driver-root DIR}" ;;
	--tenant-uid) shift; flags="$flags -tenant-uid ${1:?--tenant-uid N}" ;;
	--timeout) shift; timeout=${1:?--timeout DURATION} ;;
	*) echo "usage: $0 build | pack | device | record DIR [DRIVER_ROOT] | [all|discovery|mig|probe|slices|chart] [--keep-compute-mode] [--enable-mig] [--driver-root DIR] [--tenant-uid N] [--torch] [--dry-run] [--timeout D]" >&2; exit 2 ;;
	esac
	shift
done
cd "$here"
# shellcheck disable=SC2086
exec ./carve-acceptance.test -test.run "$tests" -test.v -test.timeout "$timeout" $flags

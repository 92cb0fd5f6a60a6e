package nettest

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// RequiredEnv names the environment variable that says the tests run where
// they must not skip for lack of privilege: as root, `make unit` sets it to
// 1, and then "not root", "no bpffs" and "cannot create a namespace" fail
// instead of skipping, as CARVE_E2E_REQUIRED does for the e2e.
const RequiredEnv = "CARVE_NET_REQUIRED"

// Required reports whether RequiredEnv is 1.
func Required() bool { return os.Getenv(RequiredEnv) == "1" }

// SkipUnlessRequired skips t with the reason, or fails it where Required.
func SkipUnlessRequired(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Required() {
		t.Fatalf("%s, but %s=1", msg, RequiredEnv)
	}
	t.Skip(msg)
}

// NeedBPFFS takes the result of mounting bpffs (bpf.MountBPFFS): it returns
// on success, skips where the kernel has no bpffs (ENODEV, the answer of
// mount(2) to an unknown filesystem type) or the process may not mount
// (EPERM), unless Required; it fails on any other error.
func NeedBPFFS(t testing.TB, err error) {
	t.Helper()
	switch {
	case err == nil:
	case errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EPERM):
		SkipUnlessRequired(t, "bpffs unavailable: %v", err)
	default:
		t.Fatalf("mount bpffs: %v", err)
	}
}

// Feature is a kernel feature a test may find missing.
type Feature struct {
	what   string     // for messages
	errno  unix.Errno // what the kernel answers when the kind is missing; 0: ebpf.ErrNotSupported
	config string     // the kernel config option that builds it, "" if none
}

func (f Feature) String() string { return f.what }

// Qdisc is a qdisc kind. Adding an unknown kind answers ENOENT ("Specified
// qdisc kind is unknown"; checked on this project's kernel for fq,
// fq_codel, netem and a made-up kind).
func Qdisc(kind string) Feature {
	return Feature{what: "qdisc " + kind, errno: unix.ENOENT, config: qdiscConfig[kind]}
}

// LinkKind is a link kind. Adding an unknown kind answers EOPNOTSUPP
// ("Unknown device type"; checked for ipvlan, vlan, dummy and a made-up
// kind).
func LinkKind(kind string) Feature {
	return Feature{what: "link kind " + kind, errno: unix.EOPNOTSUPP, config: linkConfig[kind]}
}

// Filter is a tc filter or action kind. An unknown one answers ENOENT
// (checked for act_police and a made-up filter kind).
func Filter(kind string) Feature {
	return Feature{what: "tc filter/action " + kind, errno: unix.ENOENT, config: filterConfig[kind]}
}

// BPF is a BPF program type, helper, attach type (TCX) or command
// (BPF_PROG_RUN): cilium/ebpf probes the kernel and answers
// ebpf.ErrNotSupported.
func BPF(what string) Feature { return Feature{what: "BPF " + what} }

var (
	qdiscConfig = map[string]string{
		"htb": "NET_SCH_HTB", "tbf": "NET_SCH_TBF", "fq": "NET_SCH_FQ", "fq_codel": "NET_SCH_FQ_CODEL",
		"netem": "NET_SCH_NETEM", "clsact": "NET_SCH_INGRESS", "ingress": "NET_SCH_INGRESS", "prio": "NET_SCH_PRIO",
		"pfifo": "NET_SCHED", "bfifo": "NET_SCHED", // sch_fifo is built with the scheduler
	}
	linkConfig = map[string]string{
		"veth": "VETH", "macvlan": "MACVLAN", "ipvlan": "IPVLAN", "ifb": "IFB", "vlan": "VLAN_8021Q",
		"dummy": "DUMMY", "bridge": "BRIDGE",
	}
	filterConfig = map[string]string{
		"bpf": "NET_CLS_BPF", "u32": "NET_CLS_U32", "mirred": "NET_ACT_MIRRED", "police": "NET_ACT_POLICE",
	}
)

// KernelLacks reports whether err is the kernel's answer to f missing: the
// errno f's kind of feature gets, and, where the running kernel's config is
// readable (/proc/config.gz), f's option not built in (=y). Any other error
// is not the kernel lacking f, and the test must fail on it.
func KernelLacks(err error, f Feature) bool {
	if err == nil {
		return false
	}
	if f.errno == 0 {
		return errors.Is(err, ebpf.ErrNotSupported)
	}
	if !errors.Is(err, f.errno) {
		return false
	}
	return f.config == "" || kernelConfig("CONFIG_"+f.config) != "y"
}

// SkipIfLacks returns when err is nil, skips when the kernel lacks f, and
// fails on any other error.
func SkipIfLacks(t testing.TB, err error, f Feature) {
	t.Helper()
	if err == nil {
		return
	}
	if KernelLacks(err, f) {
		t.Skipf("kernel lacks %s: %v", f, err)
	}
	t.Fatalf("%s: %v", f, err)
}

// kernelConfig is the value of option in the running kernel's config ("y",
// "m"; "" where it is not set or the config is not readable).
func kernelConfig(option string) string {
	f, err := os.Open("/proc/config.gz")
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }() // read only
	z, err := gzip.NewReader(f)
	if err != nil {
		return ""
	}
	sc := bufio.NewScanner(z)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), option+"="); ok {
			return v
		}
	}
	return ""
}

package kernelprobe

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MinimumKernel is the oldest Linux carve supports, as major and minor.
// Below 5.18 the classifier cannot load: bpf_skb_set_tstamp, with which its
// AQM stamps frames, came in 5.18, SO_NETNS_COOKIE, by which the agent knows
// a pod's namespace, in 5.14, and struct net's u64 net_cookie, which it
// reads where tc has no bpf_get_netns_cookie, in 5.12 (on Debian 11's 5.10
// the load fails on that relocation: make vmtest). 6.1 is the oldest kernel
// the datapath tests pass on (make vmtest, Debian 12's), and no major
// distribution ships one between 5.18 and 6.1 (deploy/vmtest/README.md).
var MinimumKernel = [2]int{6, 1}

// ParseRelease reads the major and minor version from a kernel release
// string (uname -r: "6.1.0-50-amd64", "5.14.0-427.el9.x86_64").
func ParseRelease(release string) ([2]int, error) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return [2]int{}, fmt.Errorf("kernel release %q: no major.minor", release)
	}
	major, err := strconv.Atoi(parts[0])
	if err != nil {
		return [2]int{}, fmt.Errorf("kernel release %q: major: %w", release, err)
	}
	minor := parts[1] // "0-50-amd64" is the third part; "14-rc1" has no third
	if i := strings.IndexFunc(minor, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minor = minor[:i]
	}
	m, err := strconv.Atoi(minor)
	if err != nil {
		return [2]int{}, fmt.Errorf("kernel release %q: minor: %w", release, err)
	}
	return [2]int{major, m}, nil
}

// CheckRelease returns nil where release is at least MinimumKernel, else
// an error that says why carve refuses it.
func CheckRelease(release string) error {
	v, err := ParseRelease(release)
	if err != nil {
		return err
	}
	if v[0] > MinimumKernel[0] || v[0] == MinimumKernel[0] && v[1] >= MinimumKernel[1] {
		return nil
	}
	return fmt.Errorf("kernel %s is older than carve's minimum, Linux %d.%d: carve's BPF classifier cannot load there "+
		"(it needs bpf_skb_set_tstamp, Linux 5.18, among others); README.md lists the supported kernels",
		release, MinimumKernel[0], MinimumKernel[1])
}

// CheckRunning is CheckRelease of the running kernel.
func CheckRunning() error {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return fmt.Errorf("uname: %w", err)
	}
	return CheckRelease(unix.ByteSliceToString(u.Release[:]))
}

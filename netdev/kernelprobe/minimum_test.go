package kernelprobe

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf"
)

func TestCheckRelease(t *testing.T) {
	for release, ok := range map[string]bool{
		"6.1.0-50-amd64": true, "6.12.117+deb13-amd64": true, "6.18.44-fc-v669": true, "7.3.0-1-amd64": true,
		"6.0.19": false, "5.15.0-126-generic": false, "5.14.0-427.el9.x86_64": false, "5.10.0-35-amd64": false, "6.1-rc1": true,
	} {
		err := CheckRelease(release)
		if (err == nil) != ok {
			t.Errorf("CheckRelease(%q) = %v, want accepted %v", release, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), "older than carve's minimum, Linux 6.1") {
			t.Errorf("CheckRelease(%q): %v, want it to name the minimum", release, err)
		}
	}
	for _, bad := range []string{"", "6", "x.1", "6.y"} {
		if err := CheckRelease(bad); err == nil || strings.Contains(err.Error(), "older") {
			t.Errorf("CheckRelease(%q) = %v, want a parse error", bad, err)
		}
	}
}

// The minimum agrees with the running kernel: where it is accepted, the
// classifier loads; where it is refused for lacking bpf_skb_set_tstamp
// (before 5.18), it does not. make vmtest runs this on 6.12, 6.1 and, as
// the oldest kernel Debian's mirror serves, bullseye's 5.10.
func TestMinimumAgreesWithTheClassifier(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads the classifier")
	}
	_ = rlimit.RemoveMemlock() // kernels before 5.11 charge BPF memory to it
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(u.Release[:])
	if err := bpf.MountBPFFS(""); err != nil {
		t.Skipf("no bpffs: %v", err)
	}
	dir := filepath.Join(bpf.DefaultBPFFS, "carve-test-minimum-"+filepath.Base(t.TempDir()))
	t.Cleanup(func() { os.RemoveAll(dir) })
	s, loadErr := bpf.OpenShaper(dir)
	if loadErr == nil {
		s.Close()
	}
	checkErr := CheckRunning()
	t.Logf("kernel %s: check %v; classifier load %v", release, checkErr, loadErr)
	v, err := ParseRelease(release)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case checkErr == nil && loadErr != nil:
		t.Errorf("kernel %s is accepted, but the classifier does not load: %v", release, loadErr)
	case checkErr != nil && (v[0] < 5 || v[0] == 5 && v[1] < 18) && loadErr == nil:
		t.Errorf("kernel %s is refused for lacking what the classifier needs, but it loaded", release)
	}
}

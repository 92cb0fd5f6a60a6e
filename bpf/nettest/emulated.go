package nettest

import "os"

// VMTestEnv names the environment variable that make vmtest's guests set
// to their kernel (deploy/vmtest/run.sh): the tests then run under qemu's
// emulation (TCG), where CPU work is about 7 times slower than on the host
// and a sender can fall behind its share's rate.
const VMTestEnv = "CARVE_VMTEST"

// Emulated returns the kernel of the make vmtest guest the tests run in
// (say "trixie-6.12.117+deb13-amd64"), or "" on a host.
func Emulated() string { return os.Getenv(VMTestEnv) }

// LimitMet is TCP goodput over a share's limit when the limit is met
// exactly: the rest is TCP/IP and Ethernet headers (1448 of 1514 bytes).
const LimitMet = 0.956

// GoodputBand returns the band that TCP goodput over a share's limit must
// fall in: [lo, hi], the test's own, on a host; in a make vmtest guest, the
// band that fits emulation, 0.90 to 1.02 of the limit met (0.860 to 0.975
// of the limit as goodput). Measured in the guest with the host quiet, HTB
// held TCP within 1% of the host's figure, and down to 0.88 of it with other
// work on the host's two cores (deploy/vmtest/README.md).
func GoodputBand(lo, hi float64) (float64, float64) {
	if Emulated() != "" {
		return 0.90 * LimitMet, 1.02 * LimitMet
	}
	return lo, hi
}

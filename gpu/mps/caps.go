package mps

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultCapabilities are what the control daemon keeps, and the servers it
// starts inherit, unless told otherwise: a container runtime's default set
// for a container (containerd's and Docker's), in which others run the MPS
// control daemon as root without privilege, less the two of the network
// (MPS speaks over unix sockets and FIFOs only). The agent that starts the
// daemon is privileged, and a daemon every tenant of its claim can talk to
// must not keep CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_BPF, CAP_SYS_MODULE,
// CAP_SYS_PTRACE and the rest: an allow-list, so that a capability a newer
// kernel adds is dropped too. The daemon forks a server per client UID and
// setuid()s it (CAP_SETUID, CAP_SETGID) and signals it (CAP_KILL).
var DefaultCapabilities = []string{
	"CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_MKNOD", "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT",
}

// AllCapabilities is the name that, given alone, keeps every capability the
// agent has (the daemon as it was started before carve restricted it).
const AllCapabilities = "all"

// capNumbers are the capabilities by name (linux/capability.h).
var capNumbers = map[string]int{
	"CAP_CHOWN": unix.CAP_CHOWN, "CAP_DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE, "CAP_DAC_READ_SEARCH": unix.CAP_DAC_READ_SEARCH,
	"CAP_FOWNER": unix.CAP_FOWNER, "CAP_FSETID": unix.CAP_FSETID, "CAP_KILL": unix.CAP_KILL, "CAP_SETGID": unix.CAP_SETGID,
	"CAP_SETUID": unix.CAP_SETUID, "CAP_SETPCAP": unix.CAP_SETPCAP, "CAP_LINUX_IMMUTABLE": unix.CAP_LINUX_IMMUTABLE,
	"CAP_NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE, "CAP_NET_BROADCAST": unix.CAP_NET_BROADCAST,
	"CAP_NET_ADMIN": unix.CAP_NET_ADMIN, "CAP_NET_RAW": unix.CAP_NET_RAW, "CAP_IPC_LOCK": unix.CAP_IPC_LOCK,
	"CAP_IPC_OWNER": unix.CAP_IPC_OWNER, "CAP_SYS_MODULE": unix.CAP_SYS_MODULE, "CAP_SYS_RAWIO": unix.CAP_SYS_RAWIO,
	"CAP_SYS_CHROOT": unix.CAP_SYS_CHROOT, "CAP_SYS_PTRACE": unix.CAP_SYS_PTRACE, "CAP_SYS_PACCT": unix.CAP_SYS_PACCT,
	"CAP_SYS_ADMIN": unix.CAP_SYS_ADMIN, "CAP_SYS_BOOT": unix.CAP_SYS_BOOT, "CAP_SYS_NICE": unix.CAP_SYS_NICE,
	"CAP_SYS_RESOURCE": unix.CAP_SYS_RESOURCE, "CAP_SYS_TIME": unix.CAP_SYS_TIME, "CAP_SYS_TTY_CONFIG": unix.CAP_SYS_TTY_CONFIG,
	"CAP_MKNOD": unix.CAP_MKNOD, "CAP_LEASE": unix.CAP_LEASE, "CAP_AUDIT_WRITE": unix.CAP_AUDIT_WRITE,
	"CAP_AUDIT_CONTROL": unix.CAP_AUDIT_CONTROL, "CAP_SETFCAP": unix.CAP_SETFCAP, "CAP_MAC_OVERRIDE": unix.CAP_MAC_OVERRIDE,
	"CAP_MAC_ADMIN": unix.CAP_MAC_ADMIN, "CAP_SYSLOG": unix.CAP_SYSLOG, "CAP_WAKE_ALARM": unix.CAP_WAKE_ALARM,
	"CAP_BLOCK_SUSPEND": unix.CAP_BLOCK_SUSPEND, "CAP_AUDIT_READ": unix.CAP_AUDIT_READ, "CAP_PERFMON": unix.CAP_PERFMON,
	"CAP_BPF": unix.CAP_BPF, "CAP_CHECKPOINT_RESTORE": unix.CAP_CHECKPOINT_RESTORE,
}

// Capabilities is the set a daemon keeps; nil keeps them all.
type Capabilities []int

// ParseCapabilities reads capability names (CAP_SETUID or SETUID, any
// case); the one name "all" keeps every capability (nil). An unknown name
// is an error naming it.
func ParseCapabilities(names []string) (Capabilities, error) {
	if len(names) == 1 && strings.EqualFold(strings.TrimSpace(names[0]), AllCapabilities) {
		return nil, nil
	}
	out := Capabilities{}
	for _, name := range names {
		n := strings.ToUpper(strings.TrimSpace(name))
		if n == "" {
			continue
		}
		if !strings.HasPrefix(n, "CAP_") {
			n = "CAP_" + n
		}
		c, ok := capNumbers[n]
		if !ok {
			return nil, fmt.Errorf("capability %q: not one Linux defines (%s, or %q to keep them all)", name, knownCapabilities(), AllCapabilities)
		}
		out = append(out, c)
	}
	sort.Ints(out)
	return out, nil
}

func knownCapabilities() string {
	names := make([]string, 0, len(capNumbers))
	for n := range capNumbers {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// mask is the set as a bit mask of capability numbers.
func (c Capabilities) mask() uint64 {
	var m uint64
	for _, n := range c {
		m |= 1 << uint(n)
	}
	return m
}

// restrict narrows the calling thread's capabilities to c, for what it
// forks and execs next: every other capability leaves its bounding set
// (what an exec'd root process's permitted set is cut to), its inheritable
// set and the ambient set. Only on a thread of its own (hostmount.
// OnOwnThread): capabilities are a thread's, and the thread must end with
// the start. Nil keeps everything.
func (c Capabilities) restrict() error {
	if c == nil {
		return nil
	}
	last, err := lastCapability()
	if err != nil {
		return err
	}
	keep := c.mask()
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear the ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read the thread's capabilities: %w", err)
	}
	data[0].Inheritable &= uint32(keep)
	data[1].Inheritable &= uint32(keep >> 32)
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("narrow the inheritable capabilities: %w", err)
	}
	// CAP_SETPCAP, needed to drop from the bounding set, goes last.
	for n := last; n >= 0; n-- {
		if keep&(1<<uint(n)) != 0 || n == unix.CAP_SETPCAP {
			continue
		}
		if err := dropBounding(n); err != nil {
			return err
		}
	}
	if keep&(1<<unix.CAP_SETPCAP) == 0 {
		return dropBounding(unix.CAP_SETPCAP)
	}
	return nil
}

func dropBounding(n int) error {
	if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(n), 0, 0, 0); err != nil {
		return fmt.Errorf("drop capability %d from the bounding set: %w", n, err)
	}
	return nil
}

// lastCapability is the kernel's highest capability number.
func lastCapability() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("the kernel's last capability: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 || n > 63 {
		return 0, fmt.Errorf("the kernel's last capability: %q", strings.TrimSpace(string(b)))
	}
	return n, nil
}

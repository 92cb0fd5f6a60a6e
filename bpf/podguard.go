package bpf

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// A share's pod guard (pod_guard in shaper.c, the policy in policy.h) sits
// on the egress of the share's own interface, in its pod, and checks every
// frame the pod sends, its kernel's own ARP and ND included, which carry no
// socket of the pod's and so escape the parent's check by namespace. The
// program cannot tell from a frame which pod sent it (a socket-less frame's
// namespace reads as the node's), so the agent loads one instance per
// share with the share's MAC, parent and checks in its own frozen data
// map, and pins it.
// That instance only hands them to the policy, one program the classifier
// loads and keeps in a pinned program array, by a tail call: it verifies
// in microseconds, where the whole policy took 4-7 ms of every prepare; the runtime hook attaches it once
// the interface is in the pod (PodHook says how). Unprepare removes the
// pins; the filter or link goes with the interface.

// podGuardDir holds the pod guards' pins under the agent's pin directory.
const podGuardDir = "pod_guard"

// PodGuardProgramPath is where the agent pins the pod guard of the share
// whose host-side name is name.
func PodGuardProgramPath(pinDir, name string) string {
	return filepath.Join(pinDir, podGuardDir, name+"_prog")
}

// PodGuardLinkPath is where the hook pins the pod guard's link.
func PodGuardLinkPath(pinDir, name string) string {
	return filepath.Join(pinDir, podGuardDir, name+"_link")
}

// PinPodGuard takes a pod guard from the pool (PreloadPodGuards) or loads
// one, gives it the share named g.MAC on parent g.Parent, with g's checks,
// and pins it for the hook, in place of one pinned before under the same
// name. g.VLAN is the share's VLAN, in which
// its addresses are recorded; in the pod a frame carries no tag at all
// (the host's VLAN device adds it).
func (s *Shaper) PinPodGuard(name string, g PodShare) error {
	mac, err := net.ParseMAC(g.MAC)
	if err != nil || len(mac) != 6 {
		return fmt.Errorf("pod guard of %s: MAC %q: %v", name, g.MAC, err)
	}
	vf, err := g.vlanFlags()
	if err != nil {
		return err
	}
	var share [6]byte
	copy(share[:], mac)
	data, err := s.guardData(map[string]any{"guard_share_mac": share, "guard_parent": uint32(g.Parent), "guard_flags": vf})
	if err != nil {
		return err
	}
	guard, err := s.takeGuard()
	if err != nil {
		return fmt.Errorf("pod guard of %s: %w", name, err)
	}
	defer guard.close()
	// Frozen, the share's data are as fixed as constants: no one can
	// write them through the bpf syscall any more, the agent included.
	if err := guard.data.Update(uint32(0), data, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("pod guard of %s: write its data: %w", name, err)
	}
	if err := guard.data.Freeze(); err != nil {
		return fmt.Errorf("pod guard of %s: freeze its data: %w", name, err)
	}
	path := PodGuardProgramPath(s.pinDir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return pinReplacing(guard.prog, path)
}

// UnpinPodGuard removes the pins of the pod guard of the share named name:
// its program and its link (the link ends with them, or with the
// interface). Removing what is not there is no error.
func UnpinPodGuard(pinDir, name string) error {
	var errs []error
	for _, p := range []string{PodGuardLinkPath(pinDir, name), podGuardFilterPath(pinDir, name), PodGuardProgramPath(pinDir, name), PodGuardProgramPath(pinDir, name) + "_new"} {
		if err := unix.Unlink(p); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// podGuardProg names the pod guard's cls_bpf filter (carve-pod_guard).
const podGuardProg = "pod_guard"

// ErrNoPodGuard is returned by AttachPodGuard where the agent pinned no
// guard for the share (an older agent prepared it).
var ErrNoPodGuard = errors.New("no pod guard pinned for the share")

// AttachPodGuard attaches the pod guard pinned for the share named name to
// the egress of ifindex, in the caller's current netns, as how says: a
// cls_bpf filter (replaced in place: the hook runs once per container),
// whose ifindex it records beside the program, or a TCX link it pins
// there. Where a link is pinned already and still on ifindex (an earlier
// container's, or an older hook's), it does nothing.
func AttachPodGuard(pinDir, name string, ifindex int, how PodHook) error {
	if ifindex <= 0 {
		return fmt.Errorf("bad ifindex %d", ifindex)
	}
	linkPath := PodGuardLinkPath(pinDir, name)
	if l, err := link.LoadPinnedLink(linkPath, nil); err == nil {
		info, ierr := l.Info()
		l.Close()
		if ierr == nil {
			if tcx := info.TCX(); tcx != nil && int(tcx.Ifindex) == ifindex {
				return nil
			}
		}
		// A link of an interface since gone (a restarted sandbox).
		if err := unix.Unlink(linkPath); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove %s: %w", linkPath, err)
		}
	}
	prog, err := ebpf.LoadPinnedProgram(PodGuardProgramPath(pinDir, name), nil)
	if errors.Is(err, os.ErrNotExist) {
		return ErrNoPodGuard
	}
	if err != nil {
		return fmt.Errorf("open the pod guard of %s: %w", name, err)
	}
	defer prog.Close()
	// Before 6.6 (Debian's 6.1: make vmtest) a cls_bpf filter on the
	// interface holds the guard, and goes with it; the hook failed there
	// for every share. There is no link to pin: the ifindex is recorded
	// instead (podguard_legacy.go).
	if forceLegacy || how == PodHookFilter {
		return attachPodGuardLegacy(pinDir, name, ifindex, prog)
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXEgress, Anchor: link.Head()})
	if errors.Is(err, ebpf.ErrNotSupported) {
		return attachPodGuardLegacy(pinDir, name, ifindex, prog)
	}
	if err != nil {
		return fmt.Errorf("attach the pod guard of %s to ifindex %d: %w", name, ifindex, err)
	}
	defer l.Close()
	if err := l.Pin(linkPath); err != nil {
		return fmt.Errorf("pin %s: %w", linkPath, err)
	}
	return nil
}

// PodHook is how the hook puts a program (the pod guard, the ingress AQM's
// share_dequeued) on a share's interface in its pod.
type PodHook int

const (
	// PodHookFilter is a cls_bpf filter on the interface's clsact, which
	// only a process with CAP_NET_ADMIN (or CAP_SYS_ADMIN) in the pod
	// could delete; the hook starts no container of a share with either
	// unless its class sets allowNetAdmin. It takes about 0.3 ms.
	PodHookFilter PodHook = iota
	// PodHookLink is a TCX link the hook pins on the host: nothing in the
	// pod holds it, so nothing there can detach it, whatever its
	// capabilities. Each attach waits for two RCU grace periods under the
	// RTNL lock, 6-24 ms on this project's machines (p50 10 ms), which
	// a share pod's first container waited for (issue 44).
	PodHookLink
)

// Pod guard states (PodGuardState).
const (
	PodGuardPending  = "pending"  // pinned; no container of the pod has started
	PodGuardAttached = "attached" // its link holds it on the share's interface
	PodGuardDetached = "detached" // its link's interface is gone
)

// PodGuardState says where the pod guard of the share named name is: ""
// where none is pinned for it (an older agent made the share, or its pin
// was removed), else one of the PodGuard* states.
func PodGuardState(pinDir, name string) (string, error) {
	if _, err := os.Stat(PodGuardProgramPath(pinDir, name)); errors.Is(err, os.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", err
	}
	ifindex, err := PodGuardIfindex(pinDir, name)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return PodGuardPending, nil
	case err != nil:
		return "", err
	case ifindex == 0:
		return PodGuardDetached, nil
	}
	return PodGuardAttached, nil
}

// PodGuardIfindex is the index, in its pod's network namespace, of the
// interface the pod guard of share name is attached to: 0 where it is
// detached (the interface is gone), os.ErrNotExist where the hook has not
// attached it yet.
func PodGuardIfindex(pinDir, name string) (int, error) {
	l, err := link.LoadPinnedLink(PodGuardLinkPath(pinDir, name), nil)
	if errors.Is(err, os.ErrNotExist) {
		// No TCX: the hook recorded its cls_bpf filter's interface.
		if ifindex, lerr := legacyPodGuardIfindex(pinDir, name); lerr == nil || !errors.Is(lerr, os.ErrNotExist) {
			return ifindex, lerr
		}
	}
	if err != nil {
		return 0, fmt.Errorf("the pod guard link of %s: %w", name, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return 0, fmt.Errorf("the pod guard link of %s: %w", name, err)
	}
	if tcx := info.TCX(); tcx != nil {
		return int(tcx.Ifindex), nil
	}
	return 0, nil
}

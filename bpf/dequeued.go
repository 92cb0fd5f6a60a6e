package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// The ingress side's AQM runs in share_dequeued (aqm.h), on the ingress of
// the share's own interface: the first hook a frame reaches after the
// IFB's queue. The interface only has a pod's namespace to sit in once the
// runtime hook has moved it there, and moving a device drops its tc
// attachments, so the agent pins the program and the hook attaches it.
// It is attached by BPF_PROG_ATTACH, not a link: it then lives exactly as
// long as the interface, with nothing pinned per share to clean up.

// dequeuedPin is share_dequeued's pin under the agent's pin directory.
const dequeuedPin = "prog_share_dequeued"

// DequeuedProgramPath is where the agent pins share_dequeued.
func DequeuedProgramPath(pinDir string) string { return filepath.Join(pinDir, dequeuedPin) }

// pinDequeued pins this agent's share_dequeued in place of an earlier one.
// Interfaces that have the earlier one keep it; it reads the same maps.
func (s *Shaper) pinDequeued() error {
	return pinReplacing(s.objs.ShareDequeued, DequeuedProgramPath(s.pinDir))
}

// pinReplacing pins prog at path in place of what is pinned there, in one
// rename: a reader (the hook) finds the old program or the new, never none.
func pinReplacing(prog *ebpf.Program, path string) error {
	tmp := path + "_new" // bpffs refuses names with a dot
	// unix.Unlink: os.Remove of an absent file on bpffs reports rmdir's
	// EPERM.
	if err := unix.Unlink(tmp); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove %s: %w", tmp, err)
	}
	if err := prog.Pin(tmp); err != nil {
		return fmt.Errorf("pin %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("pin %s: %w", path, err)
	}
	return nil
}

// ErrNoDequeuedProgram is returned by AttachDequeued where no agent pinned
// share_dequeued (an older agent made the share): the share then runs
// without an ingress AQM.
var ErrNoDequeuedProgram = errors.New("no share_dequeued program pinned")

// AttachDequeued puts the program pinned under pinDir on the ingress of
// ifindex, in the caller's current netns (see Attach), as how says (a
// cls_bpf filter, replaced in place, or a TCX program), unless a TCX
// share_dequeued is there already (an earlier container's, or an older
// hook's): the hook runs once per container.
func AttachDequeued(pinDir string, ifindex int, how PodHook) error {
	if ifindex <= 0 {
		return fmt.Errorf("bad ifindex %d", ifindex)
	}
	prog, err := ebpf.LoadPinnedProgram(DequeuedProgramPath(pinDir), nil)
	if errors.Is(err, os.ErrNotExist) {
		return ErrNoDequeuedProgram
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", DequeuedProgramPath(pinDir), err)
	}
	defer prog.Close()
	if forceLegacy {
		return attachLegacy(ifindex, prog, shaperProgShareDequeued, hookParent(ebpf.AttachTCXIngress))
	}
	res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: ebpf.AttachTCXIngress})
	if errors.Is(err, unix.EINVAL) || errors.Is(err, ebpf.ErrNotSupported) {
		// No TCX (before 6.6): a cls_bpf filter, replaced in place.
		return attachLegacy(ifindex, prog, shaperProgShareDequeued, hookParent(ebpf.AttachTCXIngress))
	}
	if err != nil {
		return fmt.Errorf("list the programs on ifindex %d: %w", ifindex, err)
	}
	for _, p := range res.Programs {
		attached, err := ebpf.NewProgramFromID(p.ID)
		if err != nil {
			continue // gone meanwhile
		}
		info, err := attached.Info()
		attached.Close()
		if err == nil && info.Name == shaperProgShareDequeued {
			return nil
		}
	}
	if how == PodHookFilter {
		return attachLegacy(ifindex, prog, shaperProgShareDequeued, hookParent(ebpf.AttachTCXIngress))
	}
	err = link.RawAttachProgram(link.RawAttachProgramOptions{Target: ifindex, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("attach %s to ifindex %d: %w", shaperProgShareDequeued, ifindex, err)
	}
	return nil
}

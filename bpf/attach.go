package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Legacy cls_bpf filters are found again by this priority and handle; no
// link object exists to pin for them.
const (
	legacyPrio   = 0xca7e
	legacyHandle = 1
)

// forceLegacy makes Attach take the clsact path; tests set it to cover the
// fallback on kernels that do have TCX.
var forceLegacy = false

func (s *Shaper) prog(dir Direction) (*ebpf.Program, string, error) {
	switch dir {
	case Egress:
		return s.objs.ClassifyEgress, shaperProgClassifyEgress, nil
	case Ingress:
		return s.objs.ClassifyIngress, shaperProgClassifyIngress, nil
	}
	return nil, "", fmt.Errorf("bad direction %d", dir)
}

// pinPath names the pin of prog's link on ifindex. An ifindex is only unique
// within a netns (every pod's eth0 is about 2), so the name carries the
// caller's netns inode too; without it attaching in a second netns would
// find and reprogram the first netns's link.
func (s *Shaper) pinPath(progName string, ifindex int) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return "", fmt.Errorf("current netns: %w", err)
	}
	return filepath.Join(s.pinDir, fmt.Sprintf("%s-%d-%d", progName, st.Ino, ifindex)), nil
}

// progNames are every program Attach may leave on a device's egress hook.
var progNames = []string{shaperProgClassifyEgress, shaperProgClassifyIngress, shaperProgEdtEgress}

// Attach puts the classifier for dir on the egress hook of ifindex: for
// Ingress, ifindex is the IFB that the parent's ingress is mirrored to.
//
// ifindex is resolved in the calling thread's current netns: a caller that
// works in another netns must runtime.LockOSThread and netns.Set first.
//
// The TCX link is pinned, so it outlives this process. Attach is idempotent:
// when a live pinned link exists, its program is swapped with link.Update, so
// no packet goes unclassified. A device carries one of our programs:
// attaching one removes the others. Kernels without TCX (before 6.6) get a
// direct-action cls_bpf filter on a clsact qdisc instead.
func (s *Shaper) Attach(ifindex int, dir Direction) error {
	prog, name, err := s.prog(dir)
	if err != nil {
		return err
	}
	return s.attach(ifindex, prog, name)
}

// AttachEDT puts edt_egress on the egress hook of ifindex instead of a
// classifier, as Attach does. It paces each share set with SetRate by
// stamping departure times; that needs an fq qdisc on the device (sch_fq),
// without which frames leave unpaced.
func (s *Shaper) AttachEDT(ifindex int) error {
	return s.attach(ifindex, s.objs.EdtEgress, shaperProgEdtEgress)
}

// AttachRedirect sends the frames that parent receives for an ingress share
// (by destination MAC) to ifb's egress, where the IFB's HTB and the ingress
// classifier shape them; the host's own traffic, broadcast and multicast
// stay on the parent, unshaped and off the IFB. Like Attach it is pinned,
// idempotent, at the head of the parent's TCX ingress, and falls back to
// cls_bpf on clsact where the kernel has no TCX.
func (s *Shaper) AttachRedirect(parent, ifb int) error {
	if parent <= 0 || ifb <= 0 {
		return fmt.Errorf("bad ifindex: parent %d, IFB %d", parent, ifb)
	}
	if err := s.objs.IfbOf.Put(uint32(parent), uint32(ifb)); err != nil {
		return fmt.Errorf("record IFB %d of ifindex %d: %w", ifb, parent, err)
	}
	if !forceLegacy {
		err := s.attachAt(parent, s.objs.RedirectIngress, shaperProgRedirectIngress, ebpf.AttachTCXIngress)
		if !errors.Is(err, errNoTCX) {
			return err
		}
	}
	return attachLegacyRedirect(parent, ifb)
}

// errNoTCX is attachAt's answer, for AttachRedirect, where the kernel has
// no TCX.
var errNoTCX = errors.New("no TCX")

// attachLegacyRedirect sends all of parent's ingress to the IFB with act_mirred
// (a u32 filter matching every frame), in place of redirect_ingress, on
// kernels without TCX: before 6.4 an IFB drops every frame a BPF program
// redirects to it (bpf_redirect did not mark it redirected), so on Debian's
// 6.1 (make vmtest) no frame towards an ingress share arrived. The kernels
// that drop them all lack TCX (6.6). The IFB's classifier then passes the
// node's own frames, which take its HTB's direct queue, unshaped.
func attachLegacyRedirect(parent, ifb int) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: parent, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add clsact to ifindex %d: %w", parent, err)
	}
	if err := detachLegacy(parent, netlink.HANDLE_MIN_INGRESS); err != nil {
		return err
	}
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: parent, Parent: netlink.HANDLE_MIN_INGRESS, Priority: legacyPrio, Protocol: unix.ETH_P_ALL},
		Sel:         &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Nkeys: 1, Keys: []netlink.TcU32Key{{}}},
		Actions:     []netlink.Action{netlink.NewMirredAction(ifb)},
	}
	if err := netlink.FilterAdd(f); err != nil {
		return fmt.Errorf("redirect the ingress of ifindex %d to IFB %d with mirred: %w", parent, ifb, err)
	}
	return nil
}

// IsLegacyRedirect reports whether f is the filter attachLegacyRedirect
// puts on a parent's ingress.
func IsLegacyRedirect(f netlink.Filter) bool {
	u, ok := f.(*netlink.U32)
	return ok && u.Priority == legacyPrio && len(u.Actions) == 1 && u.Actions[0].Type() == "mirred"
}

// DetachRedirect undoes AttachRedirect (in the caller's netns); detaching
// what is not attached is not an error.
func (s *Shaper) DetachRedirect(parent int) error {
	if err := s.detachTCX(parent, shaperProgRedirectIngress); err != nil {
		return err
	}
	if err := detachLegacy(parent, netlink.HANDLE_MIN_INGRESS); err != nil {
		return err
	}
	if err := s.objs.IfbOf.Delete(uint32(parent)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("forget the IFB of ifindex %d: %w", parent, err)
	}
	return nil
}

func (s *Shaper) attach(ifindex int, prog *ebpf.Program, name string) error {
	return s.attachAt(ifindex, prog, name, ebpf.AttachTCXEgress)
}

// hookParent is the clsact hook that stands in for a TCX attach type.
func hookParent(at ebpf.AttachType) uint32 {
	if at == ebpf.AttachTCXIngress {
		return netlink.HANDLE_MIN_INGRESS
	}
	return netlink.HANDLE_MIN_EGRESS
}

func (s *Shaper) attachAt(ifindex int, prog *ebpf.Program, name string, at ebpf.AttachType) error {
	if ifindex <= 0 {
		return fmt.Errorf("bad ifindex %d", ifindex)
	}
	if forceLegacy {
		return attachLegacy(ifindex, prog, name, hookParent(at))
	}
	path, err := s.pinPath(name, ifindex)
	if err != nil {
		return err
	}
	old, done, err := updatePinned(path, ifindex, prog, at)
	if done || err != nil {
		return err
	}
	if old != nil {
		// Ours, but no longer first. The kernel takes a program once
		// per hook, so the old link goes before the new one is made:
		// frames sent in between take HTB's direct queue.
		err := old.Unpin()
		old.Close()
		if err != nil {
			return fmt.Errorf("unpin %s: %w", path, err)
		}
	}
	// At the head: a program before ours that returns TCX_PASS (Cilium's
	// does) would end the chain, and ours would never run. Ours returns
	// TCX_NEXT, so whatever was there runs after it as before.
	l, err := link.AttachTCX(link.TCXOptions{
		Interface: ifindex,
		Program:   prog,
		Attach:    at,
		Anchor:    link.Head(),
	})
	if errors.Is(err, ebpf.ErrNotSupported) {
		if at == ebpf.AttachTCXIngress && name == shaperProgRedirectIngress {
			return errNoTCX
		}
		return attachLegacy(ifindex, prog, name, hookParent(at))
	}
	if err != nil {
		return fmt.Errorf("attach %s to ifindex %d: %w", name, ifindex, err)
	}
	defer l.Close() // the pin keeps it; without the pin, closing detaches
	if err := l.Pin(path); err != nil {
		return fmt.Errorf("pin %s: %w", path, err)
	}
	if at != ebpf.AttachTCXEgress {
		return detachLegacy(ifindex, hookParent(at))
	}
	// Ours return TCX_NEXT, so two would both run, counting frames twice.
	for _, other := range progNames {
		if other != name {
			if err := s.detachTCX(ifindex, other); err != nil {
				return err
			}
		}
	}
	return detachLegacy(ifindex, netlink.HANDLE_MIN_EGRESS)
}

// updatePinned swaps prog into the link pinned at path if it is still
// attached to ifindex at the head of its hook. A defunct link (its device
// or netns gone, ifindex 0) or one on another device is unpinned, and
// Attach makes a new one; a live one that is not first (a program was put
// ahead of it, or an older carve attached it at the tail) is returned, for
// Attach to replace with a new link at the head.
func updatePinned(path string, ifindex int, prog *ebpf.Program, at ebpf.AttachType) (old link.Link, done bool, err error) {
	l, err := link.LoadPinnedLink(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	info, err := l.Info()
	if err != nil {
		l.Close()
		return nil, false, err
	}
	if tcx := info.TCX(); tcx != nil && tcx.Ifindex == uint32(ifindex) {
		if !atHead(ifindex, info.ID, at) {
			return l, false, nil
		}
		defer l.Close()
		if err := l.Update(prog); err != nil {
			return nil, false, fmt.Errorf("update %s: %w", path, err)
		}
		return nil, true, nil
	}
	defer l.Close()
	return nil, false, l.Unpin()
}

// atHead reports whether link id is the first on ifindex's TCX hook at.
func atHead(ifindex int, id link.ID, at ebpf.AttachType) bool {
	r, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
	if err != nil || len(r.Programs) == 0 {
		return true // cannot tell: keep the link we have
	}
	lid, ok := r.Programs[0].LinkID()
	return ok && lid == id
}

// Detach removes the classifiers Attach put on ifindex (in the caller's
// netns): the pinned TCX links of every program and any legacy cls_bpf
// filter.
// Detaching what is not attached, or a device that is gone, is not an error.
func (s *Shaper) Detach(ifindex int) error {
	for _, name := range progNames {
		if err := s.detachTCX(ifindex, name); err != nil {
			return err
		}
	}
	return detachLegacy(ifindex, netlink.HANDLE_MIN_EGRESS)
}

func (s *Shaper) detachTCX(ifindex int, name string) error {
	path, err := s.pinPath(name, ifindex)
	if err != nil {
		return err
	}
	l, err := link.LoadPinnedLink(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	// Unpinning drops the last reference once our FD closes: detached.
	err = l.Unpin()
	return errors.Join(err, l.Close())
}

// CleanupDefunct unpins the TCX links under pinDir whose device is gone, as
// happens when a pod's netns is deleted: the kernel keeps such a link, with
// ifindex 0 and its program, for as long as it is pinned. It returns the
// names it removed.
func CleanupDefunct(pinDir string) (removed []string, err error) {
	removed, err = cleanupDefunctIn(pinDir, "")
	// A pod guard's link, whose share's interface went with its pod: an
	// older agent that knew no guards unprepared the share (a rollback),
	// or the pins outlived a crash. Its program goes with it.
	guards, gerr := cleanupDefunctIn(filepath.Join(pinDir, podGuardDir), podGuardDir+"/")
	if errors.Is(gerr, os.ErrNotExist) {
		gerr = nil
	}
	for _, g := range guards {
		if name, ok := strings.CutSuffix(strings.TrimPrefix(g, podGuardDir+"/"), "_link"); ok {
			gerr = errors.Join(gerr, UnpinPodGuard(pinDir, name))
		}
	}
	return append(removed, guards...), errors.Join(err, gerr)
}

func cleanupDefunctIn(dir, prefix string) (removed []string, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		l, lerr := link.LoadPinnedLink(path, nil)
		if lerr != nil {
			continue // a map, or not ours
		}
		info, ierr := l.Info()
		if ierr == nil && info.TCX() != nil && info.TCX().Ifindex == 0 {
			if uerr := l.Unpin(); uerr != nil {
				err = errors.Join(err, uerr)
			} else {
				removed = append(removed, prefix+e.Name())
			}
		}
		l.Close()
	}
	return removed, err
}

// attachLegacy adds (or atomically replaces) a direct-action cls_bpf filter
// on the clsact hook (egress or ingress). The filter holds the program, so it too
// outlives this process; a fixed priority and handle make it replaceable.
func attachLegacy(ifindex int, prog *ebpf.Program, name string, hook uint32) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: ifindex,
			Handle:    netlink.MakeHandle(0xffff, 0),
			Parent:    netlink.HANDLE_CLSACT,
		},
		QdiscType: "clsact",
	}
	// Add, not replace: another user's clsact and its filters must stay.
	if err := netlink.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add clsact to ifindex %d: %w", ifindex, err)
	}
	filter := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex,
			Parent:    hook,
			Handle:    legacyHandle,
			Priority:  legacyPrio,
			Protocol:  unix.ETH_P_ALL,
		},
		Fd:           prog.FD(),
		Name:         "carve-" + name,
		DirectAction: true,
	}
	if err := netlink.FilterReplace(filter); err != nil {
		return fmt.Errorf("add cls_bpf %s to ifindex %d: %w", name, ifindex, err)
	}
	return nil
}

// detachLegacy deletes our cls_bpf filter, leaving clsact (others may use
// it; empty, it costs nothing).
func detachLegacy(ifindex int, hook uint32) error {
	dev := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}
	filters, err := netlink.FilterList(dev, hook)
	if err != nil {
		if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil // device gone, or no clsact: nothing of ours there
		}
		return fmt.Errorf("list filters on ifindex %d: %w", ifindex, err)
	}
	for _, f := range filters {
		bf, ok := f.(*netlink.BpfFilter)
		if (!ok || bf.Priority != legacyPrio || !strings.HasPrefix(bf.Name, "carve-")) && !IsLegacyRedirect(f) {
			continue
		}
		if err := netlink.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete carve's filter on ifindex %d: %w", ifindex, err)
		}
	}
	return nil
}

package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// podGuardFilterPath is where, on a kernel without TCX (before 6.6), the
// hook records the index of the interface whose cls_bpf filter holds the
// share's pod guard: there is no link to pin, and the nested-link watch
// (netdev) and `carve shares` know the share's own interface by it. A
// one-entry array map, as bpffs holds only BPF objects.
func podGuardFilterPath(pinDir, name string) string {
	return filepath.Join(pinDir, podGuardDir, name+"_clsbpf")
}

// attachPodGuardLegacy puts prog on ifindex's egress as a cls_bpf filter
// (replacing one there: the hook runs once per container) and records the
// ifindex.
func attachPodGuardLegacy(pinDir, name string, ifindex int, prog *ebpf.Program) error {
	if err := attachLegacy(ifindex, prog, podGuardProg, netlink.HANDLE_MIN_EGRESS); err != nil {
		return err
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "carve_guard_if", Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		return fmt.Errorf("the pod guard record of %s: %w", name, err)
	}
	defer m.Close()
	if err := m.Put(uint32(0), uint32(ifindex)); err != nil {
		return fmt.Errorf("the pod guard record of %s: %w", name, err)
	}
	path := podGuardFilterPath(pinDir, name)
	if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	if err := m.Pin(path); err != nil {
		return fmt.Errorf("pin %s: %w", path, err)
	}
	return nil
}

// legacyPodGuardIfindex reads what attachPodGuardLegacy recorded;
// os.ErrNotExist where it recorded nothing. Unlike a TCX link's, the record
// cannot say that the interface has gone since.
func legacyPodGuardIfindex(pinDir, name string) (int, error) {
	m, err := ebpf.LoadPinnedMap(podGuardFilterPath(pinDir, name), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, err
		}
		return 0, fmt.Errorf("the pod guard record of %s: %w", name, err)
	}
	defer m.Close()
	var ifindex uint32
	if err := m.Lookup(uint32(0), &ifindex); err != nil {
		return 0, fmt.Errorf("the pod guard record of %s: %w", name, err)
	}
	return int(ifindex), nil
}

// FilterGuardNames lists the shares whose pod guard the hook attached as a
// cls_bpf filter (podGuardFilterPath): unlike a TCX link's, such a record
// cannot say when its interface is gone, so the agent judges it by its
// share (netdev).
func FilterGuardNames(pinDir string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(pinDir, podGuardDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), "_clsbpf"); ok {
			names = append(names, name)
		}
	}
	return names, nil
}

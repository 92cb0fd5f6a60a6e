package bpf

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -I/usr/include/x86_64-linux-gnu" -target bpfel -type share_key -type share_val -type share_counters -type share_rate -type netns_key -type netns_val -type learned_key -type learned_on_parent_key -type drop_key -type addr_key -type addr_owner -type egress_shaper -type shaper_return -type share_queue -type flow_key -type flow_val -type bulk_children -type flow_slot -type share_flowset -type aqm_key -type aqm_val -type aqm_counters shaper shaper.c

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// DefaultBPFFS is where bpffs is conventionally mounted.
const DefaultBPFFS = "/sys/fs/bpf"

// Direction says which MAC of a frame names its share.
type Direction uint8

const (
	// Egress is traffic sent by a share, matched by source MAC.
	Egress Direction = 0
	// Ingress is traffic towards a share, matched by destination MAC.
	Ingress Direction = 1
)

func (d Direction) String() string {
	switch d {
	case Egress:
		return "egress"
	case Ingress:
		return "ingress"
	}
	return fmt.Sprintf("Direction(%d)", uint8(d))
}

// Key names one share in one direction. MAC is in net.HardwareAddr.String
// form (lower case, colon separated).
type Key struct {
	MAC string
	Dir Direction
}

// Counters are what the classifier has matched for a share. Bytes counts
// whole frames (skb->len), GSO super-packets included, so it is comparable
// with the HTB rate, not with TCP goodput.
type Counters struct {
	Bytes, Packets uint64
}

// Shaper is the loaded classifier with its pinned maps.
type Shaper struct {
	objs   shaperObjects
	pinDir string
	// spec is what OpenShaper loaded, its maps pinned by name.
	spec *ebpf.CollectionSpec
	// guardSpec is spec with the pod guard's program alone: one is
	// loaded from a copy of it at each prepare, without parsing the
	// object or copying every program again.
	guardSpec *ebpf.CollectionSpec
	// pool holds guards loaded ahead (guardpool.go); nil where the
	// caller never asked for one.
	poolMu sync.Mutex
	pool   *guardPool
}

// MountBPFFS mounts bpffs at dir (DefaultBPFFS when empty) unless dir is
// already a bpffs. Every bpffs mount is a separate instance, so mounting only
// when needed keeps the pins of earlier runs visible.
func MountBPFFS(dir string) error {
	if dir == "" {
		dir = DefaultBPFFS
	}
	if ok, err := isBPFFS(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	} else if ok {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", dir, err)
	}
	return nil
}

func isBPFFS(dir string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, &os.PathError{Op: "statfs", Path: dir, Err: err}
	}
	return uint32(st.Type) == unix.BPF_FS_MAGIC, nil
}

// OpenShaper loads the programs and opens the maps pinned by name under
// pinDir, creating and pinning them the first time. pinDir must lie on
// bpffs (see MountBPFFS); it is created if missing. Reopening after a
// restart yields the same maps with their entries. A map whose pinned
// layout differs from this build's fails with ebpf.ErrMapIncompatible.
func OpenShaper(pinDir string) (*Shaper, error) {
	if err := os.MkdirAll(pinDir, 0o700); err != nil {
		return nil, err
	}
	if ok, err := isBPFFS(pinDir); err != nil {
		return nil, err
	} else if !ok {
		return nil, fmt.Errorf("%s is not on bpffs: pins would not persist", pinDir)
	}
	spec, err := loadShaper()
	if err != nil {
		return nil, err
	}
	for name, m := range spec.Maps {
		if strings.HasPrefix(name, ".") {
			continue // .rodata: constants of the program, no state
		}
		m.Pinning = ebpf.PinByName // shaper.c says so too; state must persist
	}
	if _, err := setNetnsCookieSource(spec); err != nil {
		return nil, err
	}
	s := &Shaper{pinDir: pinDir, spec: spec.Copy(), guardSpec: spec.Copy()}
	for name := range s.guardSpec.Programs {
		if name != shaperProgPodGuard {
			delete(s.guardSpec.Programs, name)
		}
	}
	// Of the maps, only those the guard names: copying the others at
	// every prepare cost a tenth of a millisecond for nothing.
	guardMaps := map[string]bool{}
	for _, ins := range s.guardSpec.Programs[shaperProgPodGuard].Instructions {
		if ref := ins.Reference(); ref != "" {
			guardMaps[ref] = true
		}
	}
	for name := range s.guardSpec.Maps {
		if !guardMaps[name] {
			delete(s.guardSpec.Maps, name)
		}
	}
	for name, v := range s.guardSpec.Variables {
		if !guardMaps[v.SectionName] {
			delete(s.guardSpec.Variables, name)
		}
	}
	// Nor the object's whole BTF: the program carries what its load
	// needs, and the copy was a third of the rest.
	s.guardSpec.Types = nil
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pinDir}}
	if err := spec.LoadAndAssign(&s.objs, opts); err != nil {
		return nil, fmt.Errorf("load shaper: %w", err)
	}
	// Every pod guard, those pinned by an earlier agent included, runs
	// this classifier's policy from now on.
	if err := s.objs.PodGuardPolicy.Put(uint32(0), s.objs.PodGuardCheck); err != nil {
		return nil, errors.Join(fmt.Errorf("put the pod guards' policy: %w", err), s.objs.Close())
	}
	if err := s.pinDequeued(); err != nil {
		return nil, errors.Join(err, s.objs.Close())
	}
	if _, err := s.copyOlderChildren(); err != nil {
		return nil, errors.Join(err, s.objs.Close())
	}
	// Maps an older classifier pinned that this one no longer has.
	for _, name := range retiredMaps {
		if err := unix.Unlink(filepath.Join(pinDir, name)); err != nil && !errors.Is(err, unix.ENOENT) {
			return nil, errors.Join(fmt.Errorf("remove the retired map %s: %w", name, err), s.objs.Close())
		}
	}
	return s, nil
}

// retiredMaps are maps older classifiers pinned that none uses now:
// share_flow_stats counted each frame's child (sparse or bulk) until issue
// 37, a lookup on every frame of a flow-isolated share; the children's HTB
// classes count the same.
var retiredMaps = []string{"share_flow_stats"}

// Close releases this process's handles. Pinned maps and attached links stay.
// The guards of the pool not taken are released.
func (s *Shaper) Close() error {
	s.closePool()
	return s.objs.Close()
}

func makeKey(dir Direction, mac net.HardwareAddr) (shaperShareKey, error) {
	var k shaperShareKey
	if len(mac) != 6 {
		return k, fmt.Errorf("MAC %q is not 6 bytes", mac)
	}
	if dir != Egress && dir != Ingress {
		return k, fmt.Errorf("bad direction %d", dir)
	}
	copy(k.Mac[:], mac)
	k.Dir = uint8(dir)
	return k, nil
}

func (k shaperShareKey) key() Key {
	return Key{MAC: net.HardwareAddr(k.Mac[:]).String(), Dir: Direction(k.Dir)}
}

// SetShare sends frames of mac in dir to HTB class classid (major<<16|minor,
// e.g. netlink.MakeHandle(1, 0x10)). It takes effect on the next packet.
func (s *Shaper) SetShare(dir Direction, mac net.HardwareAddr, classid uint32) error {
	return s.putShare(dir, mac, classid, 0)
}

// putShare writes a share's entry: its class, and flags such as
// shareByAddr. A guard the entry carries (GuardShare) stays.
func (s *Shaper) putShare(dir Direction, mac net.HardwareAddr, classid uint32, flags uint32) error {
	k, err := makeKey(dir, mac)
	if err != nil {
		return err
	}
	if classid == 0 {
		return errors.New("classid 0 names no class")
	}
	var old shaperShareVal
	if err := s.objs.Shares.Lookup(&k, &old); err == nil {
		flags |= old.Flags & shareGuardMask
	}
	return s.objs.Shares.Put(&k, &shaperShareVal{Classid: classid, Flags: flags})
}

// SHARE_GUARDED and SHARE_GUARD_SHIFT in shaper.c.
const (
	shareGuarded   = 2
	shareGuardMask = shareGuarded | 0xffff<<16
)

// GuardShare gives the egress entry of the share named by mac the checks
// its pod's frames get (g's VLAN, AllowMACChange, CheckIPv4/6; the rest of
// g is not used), for the frames the pod sends with no socket of its own
// namespace: the kernel's ARP replies for an address the pod added, frames
// the pod forwards. Those are found by source MAC (or a MAC learned for the
// share). A share with no egress class gets an entry that is a guard only.
// DeleteShare(Egress, mac) removes it with the rest.
func (s *Shaper) GuardShare(mac net.HardwareAddr, g PodShare) error {
	k, err := makeKey(Egress, mac)
	if err != nil {
		return err
	}
	vf, err := g.vlanFlags()
	if err != nil {
		return err
	}
	guard := shareGuarded | uint32(vf)<<16
	var v shaperShareVal
	if err := s.objs.Shares.Lookup(&k, &v); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("the egress entry of share %s: %w", mac, err)
	}
	v.Flags = v.Flags&^shareGuardMask | guard
	if err := s.objs.Shares.Put(&k, &v); err != nil {
		return fmt.Errorf("guard the egress entry of share %s: %w", mac, err)
	}
	return nil
}

// ShareCapacity is how many share entries (one per share and direction)
// the classifier holds.
func (s *Shaper) ShareCapacity() int { return int(s.objs.Shares.MaxEntries()) }

// ShareSlots is how many shares the classifier can hold on the whole node,
// every parent together: each share takes up to two entries of `shares` and
// of `share_stats` (one per direction) and one of `share_netns` (its pod's
// on its parent). Entries per address (`share_addrs`, `allowed_addrs`) are
// not counted: they depend on how many addresses a claim asks for.
func (s *Shaper) ShareSlots() int {
	return shareSlots(s.objs.Shares.MaxEntries(), s.objs.ShareStats.MaxEntries(), s.objs.ShareNetns.MaxEntries())
}

// CompiledShareSlots is ShareSlots of this build's maps, read from the
// embedded object without loading it (no privilege needed). OpenShaper
// refuses a pinned map of another size (ebpf.ErrMapIncompatible), so a
// loaded classifier holds exactly this many.
func CompiledShareSlots() (int, error) {
	spec, err := loadShaper()
	if err != nil {
		return 0, err
	}
	var size [3]uint32
	for i, name := range []string{"shares", "share_stats", "share_netns"} {
		m, ok := spec.Maps[name]
		if !ok {
			return 0, fmt.Errorf("the classifier has no map %s", name)
		}
		size[i] = m.MaxEntries
	}
	return shareSlots(size[0], size[1], size[2]), nil
}

func shareSlots(shares, stats, netns uint32) int {
	return int(min(shares/2, stats/2, netns))
}

// DeleteShare removes a share and its counters; its traffic is unclassified
// from the next packet on. Deleting an absent share is not an error.
func (s *Shaper) DeleteShare(dir Direction, mac net.HardwareAddr) error {
	k, err := makeKey(dir, mac)
	if err != nil {
		return err
	}
	var v shaperShareVal
	if err := s.objs.Shares.Lookup(&k, &v); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	if err := s.deleteShareQueue(&k, v.Classid); err != nil {
		return err
	}
	// Share first: a packet that found the share just before may still
	// recreate a small stats entry, which the next DeleteShare removes.
	maps := []*ebpf.Map{s.objs.Shares, s.objs.ShareStats, s.objs.ShareQueues, s.objs.ShareAqmStats}
	if dir == Egress {
		maps = append(maps, s.objs.ShareRates)
	}
	for _, m := range maps {
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	if dir == Ingress {
		return s.forgetLearned(mac)
	}
	return nil
}

// SetRate sets the pace, in bits/s, at which edt_egress (see AttachEDT)
// lets frames from mac leave; 0 removes it. Classification for HTB is
// separate (SetShare); a share normally uses one or the other.
func (s *Shaper) SetRate(mac net.HardwareAddr, bitsPerSec uint64) error {
	k, err := makeKey(Egress, mac)
	if err != nil {
		return err
	}
	if bitsPerSec == 0 {
		if err := s.objs.ShareRates.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
		return nil
	}
	if bitsPerSec < 8 {
		return fmt.Errorf("rate %d bit/s is under a byte per second", bitsPerSec)
	}
	// t_last starts at 0: the first frame leaves at once.
	return s.objs.ShareRates.Put(&k, &shaperShareRate{BytesPerSec: bitsPerSec / 8})
}

// Shares returns every shaped share's class handle (an entry that is a
// guard only, GuardShare's for an unshaped share, is none).
func (s *Shaper) Shares() (map[Key]uint32, error) { return readShares(s.objs.Shares) }

// Stats returns each share's counters, summed over CPUs.
func (s *Shaper) Stats() (map[Key]Counters, error) { return readStats(s.objs.ShareStats) }

package bpf

import (
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
)

// Flow isolation inside a share (flows.h): a share whose class has flow
// children (netdev makes them) gets a queue entry with its rate, and the
// classifier then sends its sparse flows to one child, served first, and
// each of its bulk flows to a bulk child of its own while one is free,
// whose queue the AQM (aqm.h) keeps short.

// FlowSparseChild and FlowBulkFirst are flows.h's: the child classes of a
// share's class C are C+FlowSparseChild (sparse flows) and C+FlowBulkFirst
// to C+FlowBulkFirst+FlowBulkChildren-1 (bulk flows).
const (
	FlowSparseChild  = 1
	FlowBulkFirst    = 2
	FlowBulkChildren = 8
	FlowSparseDiv    = 16
)

// aqmRoundFrame is the frame whose time at a share's rate, 2.5 times, is
// each busy bulk child's part of the AQM's target (aqm.h).
const aqmRoundFrame = 1514

// ShareQueue is where a flow-isolated share's classes are: class 1:Minor
// on the device ClassIfindex (the parent's egress shaper, its IFB), with
// the children above.
type ShareQueue struct {
	BitsPerSec   uint64
	ClassIfindex int
	Minor        uint16
}

// SetShareQueue turns on flow isolation for the share named by mac in dir:
// the classifier sorts its flows into its children, and the AQM of each
// bulk child starts afresh.
func (s *Shaper) SetShareQueue(dir Direction, mac net.HardwareAddr, q ShareQueue) error {
	k, err := makeKey(dir, mac)
	if err != nil {
		return err
	}
	if q.BitsPerSec < 8 {
		return fmt.Errorf("rate %d bit/s is under a byte per second", q.BitsPerSec)
	}
	if q.ClassIfindex <= 0 || q.ClassIfindex > 0xffffff {
		return fmt.Errorf("share %s: class device ifindex %d out of range", mac, q.ClassIfindex)
	}
	bps := q.BitsPerSec / 8
	round := uint64(aqmRoundFrame) * 1e9 * 5 / 2 / bps
	keys := make([]shaperAqmKey, FlowBulkChildren)
	vals := make([]shaperAqmVal, FlowBulkChildren)
	for i := range keys {
		keys[i] = shaperAqmKey{Ifindex: uint32(q.ClassIfindex), Minor: q.Minor + FlowBulkFirst + uint16(i)}
		vals[i] = shaperAqmVal{Share: k, RoundNs: round}
	}
	if err := putAll(s.objs.AqmState, keys, vals); err != nil {
		return fmt.Errorf("the AQM entries of share %s's classes 1:%x on: %w", mac, keys[0].Minor, err)
	}
	children := shaperBulkChildren{BytesPerSec: bps, ClassIfindex: uint32(q.ClassIfindex)}
	if err := s.objs.ShareFlowsets.Put(&k, &shaperShareFlowset{C: children}); err != nil {
		return fmt.Errorf("the children entry of share %s: %w", mac, err)
	}
	// For an older agent after a rollback: its programs read only this.
	if err := s.objs.ShareChildren.Put(&k, &children); err != nil {
		return fmt.Errorf("the children entry of share %s: %w", mac, err)
	}
	if err := s.objs.ShareQueues.Put(&k, &shaperShareQueue{BytesPerSec: bps}); err != nil {
		return fmt.Errorf("the queue entry of share %s: %w", mac, err)
	}
	return nil
}

// deleteShareQueue removes the children and AQM entries of the share k,
// whose class is classid.
func (s *Shaper) deleteShareQueue(k *shaperShareKey, classid uint32) error {
	var set shaperShareFlowset
	c := &set.C
	err := s.objs.ShareFlowsets.Lookup(k, &set)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		// An older agent's share not copied yet (OpenShaper copies
		// them), or no flow isolation.
		err = s.objs.ShareChildren.Lookup(k, c)
	}
	if err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		return err
	}
	if classid != 0 {
		var owned []shaperAqmKey
		for i := range FlowBulkChildren {
			ak := shaperAqmKey{Ifindex: c.ClassIfindex, Minor: uint16(classid) + FlowBulkFirst + uint16(i)}
			var v shaperAqmVal
			// Only the share's own: the minor may be another's by now.
			if s.objs.AqmState.Lookup(&ak, &v) == nil && v.Share == *k {
				owned = append(owned, ak)
			}
		}
		if err := deleteAll(s.objs.AqmState, owned); err != nil {
			return err
		}
	}
	for _, m := range []*ebpf.Map{s.objs.ShareFlowsets, s.objs.ShareChildren} {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

// copyOlderChildren gives each share an older agent made with flow
// isolation (a share_children entry and no share_flowsets one) its
// share_flowsets entry, which this build's programs read: without it, its
// frames would all go to its first bulk child, unstamped. Its flows start
// afresh, as after any restart of their share's state.
func (s *Shaper) copyOlderChildren() (int, error) {
	var (
		k       shaperShareKey
		c       shaperBulkChildren
		missing []shaperShareKey
		sets    []shaperShareFlowset
	)
	it := s.objs.ShareChildren.Iterate()
	for it.Next(&k, &c) {
		var set shaperShareFlowset
		if err := s.objs.ShareFlowsets.Lookup(&k, &set); errors.Is(err, ebpf.ErrKeyNotExist) {
			missing = append(missing, k)
			sets = append(sets, shaperShareFlowset{C: shaperBulkChildren{BytesPerSec: c.BytesPerSec, ClassIfindex: c.ClassIfindex}})
		} else if err != nil {
			return 0, fmt.Errorf("the flow set of share %s: %w", net.HardwareAddr(k.Mac[:]), err)
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("read share_children: %w", err)
	}
	for i := range missing {
		// No overwrite: a prepare since the read has written its own.
		if err := s.objs.ShareFlowsets.Update(&missing[i], &sets[i], ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return i, fmt.Errorf("copy the children entry of share %s: %w", net.HardwareAddr(missing[i].Mac[:]), err)
		}
	}
	// This build writes and deletes both entries of a share together:
	// a flow set alone is of a share an older agent (after a rollback)
	// removed since.
	var stale []shaperShareKey
	var set shaperShareFlowset
	it = s.objs.ShareFlowsets.Iterate()
	for it.Next(&k, &set) {
		if err := s.objs.ShareChildren.Lookup(&k, &c); errors.Is(err, ebpf.ErrKeyNotExist) {
			stale = append(stale, k)
		} else if err != nil {
			return len(missing), fmt.Errorf("the children entry of share %s: %w", net.HardwareAddr(k.Mac[:]), err)
		}
	}
	if err := it.Err(); err != nil {
		return len(missing), fmt.Errorf("read share_flowsets: %w", err)
	}
	return len(missing), deleteAll(s.objs.ShareFlowsets, stale)
}

// putAll writes the entries in one system call where the kernel has batch
// operations for the map's type (hash maps since 5.6), else one by one: a
// share's eight AQM entries in each direction were sixteen calls a prepare.
func putAll[K, V any](m *ebpf.Map, keys []K, vals []V) error {
	if _, err := m.BatchUpdate(keys, vals, nil); !errors.Is(err, ebpf.ErrNotSupported) {
		return err
	}
	for i := range keys {
		if err := m.Put(&keys[i], &vals[i]); err != nil {
			return err
		}
	}
	return nil
}

// deleteAll deletes the entries, which exist, as putAll writes them; one
// found missing already (a concurrent delete) is no error.
func deleteAll[K any](m *ebpf.Map, keys []K) error {
	if len(keys) == 0 {
		return nil
	}
	_, err := m.BatchDelete(keys, nil)
	if err == nil {
		return nil
	}
	// A batch stops at a key that is gone; the rest are deleted one by
	// one, as where the kernel has no batches.
	if !errors.Is(err, ebpf.ErrNotSupported) && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	for i := range keys {
		if err := m.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

// AQMCounters are what a share's AQM did: frames dropped, and frames
// marked CE instead.
type AQMCounters struct{ Drops, Marks uint64 }

// AQM returns each share's AQM counters, summed over CPUs.
func (s *Shaper) AQM() (map[Key]AQMCounters, error) { return aqmCounters(s.objs.ShareAqmStats) }

func aqmCounters(m *ebpf.Map) (map[Key]AQMCounters, error) {
	out := map[Key]AQMCounters{}
	var k shaperShareKey
	var per []shaperAqmCounters
	it := m.Iterate()
	for it.Next(&k, &per) {
		var c AQMCounters
		for _, p := range per {
			c.Drops += p.Drops
			c.Marks += p.Marks
		}
		out[k.key()] = c
	}
	return out, it.Err()
}

// FlowIsolated reports which shares have a queue entry.
func (s *Shaper) FlowIsolated() (map[Key]bool, error) {
	out := map[Key]bool{}
	var k shaperShareKey
	var v shaperShareQueue
	it := s.objs.ShareQueues.Iterate()
	for it.Next(&k, &v) {
		out[k.key()] = true
	}
	return out, it.Err()
}

package bpf

import (
	"fmt"
	"net"
)

// Flow isolation inside a share (flows.h): a share whose class has flow
// children (netdev makes them) gets a queue entry with its rate, and the
// classifier then sends its sparse flows to one child, served first, and
// its bulk flows to another.

// FlowSparseChild and FlowBulkFirst are flows.h's: the child classes of a
// share's class C are C+FlowSparseChild (sparse flows) and C+FlowBulkFirst
// to C+FlowBulkFirst+FlowBulkChildren-1 (bulk flows).
const (
	FlowSparseChild  = 1
	FlowBulkFirst    = 2
	FlowBulkChildren = 1
)

// SetShareQueue turns on flow isolation for the share named by mac in dir,
// at rate bits/s (its class's): its class must have the children above.
func (s *Shaper) SetShareQueue(dir Direction, mac net.HardwareAddr, bitsPerSec uint64) error {
	k, err := makeKey(dir, mac)
	if err != nil {
		return err
	}
	if bitsPerSec < 8 {
		return fmt.Errorf("rate %d bit/s is under a byte per second", bitsPerSec)
	}
	if err := s.objs.ShareQueues.Put(&k, &shaperShareQueue{BytesPerSec: bitsPerSec / 8}); err != nil {
		return fmt.Errorf("the queue entry of share %s: %w", mac, err)
	}
	return nil
}

// FlowCounters are how many frames of a share went through its sparse and
// its bulk child.
type FlowCounters struct{ Sparse, Bulk uint64 }

// Flows returns each flow-isolated share's counters, summed over CPUs.
func (s *Shaper) Flows() (map[Key]FlowCounters, error) {
	out := map[Key]FlowCounters{}
	var k shaperShareKey
	var per []shaperFlowCounters
	it := s.objs.ShareFlowStats.Iterate()
	for it.Next(&k, &per) {
		var c FlowCounters
		for _, p := range per {
			c.Sparse += p.Sparse
			c.Bulk += p.Bulk
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

package llc

import (
	"fmt"
	"math/bits"
	"sort"
	"strings"

	"github.com/carve-dra/carve/discovery/cbm"
	"github.com/carve-dra/carve/prepare/llc/resctrl"
)

// share is one LLC share's place in resctrl: the group (its CLOSID), the
// cache domain and the ways it holds there. It is also the undo record the
// driver checkpoints, which is how the allocator survives restarts.
type share struct {
	Group  string `json:"group"`
	Domain int    `json:"domain"`
	Mask   uint64 `json:"mask"`
	// MB is the memory bandwidth schema value, 0 where none was set.
	MB int `json:"mb,omitempty"`
}

// allocator hands out contiguous, non-overlapping masks per domain. It
// holds no geometry: resctrl's info/L3 is read when a mask is placed.
type allocator struct {
	shares map[string]share // by share key
}

func newAllocator() *allocator { return &allocator{shares: map[string]share{}} }

// used is the ways held by shares in a domain.
func (a *allocator) used(domain int) uint64 {
	var m uint64
	for _, s := range a.shares {
		if s.Domain == domain {
			m |= s.Mask
		}
	}
	return m
}

// defaultMask is the ways the default group keeps in a domain: the longest
// run no share holds (the kernel takes only contiguous masks).
func (a *allocator) defaultMask(in resctrl.L3Info, domain int) uint64 {
	lo, n := cbm.LargestRun(in.CBMMask &^ a.used(domain))
	return cbm.Run(lo, n)
}

// place finds ways contiguous ways for a share in a domain: outside the
// shareable bits (which I/O may evict), overlapping no other share, and
// leaving the default group a run of at least min_cbm_bits. Of the places
// that do, it takes the one that leaves the default group the most, then
// the highest, so that shares pack from the top and the default group
// keeps the bottom.
func (a *allocator) place(in resctrl.L3Info, domain, ways int) (uint64, error) {
	if ways < in.MinCBMBits {
		return 0, fmt.Errorf("a share of %d way(s) is below resctrl's min_cbm_bits %d", ways, in.MinCBMBits)
	}
	used := a.used(domain)
	free := in.CBMMask &^ in.ShareableBits &^ used
	best, bestDefault := uint64(0), -1
	for lo := 63; lo >= 0; lo-- {
		m := cbm.Run(lo, ways)
		if lo+ways > 64 || m&free != m {
			continue
		}
		if _, n := cbm.LargestRun(in.CBMMask &^ (used | m)); n >= in.MinCBMBits && n > bestDefault {
			best, bestDefault = m, n
		}
	}
	if best == 0 {
		return 0, fmt.Errorf("no run of %d free way(s) in cache domain %d that leaves the default group %d: cbm_mask %x, shareable_bits %x, held by shares %x (%s)",
			ways, domain, in.MinCBMBits, in.CBMMask, in.ShareableBits, used, a.describe(domain))
	}
	return best, nil
}

func (a *allocator) describe(domain int) string {
	var parts []string
	for _, s := range a.shares {
		if s.Domain == domain {
			parts = append(parts, fmt.Sprintf("%s=%x", s.Group, s.Mask))
		}
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "no shares"
	}
	return strings.Join(parts, ", ")
}

// add records a share, refusing one that overlaps another in its domain
// (a checkpoint and a kernel that disagree).
func (a *allocator) add(key string, s share) error {
	for k, o := range a.shares {
		if k != key && o.Domain == s.Domain && o.Mask&s.Mask != 0 {
			return fmt.Errorf("share %s (mask %x) overlaps %s (mask %x) in cache domain %d", s.Group, s.Mask, o.Group, o.Mask, s.Domain)
		}
	}
	a.shares[key] = s
	return nil
}

// groups is every share's group with its domain, in name order.
func (a *allocator) groups() []share {
	out := make([]share, 0, len(a.shares))
	for _, s := range a.shares {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out
}

func ways(mask uint64) int { return bits.OnesCount64(mask) }

package netdev

import "github.com/carve-dra/carve/bpf"

// KeyByAddress makes p tell every bandwidth share apart by address, as it
// does ipvlan's: where the kernel has no ipvlan, macvlan children (which
// have addresses too) carry the address-keyed path in tests.
func KeyByAddress(p *NICPreparer) { p.addressKeys = true }

// PlainQueues gives the shares p prepares from now on the design before
// flow isolation: one bounded FIFO under the share's class, no flow
// children (issue 37's reference).
func PlainQueues(p *NICPreparer) {
	p.mu.Lock()
	p.plainQueues = true
	p.mu.Unlock()
}

// HeldShares is how many shares p counts on parent.
func HeldShares(p *NICPreparer, parent string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held[parent])
}

// ClassDrops is each share's drops at its HTB leaves (bfifo, or fq_codel
// where the kernel has it), as carve_share_drops_total reports them.
func ClassDrops(p *NICPreparer) map[bpf.Key]uint64 { return p.classDrops() }

// FillParked records n blocks as parked on device that the kernel does not
// have (free blocks from the top of the range down: a share's block, which
// may be anywhere, is passed over), as though this agent had parked them and
// the device had been made again since. It returns their bases.
func FillParked(p *NICPreparer, device string, n int) map[uint16]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	set := p.minorSet(device)
	out := map[uint16]bool{}
	for base := maxMinor - classBlock; len(out) < n && base >= minMinor; base -= classBlock {
		if !blockFree(base, set, nil) {
			continue
		}
		for m := base; m < base+classBlock; m++ {
			set[m] = parkedOwner
		}
		p.parked[device] = append(p.parked[device], parkedBlock{base: base, flows: true})
		out[base] = true
	}
	return out
}

// EnsureHTB is ensureHTB.
var EnsureHTB = ensureHTB

// FlowChildren is how many children a share's class gets where the kernel
// has no fq_codel.
const FlowChildren = flowChildren

package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Pinned reads the classifier's pinned maps without loading its programs or
// creating anything: for tools beside the agent (carve shares) that must
// leave the node as they found it. The maps are opened read-only.
type Pinned struct {
	pinDir               string
	shares, stats, rates *ebpf.Map
	// addrs is nil where the agent that pinned the maps predates
	// address-keyed shares.
	addrs *ebpf.Map
	// egressShapers is nil where an agent from before egress shapers
	// pinned the others.
	egressShapers *ebpf.Map
	// spoofDrops is nil where the agent predates anti-spoofing.
	spoofDrops *ebpf.Map
	// aqmStats is nil where the agent predates the bulk children's AQM.
	aqmStats *ebpf.Map
}

// OpenPinned opens the maps pinned under pinDir; an error wrapping
// os.ErrNotExist means the agent never pinned them there.
func OpenPinned(pinDir string) (*Pinned, error) {
	p := &Pinned{pinDir: pinDir}
	for _, m := range []struct {
		name string
		dst  **ebpf.Map
	}{{"shares", &p.shares}, {"share_stats", &p.stats}, {"share_rates", &p.rates}} {
		path := filepath.Join(pinDir, m.name)
		mp, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("open pinned map %s: %w", path, err)
		}
		*m.dst = mp
	}
	// Maps of later carves: absent where an older agent pinned the others.
	for _, m := range []struct {
		name string
		dst  **ebpf.Map
	}{{shaperMapShareAddrs, &p.addrs}, {shaperMapEgressShapers, &p.egressShapers}, {shaperMapSpoofDrops, &p.spoofDrops}, {shaperMapShareAqmStats, &p.aqmStats}} {
		path := filepath.Join(pinDir, m.name)
		mp, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			p.Close()
			return nil, fmt.Errorf("open pinned map %s: %w", path, err)
		}
		*m.dst = mp
	}
	return p, nil
}

// Close releases the maps; the pins stay.
func (p *Pinned) Close() error {
	var err error
	for _, m := range []*ebpf.Map{p.shares, p.stats, p.rates, p.addrs, p.egressShapers, p.spoofDrops, p.aqmStats} {
		if m != nil {
			err = errors.Join(err, m.Close())
		}
	}
	return err
}

// Shares returns every share's class handle, as Shaper.Shares.
func (p *Pinned) Shares() (map[Key]uint32, error) { return readShares(p.shares) }

// SpoofDrops returns the frames dropped for spoofing, by share MAC and
// reason, as Shaper.SpoofDrops; none where the maps predate them.
func (p *Pinned) SpoofDrops() (map[string]SpoofDrops, error) {
	if p.spoofDrops == nil {
		return map[string]SpoofDrops{}, nil
	}
	return readSpoofDrops(p.spoofDrops)
}

// Stats returns each share's counters summed over CPUs, as Shaper.Stats.
func (p *Pinned) Stats() (map[Key]Counters, error) { return readStats(p.stats) }

// AQM returns each share's AQM counters (none where the agent predates
// the AQM).
func (p *Pinned) AQM() (map[Key]AQMCounters, error) {
	if p.aqmStats == nil {
		return map[Key]AQMCounters{}, nil
	}
	return aqmCounters(p.aqmStats)
}

// ShareAddrs returns the addresses of shares told apart by address, as
// Shaper.ShareAddrs; none where the maps predate them.
func (p *Pinned) ShareAddrs() ([]AddrShare, error) {
	if p.addrs == nil {
		return nil, nil
	}
	return readAddrs(p.addrs)
}

// EgressShapers returns each parent's egress shaper, as
// Shaper.EgressShapers; none where the agent pinned no such map.
func (p *Pinned) EgressShapers() (map[int]EgressShaperLinks, error) {
	return readEgressShapers(p.egressShapers)
}

// Rates returns the EDT pace of each share's egress in bits/s, by MAC.
func (p *Pinned) Rates() (map[string]uint64, error) {
	out := make(map[string]uint64)
	var k shaperShareKey
	var v shaperShareRate
	it := p.rates.Iterate()
	for it.Next(&k, &v) {
		out[k.key().MAC] = v.BytesPerSec * 8
	}
	return out, it.Err()
}

func readShares(m *ebpf.Map) (map[Key]uint32, error) {
	out := make(map[Key]uint32)
	var k shaperShareKey
	var v shaperShareVal
	it := m.Iterate()
	for it.Next(&k, &v) {
		if v.Classid != 0 {
			out[k.key()] = v.Classid
		}
	}
	return out, it.Err()
}

func readStats(m *ebpf.Map) (map[Key]Counters, error) {
	out := make(map[Key]Counters)
	var k shaperShareKey
	var per []shaperShareCounters
	it := m.Iterate()
	for it.Next(&k, &per) {
		var c Counters
		for _, p := range per {
			c.Bytes += p.Bytes
			c.Packets += p.Packets
		}
		out[k.key()] = c
	}
	return out, it.Err()
}

// PinnedLink is a classifier program's TCX link pinned under the pin
// directory.
type PinnedLink struct {
	// Program is the program's name: classify_egress, classify_ingress,
	// edt_egress, redirect_ingress or return_shaped.
	Program string
	// NetnsIno is the inode of the network namespace it was attached in.
	NetnsIno uint64
	// Ifindex is the device it is attached to in that namespace; 0 where
	// the device is gone (a defunct link, see CleanupDefunct).
	Ifindex int
	// Ingress is true for the ingress hook.
	Ingress bool
}

// PinnedLinks lists the TCX links pinned under pinDir (named
// <program>-<netns inode>-<ifindex> by Attach), as the kernel reports them.
// Legacy cls_bpf attachments are filters, not pinned links, and are not
// listed.
func (p *Pinned) PinnedLinks() ([]PinnedLink, error) {
	entries, err := os.ReadDir(p.pinDir)
	if err != nil {
		return nil, err
	}
	var out []PinnedLink
	for _, e := range entries {
		parts := strings.Split(e.Name(), "-")
		if e.IsDir() || len(parts) != 3 {
			continue
		}
		ino, err := strconv.ParseUint(parts[1], 10, 64)
		if err != nil {
			continue
		}
		l, err := link.LoadPinnedLink(filepath.Join(p.pinDir, e.Name()), nil)
		if err != nil {
			continue // a map, or not a link
		}
		info, err := l.Info()
		l.Close()
		if err != nil || info.TCX() == nil {
			continue
		}
		tcx := info.TCX()
		out = append(out, PinnedLink{Program: parts[0], NetnsIno: ino, Ifindex: int(tcx.Ifindex), Ingress: ebpf.AttachType(tcx.AttachType) == ebpf.AttachTCXIngress})
	}
	return out, nil
}

// LegacyFilterName is the name of the cls_bpf filter that stands in for a
// program's TCX link on kernels without TCX.
func LegacyFilterName(program string) string { return "carve-" + program }

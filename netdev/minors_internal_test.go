package netdev

import (
	"fmt"
	"testing"
)

func minorTestPreparer() *NICPreparer {
	return &NICPreparer{minors: map[string]map[uint16]string{}, blocks: map[string]map[string][]uint16{},
		parked: map[string][]parkedBlock{}, scanned: map[string]bool{}}
}

// pick is pickMinor's minor and own.
func (p *NICPreparer) pick(device, key string, taken map[uint16]uint64) (uint16, bool, error) {
	got, err := p.pickMinor(device, key, taken)
	return got.minor, got.own, err
}

// A share's blocks are found and freed through the index, on every device,
// and only its own minors go: the others' stay taken.
func TestMinorBlocksByShare(t *testing.T) {
	p := minorTestPreparer()
	picked := map[string]uint16{}
	for i := range 50 {
		key := fmt.Sprintf("claim-%d/net/share", i)
		m, own, err := p.pick("cveg7", key, nil)
		if err != nil || own {
			t.Fatalf("pick for %s: %d, own %v, %v", key, m, own, err)
		}
		if again, own, err := p.pick("cveg7", key, nil); err != nil || !own || again != m {
			t.Fatalf("second pick for %s: %d, own %v, %v; want its own %d", key, again, own, err, m)
		}
		picked[key] = m
	}
	// One share's ingress block on the IFB, one older share with a single
	// class restored there.
	p.mu.Lock()
	p.reserveBlock("cvifb7", "claim-0/net/share", 0x40, true)
	p.reserveBlock("cvifb7", "old/net/share", 0x200, false)
	p.mu.Unlock()

	p.freeMinors("claim-0/net/share")
	for m, k := range p.minors["cveg7"] {
		if k == "claim-0/net/share" {
			t.Fatalf("minor %#x is still the freed share's", m)
		}
	}
	if got := len(p.minors["cveg7"]); got != 49*classBlock {
		t.Errorf("%d minors taken on cveg7 after one of 50 shares went, want %d", got, 49*classBlock)
	}
	if got := p.minors["cvifb7"]; len(got) != 1 || got[0x200] != "old/net/share" {
		t.Errorf("cvifb7's minors %v, want only the older share's 0x200", got)
	}
	// The freed block is free again; the others are not.
	if m, own, err := p.pick("cveg7", "claim-0/net/share", nil); err != nil || own || m != picked["claim-0/net/share"] {
		t.Errorf("pick after free: %#x, own %v, %v; want the freed block %#x, not own", m, own, err, picked["claim-0/net/share"])
	}
	if m, own, _ := p.pick("cveg7", "claim-1/net/share", nil); !own || m != picked["claim-1/net/share"] {
		t.Errorf("claim-1's pick after another's free: %#x, own %v", m, own)
	}
}

// A block the kernel says is taken goes back, and the share then holds no
// block on the device.
func TestUnpickMinor(t *testing.T) {
	p := minorTestPreparer()
	m, _, err := p.pick("cveg7", "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	p.unpickMinor("cveg7", m, "k")
	if len(p.minors["cveg7"]) != 0 || len(p.blocks["cveg7"]["k"]) != 0 {
		t.Fatalf("after unpick: minors %v, blocks %v", p.minors["cveg7"], p.blocks["cveg7"])
	}
	taken := map[uint16]uint64{m: 1}
	again, own, err := p.pick("cveg7", "k", taken)
	if err != nil || own || again == m {
		t.Errorf("pick past the taken block: %#x, own %v, %v", again, own, err)
	}
}

// The reaper skips asking the kernel while another share of this agent
// holds classes on the device, queued or not.
func TestOthersHoldClasses(t *testing.T) {
	p := minorTestPreparer()
	for _, k := range []string{"a", "b"} {
		if _, _, err := p.pick("cveg7", k, nil); err != nil {
			t.Fatal(err)
		}
	}
	if !p.othersHoldClasses("cveg7", map[string]bool{"a": true}) {
		t.Error("b holds classes, but the device is said idle but for a")
	}
	if p.othersHoldClasses("cveg7", map[string]bool{"a": true, "b": true}) {
		t.Error("only the batch's shares hold classes, but others are said to")
	}
	if p.othersHoldClasses("cvifb7", nil) {
		t.Error("a device with no classes is said to hold some")
	}
}

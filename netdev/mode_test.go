package netdev_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
)

// Traffic from one share to another of the same parent cannot bypass the
// parent's shaper: in macvlan bridge mode it would go child to child and
// never reach the parent's egress, so shares default to vepa, where it
// leaves through the parent (and returns only through a hairpinning
// switch; the test's veth peer does not hairpin, so nothing arrives).
func TestShareToShareCannotBypassShaping(t *testing.T) {
	b := newBench(t)
	from := b.add("from", "20M", "20M", nil)
	to := b.add("to", "", "", nil)
	res, err := nettest.RunUDP([]nettest.Flow{{From: from.pod, To: to.pod, ToAddr: to.ip + ":5401"}}, 1400, 500*time.Millisecond, 2*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := res[0].Goodput()
	t.Logf("share (20M) to share of the same parent: %.1f Mbit/s arrived", got/1e6)
	if got > 1.1*rate("20M") {
		t.Errorf("%.1f Mbit/s went from a 20M share to another share of its parent, bypassing its limit", got/1e6)
	}
}

// Asking for bridge mode with a bandwidth limit is refused, saying why; a
// share with no limit may have it.
func TestBridgeModeRefusedForLimitedShares(t *testing.T) {
	b := newBench(t)
	a := b.alloc("bridge", "20M", "")
	a.Config, _ = json.Marshal(prepare.EffectiveConfig{Network: &v1alpha1.NetworkConfig{MacvlanMode: "bridge"}})
	if _, err := b.p.Prepare(context.Background(), a, b.dev); err == nil || !strings.Contains(err.Error(), "bridge") {
		t.Errorf("a 20M share in bridge mode: %v, want refused", err)
	}
	b.add("free", "", "", &v1alpha1.NetworkConfig{MacvlanMode: "bridge"})
}

package netdev_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare/health"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
)

// A flood of broadcast frames of an ethertype no one handles, from a peer
// on the wire (the server's namespace), makes the parent's kernel drop
// every one of them; NICHealth, reading the parent's real sysfs counters,
// never calls that a fault. Anyone on the segment can send such frames,
// and a taint from them would let them evict the node's pods.
func TestUnknownEthertypeFloodIsNoFault(t *testing.T) {
	tp := nettest.New(t)
	// The parent's own sysfs: mounted in a mount namespace of this
	// thread's, from inside the node's network namespace, whose devices
	// it then shows. The thread is never given back: it ends with the
	// goroutine.
	root := t.TempDir()
	type result struct {
		after   health.Condition
		dropped uint64
		err     error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		var r result
		defer func() { done <- r }()
		if r.err = unix.Unshare(unix.CLONE_NEWNS); r.err != nil {
			return
		}
		if r.err = unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); r.err != nil {
			return
		}
		if r.err = unix.Setns(int(tp.Node), unix.CLONE_NEWNET); r.err != nil {
			return
		}
		sys := filepath.Join(root, "sys")
		if r.err = os.MkdirAll(sys, 0o755); r.err != nil {
			return
		}
		if r.err = unix.Mount("sysfs", sys, "sysfs", 0, ""); r.err != nil {
			return
		}
		h := &netdev.NICHealth{Root: root, ErrorsPerSecond: 10, ErrorsPerMillion: 10000}
		got := conditions{}
		h.Links(map[string]slices.Entry{"nic-0": {Kind: names.KindNIC, NIC: &discovery.NIC{Name: tp.Parent, Carrier: true, OperState: "up"}}}, got)
		start := time.Now()
		h.CheckCounters(context.Background(), start, got)
		dropsBefore := readStat(root, tp.Parent, "rx_dropped") + readStat(root, tp.Parent, "rx_nohandler")
		frame := make([]byte, 200)
		copy(frame, net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		copy(frame[6:], net.HardwareAddr{0x02, 0xf1, 0x00, 0x00, 0x00, 0x01})
		frame[12], frame[13] = 0x88, 0xb5 // IEEE local experimental: no handler
		if _, r.err = nettest.RawSend(tp.Server, "peer0", frame, time.Second); r.err != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
		h.CheckCounters(context.Background(), time.Now(), got)
		r.after = got["nic-0/errors"]
		r.dropped = readStat(root, tp.Parent, "rx_dropped") + readStat(root, tp.Parent, "rx_nohandler") - dropsBefore
	}()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("the parent dropped %d frames of the flood", r.dropped)
	if r.dropped < 10_000 {
		t.Fatalf("the flood made the parent drop %d frames: too few to tell", r.dropped)
	}
	if r.after.Severity != health.Healthy {
		t.Errorf("after a flood the parent drops: %+v", r.after)
	}
}

func readStat(root, ifName, name string) uint64 {
	b, err := os.ReadFile(filepath.Join(root, "sys/class/net", ifName, "statistics", name))
	if err != nil {
		return 0
	}
	var v uint64
	for _, c := range b {
		if c >= '0' && c <= '9' {
			v = v*10 + uint64(c-'0')
		}
	}
	return v
}

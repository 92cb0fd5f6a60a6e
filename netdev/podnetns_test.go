package netdev_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare/hook"
)

// The hook records the pod's netns for its share, refuses the node's own
// namespace and a second share of the same parent in one pod, and
// unprepare removes the record by the share's MAC alone.
func TestPodNetnsRecord(t *testing.T) {
	b := newBench(t)
	s := b.add("rec", "50M", "", nil)
	pods, err := b.shaper.PodShares()
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 1 || pods[0].MAC != s.mac || pods[0].ClassID == 0 {
		t.Fatalf("pod shares %+v, want one for %s with its class", pods, s.mac)
	}

	other := b.alloc("other", "10M", "")
	if _, err := b.p.Prepare(context.Background(), other, b.dev); err != nil {
		t.Fatal(err)
	}
	spec, err := hook.ReadAttachSpec(filepath.Join(b.state, "netdev", netdev.LinkName(other.ShareKey())+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := hook.RecordPodNetns(b.tp.Node, b.tp.Node, spec); err == nil || !strings.Contains(err.Error(), "node's network namespace") {
		t.Errorf("the node's own netns: %v, want refused", err)
	}
	if err := hook.RecordPodNetns(b.tp.Node, s.pod, spec); !errors.Is(err, bpf.ErrNetnsTaken) {
		t.Errorf("a second share of the parent in one pod: %v, want ErrNetnsTaken", err)
	}

	if err := b.p.Unprepare(context.Background(), s.alloc, nil); err != nil {
		t.Fatal(err)
	}
	if pods, _ := b.shaper.PodShares(); len(pods) != 0 {
		t.Errorf("pod shares left after unprepare: %+v", pods)
	}
}

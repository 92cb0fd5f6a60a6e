package estimate

import (
	"testing"

	"k8s.io/dynamic-resource-allocation/structured"
)

// The journal sums a device's changes after a mark, other devices' and
// capacities' left out, and says when the mark is older than it reaches.
func TestJournal(t *testing.T) {
	var j journal
	a := structured.MakeDeviceID("carve.dev", "n1", "a")
	b := structured.MakeDeviceID("carve.dev", "n1", "b")
	j.add(a, "memory", 5)
	at := j.seq
	j.add(a, "memory", 7)
	j.add(b, "memory", 100)
	j.add(a, "egress", 100)
	j.add(a, "memory", -2)
	if d, ok := j.since(at, a, "memory"); !ok || d != 5 {
		t.Errorf("since the mark: %d %v, want 5", d, ok)
	}
	if d, ok := j.since(j.seq, a, "memory"); !ok || d != 0 {
		t.Errorf("since now: %d %v, want 0", d, ok)
	}
	for range journalSize {
		j.add(b, "memory", 1)
	}
	if _, ok := j.since(at, a, "memory"); ok {
		t.Error("a mark older than the journal reads as complete")
	}
	if _, ok := j.since(j.seq+1, a, "memory"); ok {
		t.Error("a mark from the future reads as complete")
	}
}

package estimate

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
)

// journalSize is how many of the ledger's last changes are kept: far more
// than happen between one pod's PreFilter and its Reserve.
const journalSize = 4096

// change is one step of a device's total: delta of capacity name, or of the
// count of whole-device allocations where name is empty.
type change struct {
	seq   uint64
	id    structured.DeviceID
	name  resourceapi.QualifiedName
	delta int64
}

// journal keeps the ledger's last changes, so that a pod's scores can read
// the totals as they were when DynamicResources took its snapshot in
// PreFilter: its allocator sees that snapshot on every node, while the
// ledger goes on changing with the informer until the pod is scored.
type journal struct {
	seq  uint64 // changes so far; a mark is a value of it
	ring []change
}

func (j *journal) add(id structured.DeviceID, name resourceapi.QualifiedName, delta int64) {
	if j.ring == nil {
		j.ring = make([]change, journalSize)
	}
	j.seq++
	j.ring[j.seq%journalSize] = change{seq: j.seq, id: id, name: name, delta: delta}
}

// since is the sum of the changes to (id, name) after mark at, and whether
// the journal still holds all of them.
func (j *journal) since(at uint64, id structured.DeviceID, name resourceapi.QualifiedName) (int64, bool) {
	if at > j.seq || j.seq-at >= journalSize {
		return 0, false
	}
	var sum int64
	for s := j.seq; s > at; s-- {
		c := &j.ring[s%journalSize]
		if c.id == id && c.name == name {
			sum += c.delta
		}
	}
	return sum, true
}

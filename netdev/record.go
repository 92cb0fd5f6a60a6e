package netdev

import (
	"encoding/json"
	"fmt"

	"github.com/vishvananda/netlink"
)

// ShareRecord is a NIC share's undo record as the checkpoint keeps it: its
// parent, its interface's name on the node, its MAC, and its HTB class
// minors (on the parent's egress shaper for egress, on the parent's IFB for
// ingress).
// Tools that read the checkpoint beside the agent (carve shares) decode it
// with DecodeShareRecord.
type ShareRecord = undoRecord

// DecodeShareRecord decodes a NIC allocation's undo record.
func DecodeShareRecord(raw json.RawMessage) (ShareRecord, error) {
	var u undoRecord
	if err := json.Unmarshal(raw, &u); err != nil {
		return undoRecord{}, fmt.Errorf("NIC undo record: %w", err)
	}
	return u, nil
}

// IFBName is the name of the IFB that carries the ingress shares of the
// parent with ifindex parentIndex.
func IFBName(parentIndex int) string {
	return ifbName(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: parentIndex}})
}

// ClassHandle is the handle of an HTB share class of minor minor.
func ClassHandle(minor uint16) uint32 { return netlink.MakeHandle(1, minor) }

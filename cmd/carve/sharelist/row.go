package sharelist

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Row is one share on the node. The JSON keys are a contract (carve shares
// -o json); a kind without bandwidth leaves the network fields zero, and a
// GPU share adds its own under "gpu".
type Row struct {
	// Claim is namespace/name.
	Claim    string `json:"claim"`
	ClaimUID string `json:"claimUID"`
	Kind     string `json:"kind"`
	Device   string `json:"device"`
	ShareID  string `json:"shareID"`
	// Parent is the device the share is cut from (a NIC's name).
	Parent string `json:"parent"`
	// Interface is the share's interface in its pod (net1); Link is its
	// name on the node (cv...), which it has until the pod takes it.
	Interface string `json:"interface"`
	Link      string `json:"link,omitempty"`
	// EgressBandwidth and IngressBandwidth are allocated, in bits/s.
	EgressBandwidth  int64 `json:"egressBandwidth"`
	IngressBandwidth int64 `json:"ingressBandwidth"`
	// EgressCeiling and IngressCeiling are what a share that borrows the
	// NIC's idle capacity may reach, in bits/s (its bandwidth is then its
	// floor); 0 for a hard cap. Borrowing lists the directions in which
	// it is measured over its floor now.
	EgressCeiling  int64    `json:"egressCeiling,omitempty"`
	IngressCeiling int64    `json:"ingressCeiling,omitempty"`
	Borrowing      []string `json:"borrowing,omitempty"`
	// EgressRate and IngressRate are measured over the interval from the
	// per-share counters, in bits/s.
	EgressRate  int64 `json:"egressRate"`
	IngressRate int64 `json:"ingressRate"`
	// Drops are the packets the share's classes and its AQM dropped since
	// they were made; Marks those its AQM marked CE instead.
	Drops uint64 `json:"drops"`
	Marks uint64 `json:"marks,omitempty"`
	// EgressQueue and IngressQueue are the share's queue discipline each
	// way: flows+codel (a child per flow under carve's CoDel, bpf/aqm.h,
	// where the kernel has no fq_codel), fq_codel, or the leaf an older
	// carve made (bfifo).
	EgressQueue  string `json:"egressQueue,omitempty"`
	IngressQueue string `json:"ingressQueue,omitempty"`
	// Spoofed are the frames the share's pod sent claiming another's
	// identity, which the classifier dropped, by reason (source-mac,
	// vlan-tag, source-ip, arp-sender, nd-target).
	Spoofed map[string]uint64 `json:"spoofedFramesDropped,omitempty"`
	// PodGuard is where the share's pod guard is, which checks every
	// frame its pod sends on the pod's own interface: pending (no
	// container of the pod started yet), attached or detached; empty for
	// a share an older agent made, without one.
	PodGuard string `json:"podGuard,omitempty"`
	// Enforced is true where everything that holds the share to its
	// allocation is in place; Problems says what is missing where not.
	Enforced bool     `json:"enforced"`
	Problems []string `json:"problems,omitempty"`
	// Health is the device's health as the agent last wrote it
	// (healthy, degraded, lost), with Taint (key=value:effect) and its
	// HealthMessage where it is tainted.
	Health        string `json:"health,omitempty"`
	HealthMessage string `json:"healthMessage,omitempty"`
	Taint         string `json:"taint,omitempty"`
	// GPU is set on GPU memory shares (kind gpu), whose Parent is the
	// GPU's UUID and whose network fields are zero.
	GPU *GPU `json:"gpu,omitempty"`
}

// Source lists the shares of one kind.
type Source interface {
	Shares(ctx context.Context) ([]Row, error)
}

// List gathers the rows of every source, sorted by claim and share.
func List(ctx context.Context, sources ...Source) ([]Row, error) {
	rows := []Row{}
	for _, s := range sources {
		r, err := s.Shares(ctx)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if rows[i].Claim != rows[j].Claim {
			return rows[i].Claim < rows[j].Claim
		}
		return rows[i].ShareID < rows[j].ShareID
	})
	return rows, nil
}

// NotEnforced counts the rows whose enforcement is not in place.
func NotEnforced(rows []Row) int {
	n := 0
	for _, r := range rows {
		if !r.Enforced {
			n++
		}
	}
	return n
}

// Write prints rows as "table" or "json" (a JSON list).
func Write(w io.Writer, rows []Row, format string) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	case "table", "":
		var nics, gpus []Row
		for _, r := range rows {
			if r.GPU != nil {
				gpus = append(gpus, r)
			} else {
				nics = append(nics, r)
			}
		}
		tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		if len(nics) > 0 || len(gpus) == 0 {
			fmt.Fprintln(tw, "CLAIM\tSHARE ID\tPARENT\tINTERFACE\tEGRESS\tINGRESS\tEGRESS RATE\tINGRESS RATE\tBORROWING\tQUEUE\tDROPS\tSPOOFED\tGUARD\tHEALTH\tENFORCED")
			for _, r := range nics {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", r.Claim, orDash(r.ShareID), orDash(r.Parent), orDash(r.Interface),
					floorCeil(r.EgressBandwidth, r.EgressCeiling), floorCeil(r.IngressBandwidth, r.IngressCeiling), bits(r.EgressRate), bits(r.IngressRate),
					orDash(strings.Join(r.Borrowing, ",")), queueOf(r), r.Drops, spoofed(r), orDash(r.PodGuard), healthOf(r), enforced(r))
			}
		}
		if len(gpus) > 0 {
			if len(nics) > 0 {
				fmt.Fprintln(tw)
			}
			fmt.Fprintln(tw, "CLAIM\tSHARE ID\tGPU\tTIER\tSLICE\tUSED\tKILLS\tHEALTH\tENFORCED")
			for _, r := range gpus {
				claim := r.Claim
				if r.GPU.Adopted {
					claim += " (adopted)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", claim, orDash(r.ShareID), orDash(r.GPU.UUID), orDash(r.GPU.Tier),
					iec(r.GPU.SliceBytes), r.GPU.used(), r.GPU.Kills, healthOf(r), enforced(r))
			}
		}
		return tw.Flush()
	}
	return fmt.Errorf("output format %q: want table or json", format)
}

// healthOf is the HEALTH column: healthy, or the taint.
func healthOf(r Row) string {
	if r.Taint != "" {
		return r.Health + " (" + r.Taint + ")"
	}
	return orDash(r.Health)
}

func enforced(r Row) string {
	if r.Enforced {
		return "yes"
	}
	return "no: " + strings.Join(r.Problems, "; ")
}

// floorCeil is an EGRESS or INGRESS column: the bandwidth, and where the
// share borrows, its ceiling after it (100M..1G).
func floorCeil(floor, ceil int64) string {
	if ceil > floor {
		return bits(floor) + ".." + bits(ceil)
	}
	return bits(floor)
}

// bits formats bits/s as 100M or 95.12M; "-" for none.
func bits(v int64) string {
	switch {
	case v == 0:
		return "-"
	case v >= 1e9:
		return strconv.FormatFloat(float64(v)/1e9, 'g', 4, 64) + "G"
	case v >= 1e6:
		return strconv.FormatFloat(float64(v)/1e6, 'g', 4, 64) + "M"
	case v >= 1e3:
		return strconv.FormatFloat(float64(v)/1e3, 'g', 4, 64) + "k"
	}
	return strconv.FormatInt(v, 10)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// spoofed is the total of a share's spoofed frames dropped.
func spoofed(r Row) uint64 {
	var n uint64
	for _, c := range r.Spoofed {
		n += c
	}
	return n
}

// queueOf is the share's queue discipline, once where both ways have the
// same.
func queueOf(r Row) string {
	switch {
	case r.EgressQueue == r.IngressQueue:
		return orDash(r.EgressQueue)
	case r.EgressQueue == "":
		return "in: " + r.IngressQueue
	case r.IngressQueue == "":
		return "eg: " + r.EgressQueue
	}
	return "eg: " + r.EgressQueue + ", in: " + r.IngressQueue
}

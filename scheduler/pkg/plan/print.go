package plan

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// Print writes the plan as two tables: claims, then devices.
func (r *Result) Print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLAIM\tNODE\tDEVICES")
	for _, p := range r.Placements {
		node := p.Node
		switch {
		case p.Allocated:
			node += " (allocated)"
		case node == "":
			node = "-"
		}
		devices := make([]string, 0, len(p.Devices))
		for _, d := range p.Devices {
			s := d.Request + "=" + d.Device
			if len(d.ConsumedCapacity) > 0 {
				var caps []string
				for n, q := range d.ConsumedCapacity {
					caps = append(caps, fmt.Sprintf("%s:%s", n, q.String()))
				}
				sort.Strings(caps)
				s += "[" + strings.Join(caps, ",") + "]"
			}
			devices = append(devices, s)
		}
		if p.Reason != "" {
			devices = append(devices, "unschedulable: "+p.Reason)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", p.Claim, node, strings.Join(devices, " "))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "NODE\tDEVICE\tKIND\tUSE")
	for _, d := range r.Devices {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", d.Node, d.Device, d.Kind, d.describe())
	}
	return tw.Flush()
}

func (d DeviceUse) describe() string {
	switch {
	case d.Exclusive:
		return "allocated"
	case d.Capacity == nil && d.Shares == 0:
		return "free"
	}
	names := make([]string, 0, len(d.Capacity))
	for n := range d.Capacity {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := []string{fmt.Sprintf("%d shares", d.Shares)}
	for _, n := range names {
		c := d.Capacity[n]
		pct := 0.0
		if t := c.Total.AsApproximateFloat64(); t > 0 {
			pct = 100 * c.Used.AsApproximateFloat64() / t
		}
		parts = append(parts, fmt.Sprintf("%s %s/%s (%.0f%%)", n, c.Used.String(), c.Total.String(), pct))
	}
	return strings.Join(parts, ", ")
}

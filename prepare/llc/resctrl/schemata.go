package resctrl

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Schemata is a group's schemata file: the value of each domain by resource
// ("L3", "MB"), as the kernel prints it.
type Schemata map[string]map[int]string

// ParseSchemata reads a schemata file: lines "<resource>:<id>=<value>;...",
// the resource name padded with spaces.
func ParseSchemata(s string) (Schemata, error) {
	out := Schemata{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		name, doms, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("schemata line %q: no resource name", line)
		}
		name = strings.TrimSpace(name)
		m := map[int]string{}
		for _, part := range strings.Split(doms, ";") {
			id, v, ok := strings.Cut(strings.TrimSpace(part), "=")
			n, err := strconv.Atoi(id)
			if !ok || err != nil || n < 0 || v == "" {
				return nil, fmt.Errorf("schemata line %q: %q is not <domain id>=<value>", line, part)
			}
			m[n] = v
		}
		out[name] = m
	}
	return out, nil
}

// Mask is a domain's L3 capacity bitmask in the schemata.
func (s Schemata) Mask(domain int) (uint64, error) {
	v, ok := s["L3"][domain]
	if !ok {
		return 0, fmt.Errorf("schemata has no L3 domain %d", domain)
	}
	m, err := strconv.ParseUint(v, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("schemata L3 domain %d: %q is not a hex mask", domain, v)
	}
	return m, nil
}

// L3Line is a schemata line that sets the given domains' masks:
// "L3:0=f000;1=00ff".
func L3Line(masks map[int]uint64) string {
	ids := make([]int, 0, len(masks))
	for id := range masks {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprintf("%d=%x", id, masks[id])
	}
	return "L3:" + strings.Join(parts, ";")
}

// MBLine is a schemata line that sets one domain's memory bandwidth.
func MBLine(domain, value int) string { return fmt.Sprintf("MB:%d=%d", domain, value) }

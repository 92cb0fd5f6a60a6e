package llc

import (
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/carve-dra/carve/prepare/llc/resctrl"
)

// apply makes a share's group and gives it its ways: the default group
// (and every other share's group, in its other domains) first shrinks to
// the ways left, then the share's group gets its mask in its domain and the
// default group's in the others, so that its tasks on another cache behave
// as unshared ones.
func (p *Preparer) apply(in resctrl.L3Info, s share) error {
	if err := p.opts.FS.Mkdir(s.Group); err != nil && !isExist(err) {
		err = resctrl.WithStatus(p.opts.FS, err)
		if isNoSpace(err) {
			return fmt.Errorf("resctrl has no CLOSID left for another group (num_closids %d, one is the default group's): %w", in.NumCLOSIDs, err)
		}
		return fmt.Errorf("create resctrl group: %w", err)
	}
	if err := p.applyDefault(in, s.Domain); err != nil {
		return err
	}
	domains, err := p.domains()
	if err != nil {
		return err
	}
	masks := map[int]uint64{}
	for _, d := range domains {
		masks[d] = p.alloc.defaultMask(in, d)
	}
	masks[s.Domain] = s.Mask
	content := resctrl.L3Line(masks) + "\n"
	if s.MB > 0 {
		content += resctrl.MBLine(s.Domain, s.MB) + "\n"
	}
	return resctrl.WithStatus(p.opts.FS, p.opts.FS.WriteFile(path.Join(s.Group, "schemata"), []byte(content)))
}

// applyDefault writes a domain's default mask to the default group and to
// every share's group that holds no ways in that domain.
func (p *Preparer) applyDefault(in resctrl.L3Info, domain int) error {
	line := []byte(resctrl.L3Line(map[int]uint64{domain: p.alloc.defaultMask(in, domain)}) + "\n")
	if err := p.opts.FS.WriteFile("schemata", line); err != nil {
		return fmt.Errorf("default group: %w", resctrl.WithStatus(p.opts.FS, err))
	}
	for _, g := range p.alloc.groups() {
		if g.Domain == domain {
			continue
		}
		if err := p.opts.FS.WriteFile(path.Join(g.Group, "schemata"), line); err != nil {
			return fmt.Errorf("group %s: %w", g.Group, resctrl.WithStatus(p.opts.FS, err))
		}
	}
	return nil
}

// domains are the L3 domain ids of the default group's schemata.
func (p *Preparer) domains() ([]int, error) {
	b, err := p.opts.FS.ReadFile("schemata")
	if err != nil {
		return nil, fmt.Errorf("default group schemata: %w", err)
	}
	sch, err := resctrl.ParseSchemata(string(b))
	if err != nil {
		return nil, fmt.Errorf("default group schemata: %w", err)
	}
	var ids []int
	for id := range sch["L3"] {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids, nil
}

// bandwidth is the MB schema value of a share: what it consumed, raised
// to resctrl's min_bandwidth.
func (p *Preparer) bandwidth(want int) (int, error) {
	b, err := p.opts.FS.ReadFile("info/MB/min_bandwidth")
	if err != nil {
		return 0, fmt.Errorf("memory bandwidth requested, but resctrl offers no MBA: %w", err)
	}
	floor, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("resctrl info/MB/min_bandwidth %q is not a number", strings.TrimSpace(string(b)))
	}
	return max(want, floor), nil
}

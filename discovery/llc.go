package discovery

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// listLLCs reads the level-3 entries of sys/devices/system/cpu/cpu*/cache.
// Every CPU lists the caches it shares, so one L3 appears once per CPU; the
// cache id deduplicates them. ghw's cache sizes come from the wrong index, so
// the files are read here directly.
func (t tree) listLLCs() ([]LLC, error) {
	const cpuDir = "sys/devices/system/cpu"
	cpus, err := filepath.Glob(t.path(filepath.Join(cpuDir, "cpu[0-9]*")))
	if err != nil {
		return nil, err
	}
	byID := map[int]LLC{}
	for _, cpu := range cpus {
		indexes, _ := filepath.Glob(filepath.Join(cpu, "cache", "index[0-9]*"))
		for _, idx := range indexes {
			rel, _ := filepath.Rel(t.root, idx)
			llc, ok, err := t.readL3(rel)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
			if _, dup := byID[llc.ID]; !dup {
				byID[llc.ID] = llc
			}
		}
	}
	rc, err := t.readResctrl()
	if err != nil {
		return nil, err
	}
	out := make([]LLC, 0, len(byID))
	for _, llc := range byID {
		llc.Resctrl = rc
		out = append(out, llc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// readL3 reads one cache index directory; ok is false for other levels.
func (t tree) readL3(rel string) (LLC, bool, error) {
	level, ok, err := t.optionalInt(filepath.Join(rel, "level"))
	if err != nil || !ok || level != 3 {
		return LLC{}, false, err
	}
	if typ, _, err := t.optionalString(filepath.Join(rel, "type")); err != nil {
		return LLC{}, false, err
	} else if typ != "" && typ != "Unified" && typ != "Data" {
		return LLC{}, false, nil
	}
	id, ok, err := t.optionalInt(filepath.Join(rel, "id"))
	if err != nil {
		return LLC{}, false, err
	}
	if !ok {
		// Old kernels have no id; the first CPU of the shared list is
		// as stable an identity as the kernel offers there.
		id = -1
	}
	llc := LLC{ID: int(id)}
	if s, ok, err := t.optionalString(filepath.Join(rel, "size")); err != nil {
		return LLC{}, false, err
	} else if ok {
		if llc.SizeBytes, err = ParseCacheSize(s); err != nil {
			return LLC{}, false, fmt.Errorf("parse %s: %w", t.path(filepath.Join(rel, "size")), err)
		}
	}
	if ways, ok, err := t.optionalInt(filepath.Join(rel, "ways_of_associativity")); err != nil {
		return LLC{}, false, err
	} else if ok {
		llc.Ways = int(ways)
	}
	if s, ok, err := t.optionalString(filepath.Join(rel, "shared_cpu_list")); err != nil {
		return LLC{}, false, err
	} else if ok {
		cpus, err := ParseCPUList(s)
		if err != nil {
			return LLC{}, false, fmt.Errorf("parse %s: %w", t.path(filepath.Join(rel, "shared_cpu_list")), err)
		}
		llc.CPUs = FormatCPUList(cpus)
		if llc.ID < 0 && len(cpus) > 0 {
			llc.ID = cpus[0]
		}
	}
	if llc.ID < 0 {
		return LLC{}, false, nil
	}
	return llc, true, nil
}

// readResctrl reads sys/fs/resctrl/info/L3 where resctrl is mounted.
func (t tree) readResctrl() (*Resctrl, error) {
	const dir = "sys/fs/resctrl/info/L3"
	if _, err := os.Stat(t.path(dir)); err != nil {
		return nil, nil
	}
	rc := &Resctrl{}
	mask, ok, err := t.optionalString(filepath.Join(dir, "cbm_mask"))
	if err != nil || !ok {
		return nil, err
	}
	if rc.CBMMask, err = ParseHexMask(mask); err != nil {
		return nil, fmt.Errorf("parse %s: %w", t.path(filepath.Join(dir, "cbm_mask")), err)
	}
	if v, ok, err := t.optionalInt(filepath.Join(dir, "min_cbm_bits")); err != nil {
		return nil, err
	} else if ok {
		rc.MinCBMBits = int(v)
	}
	if v, ok, err := t.optionalInt(filepath.Join(dir, "num_closids")); err != nil {
		return nil, err
	} else if ok {
		rc.NumCLOSIDs = int(v)
	}
	if s, ok, err := t.optionalString(filepath.Join(dir, "shareable_bits")); err != nil {
		return nil, err
	} else if ok && strings.TrimSpace(s) != "" {
		if rc.ShareableBM, err = ParseHexMask(s); err != nil {
			return nil, fmt.Errorf("parse %s: %w", t.path(filepath.Join(dir, "shareable_bits")), err)
		}
	}
	if rc.MinCBMBits < 1 {
		rc.MinCBMBits = 1
	}
	if rc.MBA, err = t.readMBA(); err != nil {
		return nil, err
	}
	return rc, nil
}

// readMBA reads sys/fs/resctrl/info/MB where it exists. The largest value
// a group may have is what the kernel gives the default group: its MB line.
func (t tree) readMBA() (*MBA, error) {
	const dir = "sys/fs/resctrl/info/MB"
	if _, err := os.Stat(t.path(dir)); err != nil {
		return nil, nil
	}
	m := &MBA{Gran: 1, Max: 100}
	for _, f := range []struct {
		name string
		dst  *int
	}{{"min_bandwidth", &m.Min}, {"bandwidth_gran", &m.Gran}} {
		if v, ok, err := t.optionalInt(filepath.Join(dir, f.name)); err != nil {
			return nil, err
		} else if ok {
			*f.dst = int(v)
		}
	}
	if s, ok, err := t.optionalString("sys/fs/resctrl/schemata"); err != nil {
		return nil, err
	} else if ok {
		for _, line := range strings.Split(s, "\n") {
			name, doms, _ := strings.Cut(strings.TrimSpace(line), ":")
			if strings.TrimSpace(name) != "MB" {
				continue
			}
			_, v, _ := strings.Cut(strings.Split(doms, ";")[0], "=")
			if n, err := strconv.Atoi(v); err == nil && n > 0 {
				m.Max = n
			}
		}
	}
	if m.Gran < 1 || m.Min > m.Max {
		return nil, fmt.Errorf("%s: min_bandwidth %d, bandwidth_gran %d and maximum %d do not make a range", t.path(dir), m.Min, m.Gran, m.Max)
	}
	return m, nil
}

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
//
// The kernel lists an L3 under each CPU of its shared_cpu_list, so a CPU
// in the list of an L3 already read has nothing new: it is not read. A
// large node's 128 CPUs cost two L3s' files, not 128 CPUs' (some 3,000
// system calls, run one after another, 13 ms on the test VM). CPUs are
// taken in name order, as filepath.Glob gave them, and a listing that
// fails is empty, as it was for Glob.
func (t tree) listLLCs() ([]LLC, error) {
	const cpuDir = "sys/devices/system/cpu"
	byID := map[int]LLC{}
	cpus, ok, err := t.openDir(cpuDir)
	if err != nil {
		return nil, err
	}
	if ok {
		defer cpus.close()
		entries, _ := readDirInodes(t.path(cpuDir))
		covered := map[int]bool{}
		for _, e := range entries {
			n, isCPU := cpuNumber(e.name)
			if !isCPU || covered[n] {
				continue
			}
			indexes, _ := readDirInodes(t.path(cpuDir + "/" + e.name + "/cache"))
			for _, idx := range indexes {
				if !isIndexDir(idx.name) {
					continue
				}
				llc, ok, err := readL3(cpus, e.name+"/cache/"+idx.name)
				if err != nil {
					return nil, err
				}
				if !ok {
					continue
				}
				if _, dup := byID[llc.ID]; !dup {
					byID[llc.ID] = llc
				}
				shared, _ := ParseCPUList(llc.CPUs)
				for _, c := range shared {
					covered[c] = true
				}
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

// cpuNumber tells the CPU directories filepath.Glob's "cpu[0-9]*" matched,
// and the number of those named cpu<n>; n is -1 for others (never covered).
func cpuNumber(name string) (n int, isCPU bool) {
	if len(name) < 4 || !strings.HasPrefix(name, "cpu") || name[3] < '0' || name[3] > '9' {
		return 0, false
	}
	v, err := strconv.Atoi(name[3:])
	if err != nil {
		return -1, true
	}
	return v, true
}

// isIndexDir tells the names filepath.Glob's "index[0-9]*" matched.
func isIndexDir(name string) bool {
	return len(name) > 5 && strings.HasPrefix(name, "index") && name[5] >= '0' && name[5] <= '9'
}

// readL3 reads one cache index directory, rel below cpus; ok is false for
// other levels.
func readL3(cpus dir, rel string) (LLC, bool, error) {
	file := func(name string) string { return rel + "/" + name }
	level, ok, err := cpus.optionalInt(file("level"))
	if err != nil || !ok || level != 3 {
		return LLC{}, false, err
	}
	if typ, _, err := cpus.optionalString(file("type")); err != nil {
		return LLC{}, false, err
	} else if typ != "" && typ != "Unified" && typ != "Data" {
		return LLC{}, false, nil
	}
	id, ok, err := cpus.optionalInt(file("id"))
	if err != nil {
		return LLC{}, false, err
	}
	if !ok {
		// Old kernels have no id; the first CPU of the shared list is
		// as stable an identity as the kernel offers there.
		id = -1
	}
	llc := LLC{ID: int(id)}
	if s, ok, err := cpus.optionalString(file("size")); err != nil {
		return LLC{}, false, err
	} else if ok {
		if llc.SizeBytes, err = ParseCacheSize(s); err != nil {
			return LLC{}, false, fmt.Errorf("parse %s: %w", cpus.name(file("size")), err)
		}
	}
	if ways, ok, err := cpus.optionalInt(file("ways_of_associativity")); err != nil {
		return LLC{}, false, err
	} else if ok {
		llc.Ways = int(ways)
	}
	if s, ok, err := cpus.optionalString(file("shared_cpu_list")); err != nil {
		return LLC{}, false, err
	} else if ok {
		list, err := ParseCPUList(s)
		if err != nil {
			return LLC{}, false, fmt.Errorf("parse %s: %w", cpus.name(file("shared_cpu_list")), err)
		}
		llc.CPUs = FormatCPUList(list)
		if llc.ID < 0 && len(list) > 0 {
			llc.ID = list[0]
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

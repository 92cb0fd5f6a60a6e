package sysfstest

import (
	"errors"
	"fmt"
	"io/fs"
	"math/bits"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// info reads a number from info/<res>/<name> (hex where hex).
func (f *ResctrlFS) info(res, name string, hex bool) (uint64, bool) {
	b, err := os.ReadFile(f.path(filepath.Join("info", res, name)))
	if err != nil {
		return 0, false
	}
	base := 10
	if hex {
		base = 16
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), base, 64)
	return v, err == nil
}

// state parses a group's schemata ("" is the default group).
func (f *ResctrlFS) state(group string) (l3 map[int]uint64, mb map[int]int, cbmLen int) {
	cbm, _ := f.info("L3", "cbm_mask", true)
	cbmLen = bits.Len64(cbm)
	b, err := os.ReadFile(f.path(filepath.Join(group, "schemata")))
	if err != nil {
		panic(fmt.Sprintf("fake resctrl: group %q has no schemata: %v", group, err))
	}
	l3 = map[int]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		name, doms, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		for _, part := range strings.Split(doms, ";") {
			id, v, _ := strings.Cut(part, "=")
			n, _ := strconv.Atoi(id)
			switch name {
			case "L3":
				m, _ := strconv.ParseUint(v, 16, 64)
				l3[n] = m
			case "MB":
				if mb == nil {
					mb = map[int]int{}
				}
				mb[n], _ = strconv.Atoi(v)
			}
		}
	}
	return l3, mb, cbmLen
}

// groups are the control groups other than the default one.
func (f *ResctrlFS) groups() []string {
	entries, _ := os.ReadDir(f.Dir)
	var out []string
	for _, e := range entries {
		if e.IsDir() && e.Name() != "info" && e.Name() != "mon_groups" && e.Name() != "mon_data" {
			out = append(out, e.Name())
		}
	}
	return out
}

func (f *ResctrlFS) fail(op, rel string, errno syscall.Errno, status string) error {
	_ = os.WriteFile(f.path("info/last_cmd_status"), []byte(status+"\n"), 0o644)
	return &fs.PathError{Op: op, Path: f.path(rel), Err: errno}
}

func (f *ResctrlFS) ok() { _ = os.WriteFile(f.path("info/last_cmd_status"), []byte("ok\n"), 0o644) }

// Mkdir creates a control group with the kernel's initial masks: in each
// domain the shareable bits, the masks of every other (shareable) group
// and the unused bits, cut to their lowest contiguous run.
func (f *ResctrlFS) Mkdir(rel string) error {
	if strings.Contains(rel, "/") || rel == "" || rel == "info" {
		return f.fail("mkdir", rel, syscall.EPERM, "")
	}
	if _, err := os.Stat(f.path(rel)); err == nil {
		return &fs.PathError{Op: "mkdir", Path: f.path(rel), Err: fs.ErrExist}
	}
	closids, _ := f.info("L3", "num_closids", false)
	if len(f.groups())+1 >= int(closids) {
		return f.fail("mkdir", rel, syscall.ENOSPC, "Out of CLOSIDs")
	}
	l3, mb, cbmLen := f.state("")
	cbm, _ := f.info("L3", "cbm_mask", true)
	shareable, _ := f.info("L3", "shareable_bits", true)
	minBits, _ := f.info("L3", "min_cbm_bits", false)
	used := map[int]uint64{}
	for _, g := range append(f.groups(), "") {
		gl3, _, _ := f.state(g)
		for id, m := range gl3 {
			used[id] |= m
		}
	}
	init := map[int]uint64{}
	for id := range l3 {
		m := shareable | used[id] | (cbm &^ used[id])
		m = lowestRun(m)
		if bits.OnesCount64(m) < int(minBits) {
			return f.fail("mkdir", rel, syscall.ENOSPC, fmt.Sprintf("No space on L3:%d", id))
		}
		init[id] = m
	}
	var initMB map[int]int
	if mb != nil {
		initMB = map[int]int{}
		for id := range mb {
			initMB[id] = 100
		}
	}
	if err := os.Mkdir(f.path(rel), 0o755); err != nil {
		return err
	}
	for name, content := range map[string]string{"schemata": formatSchemata(init, initMB, cbmLen), "tasks": "", "cpus": "", "mode": "shareable\n"} {
		if err := os.WriteFile(f.path(filepath.Join(rel, name)), []byte(content), 0o644); err != nil {
			return err
		}
	}
	f.ok()
	return nil
}

func lowestRun(m uint64) uint64 {
	if m == 0 {
		return 0
	}
	lo := bits.TrailingZeros64(m)
	run := m >> lo
	n := bits.TrailingZeros64(^run)
	return ((uint64(1) << n) - 1) << lo
}

// Remove removes a control group; its tasks return to the default group.
func (f *ResctrlFS) Remove(rel string) error {
	if rel == "" || rel == "info" || strings.Contains(rel, "/") {
		return f.fail("rmdir", rel, syscall.EPERM, "")
	}
	tasks, err := os.ReadFile(f.path(filepath.Join(rel, "tasks")))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	root, _ := os.ReadFile(f.path("tasks"))
	if err := os.WriteFile(f.path("tasks"), append(root, tasks...), 0o644); err != nil {
		return err
	}
	return os.RemoveAll(f.path(rel))
}

// WriteFile writes to a group's schemata or tasks as the kernel takes them.
func (f *ResctrlFS) WriteFile(rel string, data []byte) error {
	group, name := filepath.Split(rel)
	group = strings.TrimSuffix(group, "/")
	if _, err := os.Stat(f.path(rel)); err != nil {
		return err
	}
	switch name {
	case "schemata":
		return f.writeSchemata(group, rel, string(data))
	case "tasks":
		return f.writeTask(group, rel, string(data))
	}
	return os.WriteFile(f.path(rel), data, 0o644)
}

func (f *ResctrlFS) writeTask(group, rel, data string) error {
	pid, err := strconv.Atoi(strings.TrimSpace(data))
	if err != nil || pid <= 0 {
		return f.fail("write", rel, syscall.EINVAL, "Task list parsing error")
	}
	for _, g := range append(f.groups(), "") {
		b, _ := os.ReadFile(f.path(filepath.Join(g, "tasks")))
		var keep []string
		for _, l := range strings.Fields(string(b)) {
			if l != strconv.Itoa(pid) {
				keep = append(keep, l)
			}
		}
		if g == group {
			keep = append(keep, strconv.Itoa(pid))
		}
		content := strings.Join(keep, "\n")
		if content != "" {
			content += "\n"
		}
		if err := os.WriteFile(f.path(filepath.Join(g, "tasks")), []byte(content), 0o644); err != nil {
			return err
		}
	}
	f.ok()
	return nil
}

func (f *ResctrlFS) writeSchemata(group, rel, data string) error {
	l3, mb, cbmLen := f.state(group)
	cbm, _ := f.info("L3", "cbm_mask", true)
	minBits, _ := f.info("L3", "min_cbm_bits", false)
	minBW, hasMB := f.info("MB", "min_bandwidth", false)
	for _, line := range strings.Split(data, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		name, doms, ok := strings.Cut(line, ":")
		name = strings.TrimSpace(name)
		known := name == "L3" || name == "MB" && hasMB
		if !ok || !known {
			return f.fail("write", rel, syscall.EINVAL, fmt.Sprintf("Unknown or unsupported resource name '%s'", name))
		}
		seen := map[int]bool{}
		for _, part := range strings.Split(doms, ";") {
			id, v, ok := strings.Cut(strings.TrimSpace(part), "=")
			n, err := strconv.Atoi(id)
			if _, known := l3[n]; !ok || err != nil || !known {
				return f.fail("write", rel, syscall.EINVAL, fmt.Sprintf("Missing or unknown domain in '%s'", part))
			}
			if seen[n] {
				return f.fail("write", rel, syscall.EINVAL, fmt.Sprintf("Duplicate domain %d", n))
			}
			seen[n] = true
			if name == "MB" {
				bw, err := strconv.Atoi(v)
				if err != nil || bw < int(minBW) || bw > 100 {
					return f.fail("write", rel, syscall.EINVAL, fmt.Sprintf("MB value %s out of range [%d,100]", v, minBW))
				}
				mb[n] = bw
				continue
			}
			m, err := strconv.ParseUint(v, 16, 64)
			switch {
			case err != nil:
				return f.fail("write", rel, syscall.EINVAL, fmt.Sprintf("Non-hex character in the mask %s", v))
			case m == 0 || m > cbm || m&^cbm != 0:
				return f.fail("write", rel, syscall.EINVAL, "Mask out of range")
			case lowestRun(m) != m:
				return f.fail("write", rel, syscall.EINVAL, fmt.Sprintf("The mask %x has non-consecutive 1-bits", m))
			case bits.OnesCount64(m) < int(minBits):
				return f.fail("write", rel, syscall.EINVAL, fmt.Sprintf("Need at least %d bits in the mask", minBits))
			}
			l3[n] = m
		}
	}
	if err := os.WriteFile(f.path(rel), []byte(formatSchemata(l3, mb, cbmLen)), 0o644); err != nil {
		return err
	}
	f.ok()
	return nil
}

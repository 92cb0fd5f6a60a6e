package sysfstest

import (
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// ResctrlDir is where resctrl is mounted below a root.
const ResctrlDir = "sys/fs/resctrl"

// AddResctrl mounts a fake resctrl with L3 allocation over the caches
// added so far: info/L3 and the default group's schemata (every domain
// with the full mask), tasks and cpus, as the kernel lays them out.
func (t *Tree) AddResctrl(cbmMask string, minBits, closids int) {
	t.AddResctrlShareable(cbmMask, "0", minBits, closids)
}

// AddResctrlShareable is AddResctrl with shareable_bits (ways that I/O may
// use too).
func (t *Tree) AddResctrlShareable(cbmMask, shareable string, minBits, closids int) {
	t.writeFiles(filepath.Join(ResctrlDir, "info/L3"), map[string]string{
		"cbm_mask": cbmMask, "min_cbm_bits": fmt.Sprint(minBits), "num_closids": fmt.Sprint(closids), "shareable_bits": shareable,
	})
	t.write(filepath.Join(ResctrlDir, "info/last_cmd_status"), "ok")
	cbm, err := strconv.ParseUint(cbmMask, 16, 64)
	if err != nil {
		panic(err)
	}
	l3 := map[int]uint64{}
	for _, id := range t.llcIDs {
		l3[id] = cbm
	}
	t.write(filepath.Join(ResctrlDir, "schemata"), formatSchemata(l3, nil, bits.Len64(cbm)))
	t.write(filepath.Join(ResctrlDir, "tasks"), "")
	t.write(filepath.Join(ResctrlDir, "cpus"), "")
}

// AddMBA adds memory bandwidth allocation to a fake resctrl: info/MB and
// an MB line of 100 (percent) per domain in the default group's schemata.
func (t *Tree) AddMBA(minBandwidth, gran int) {
	t.writeFiles(filepath.Join(ResctrlDir, "info/MB"), map[string]string{
		"min_bandwidth": fmt.Sprint(minBandwidth), "bandwidth_gran": fmt.Sprint(gran), "delay_linear": "1", "num_closids": "8",
	})
	f := (&ResctrlFS{Dir: filepath.Join(t.Root, ResctrlDir)})
	l3, _, cbmLen := f.state("")
	mb := map[int]int{}
	for id := range l3 {
		mb[id] = 100
	}
	t.write(filepath.Join(ResctrlDir, "schemata"), formatSchemata(l3, mb, cbmLen))
}

// formatSchemata prints a schemata file as the kernel does: masks in hex
// zero-padded to the mask's width.
func formatSchemata(l3 map[int]uint64, mb map[int]int, cbmLen int) string {
	var b strings.Builder
	ids := sortedKeys(l3)
	b.WriteString("L3:")
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(';')
		}
		fmt.Fprintf(&b, "%d=%0*x", id, (cbmLen+3)/4, l3[id])
	}
	b.WriteByte('\n')
	if mb != nil {
		b.WriteString("MB:")
		for i, id := range sortedKeys(mb) {
			if i > 0 {
				b.WriteByte(';')
			}
			fmt.Fprintf(&b, "%d=%d", id, mb[id])
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func sortedKeys[V any](m map[int]V) []int {
	ids := make([]int, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids
}

// ResctrlFS is a fake resctrl filesystem over a fixture's files that
// behaves as the kernel's does where carve relies on it: a group made with
// mkdir gets the files and initial masks the kernel gives it, or ENOSPC
// when the CLOSIDs are used up; a schemata write is parsed and validated
// (known resource and domain, a mask within cbm_mask, contiguous and of at
// least min_cbm_bits bits, an MB value within [min_bandwidth, 100]) and
// refused whole with EINVAL and info/last_cmd_status saying why; only the
// domains written change; rmdir moves the group's tasks to the default
// group.
type ResctrlFS struct {
	Dir string
}

// ResctrlFS returns the fake filesystem of a tree with resctrl added.
func (t *Tree) ResctrlFS() *ResctrlFS {
	return &ResctrlFS{Dir: filepath.Join(t.Root, ResctrlDir)}
}

func (f *ResctrlFS) path(rel string) string { return filepath.Join(f.Dir, rel) }

// ReadFile reads a file.
func (f *ResctrlFS) ReadFile(rel string) ([]byte, error) { return os.ReadFile(f.path(rel)) }

// ResctrlAt is the fake resctrl filesystem below a fixture root.
func ResctrlAt(root string) *ResctrlFS { return &ResctrlFS{Dir: filepath.Join(root, ResctrlDir)} }

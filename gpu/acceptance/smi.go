package acceptance

import (
	"bufio"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// What nvidia-smi says, for the acceptance run to hold carve's discovery
// against: nvidia-smi is NVIDIA's own reading of the driver, through no
// code of carve's and no binding of go-nvml's.

// SMIQueryArgs are nvidia-smi's arguments for what ParseSMIQuery reads.
var SMIQueryArgs = []string{"--query-gpu=index,uuid,pci.bus_id,memory.total", "--format=csv,noheader,nounits"}

// SMIGPU is one GPU as nvidia-smi lists it.
type SMIGPU struct {
	Index int
	UUID  string
	// BusID is nvidia-smi's form, "00000000:00:06.0".
	BusID string
	// MemoryMiB is memory.total in MiB.
	MemoryMiB uint64
}

// ParseSMIQuery reads the output of `nvidia-smi SMIQueryArgs...`.
func ParseSMIQuery(out string) ([]SMIGPU, error) {
	var gpus []SMIGPU
	sc := bufio.NewScanner(strings.NewReader(out))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != 4 {
			return nil, fmt.Errorf("nvidia-smi line %d: %q: want 4 fields (index, uuid, pci.bus_id, memory.total)", n, line)
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		idx, err := strconv.Atoi(f[0])
		if err != nil {
			return nil, fmt.Errorf("nvidia-smi line %d: index %q: %w", n, f[0], err)
		}
		mem, err := strconv.ParseUint(f[3], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("nvidia-smi line %d: memory.total %q (MiB, nounits): %w", n, f[3], err)
		}
		gpus = append(gpus, SMIGPU{Index: idx, UUID: f[1], BusID: f[2], MemoryMiB: mem})
	}
	if len(gpus) == 0 {
		return nil, fmt.Errorf("nvidia-smi listed no GPU: %q", out)
	}
	return gpus, nil
}

// SMIPlacement is one GPU-instance placement as `nvidia-smi mig -lgipp`
// lists it, by the profile's Id (NVML's, not its index).
type SMIPlacement struct {
	GPU, ProfileID, Start, Size int
}

// lgippLine is a line of `nvidia-smi mig -lgipp`, as NVIDIA's MIG user
// guide shows it: "GPU  0 Profile ID 15 Placements: {0,2,4,6}:2", with
// "Placement :" where there is one.
var lgippLine = regexp.MustCompile(`^GPU\s+(\d+)\s+Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([0-9,\s]*)\}\s*:\s*(\d+)\s*$`)

// ParseLGIPP reads the output of `nvidia-smi mig -lgipp`. A line it cannot
// read is an error: the run must not compare against half a list.
func ParseLGIPP(out string) ([]SMIPlacement, error) {
	var pls []SMIPlacement
	sc := bufio.NewScanner(strings.NewReader(out))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		m := lgippLine.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("nvidia-smi mig -lgipp line %d: %q is not a placement list", n, line)
		}
		gpu, _ := strconv.Atoi(m[1])
		id, _ := strconv.Atoi(m[2])
		size, _ := strconv.Atoi(m[4])
		for _, s := range strings.Split(m[3], ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			start, err := strconv.Atoi(s)
			if err != nil {
				return nil, fmt.Errorf("nvidia-smi mig -lgipp line %d: start %q: %w", n, s, err)
			}
			pls = append(pls, SMIPlacement{GPU: gpu, ProfileID: id, Start: start, Size: size})
		}
	}
	if len(pls) == 0 {
		return nil, fmt.Errorf("nvidia-smi mig -lgipp listed no placement: %q", out)
	}
	return pls, nil
}

// lgipRow is the first line of a profile's row in `nvidia-smi mig -lgip`'s
// table: "|   0  MIG 1g.10gb         19     7/7        9.75       No     16     1     0   |".
var lgipRow = regexp.MustCompile(`^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+\d+/\d+\s`)

// ParseLGIP reads the profile names of `nvidia-smi mig -lgip`, by GPU and
// profile Id, without nvidia-smi's "MIG " prefix: the names NVML's v3
// profile info gives, which carve publishes.
func ParseLGIP(out string) (map[int]map[int]string, error) {
	names := map[int]map[int]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		m := lgipRow.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil {
			continue // the table's frame, headers and second lines
		}
		gpu, _ := strconv.Atoi(m[1])
		id, _ := strconv.Atoi(m[3])
		if names[gpu] == nil {
			names[gpu] = map[int]string{}
		}
		names[gpu][id] = m[2]
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("nvidia-smi mig -lgip listed no profile: %q", out)
	}
	return names, nil
}

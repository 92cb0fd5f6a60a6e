package discovery

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// maxCPUs bounds CPU lists so that a corrupt file cannot make discovery
// allocate without limit.
const maxCPUs = 1 << 16

// ParseCPUList parses a kernel CPU list such as "0-3,8,10-11" and returns the
// CPUs in ascending order without duplicates.
func ParseCPUList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	// A bitmap, not a map: a list of many wide ranges stays cheap.
	var seen [maxCPUs / 64]uint64
	n := 0
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := strconv.Atoi(lo)
		if err != nil || first < 0 {
			return nil, fmt.Errorf("bad CPU %q in list %q", lo, truncate(s, 60))
		}
		last := first
		if isRange {
			last, err = strconv.Atoi(hi)
			if err != nil || last < first {
				return nil, fmt.Errorf("bad CPU range %q in list %q", part, truncate(s, 60))
			}
		}
		if last >= maxCPUs {
			return nil, fmt.Errorf("CPU %d in list %q is beyond %d", last, truncate(s, 60), maxCPUs)
		}
		for c := first; c <= last; c++ {
			if seen[c/64]&(1<<(c%64)) == 0 {
				seen[c/64] |= 1 << (c % 64)
				n++
			}
		}
	}
	cpus := make([]int, 0, n)
	for w, word := range seen {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			cpus = append(cpus, w*64+b)
			word &= word - 1
		}
	}
	return cpus, nil
}

// FormatCPUList is the inverse of ParseCPUList: sorted CPUs to "0-3,8".
func FormatCPUList(cpus []int) string {
	var b strings.Builder
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(cpus[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return b.String()
}

// ParseCacheSize parses a sysfs cache size such as "48K", "2048K" or "260M"
// into bytes.
func ParseCacheSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bad cache size %q", s)
	}
	if n > (1<<62)/mult {
		return 0, fmt.Errorf("cache size %q overflows", s)
	}
	return n * mult, nil
}

// ParseHexMask parses a resctrl bitmask such as "fffff" or "7ff".
func ParseHexMask(s string) (uint64, error) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "0x")
	if s == "" {
		return 0, fmt.Errorf("empty bitmask")
	}
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("bad bitmask %q", s)
	}
	return v, nil
}

// MaskWays is the number of cache ways in a capacity bitmask.
func MaskWays(mask uint64) int { return bits.OnesCount64(mask) }

// ParseKernelConfig reads the lines of a kernel .config ("CONFIG_X=y") into a
// map of option name to value. Comments and blank lines are skipped; a line of
// another shape is an error.
func ParseKernelConfig(text string) (map[string]string, error) {
	opts := map[string]string{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(name, "CONFIG_") {
			return nil, fmt.Errorf("line %d: not an option: %q", i+1, truncate(line, 60))
		}
		opts[name] = value
	}
	return opts, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

package nettest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// CPUTimes is the machine's idle (idle and iowait) and total CPU time, in
// USER_HZ ticks, from /proc/stat: the many-share runs report the idle part.
func CPUTimes() (idle, total uint64, err error) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(strings.SplitN(string(raw), "\n", 2)[0])
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: no cpu line")
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
		total += n
		if i == 3 || i == 4 {
			idle += n
		}
	}
	return idle, total, nil
}

// Jain is Jain's fairness index of xs: 1 when all are equal, 1/len(xs) when
// one has everything.
func Jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 {
		return 0
	}
	return s * s / (float64(len(xs)) * s2)
}

package acceptance

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestBisect(t *testing.T) {
	const mb = uint64(1) << 20
	for _, c := range []struct {
		lo, hi, limit, want uint64
		most                int
	}{
		{0, 4096 * mb, 3584 * mb, 3584 * mb, 6},
		{0, 4096 * mb, 3600 * mb, 3584 * mb, 6},
		{0, 4096 * mb, 10 * mb, 0, 6},
		{4096 * mb, 5120 * mb, 9999 * mb, 5056 * mb, 4},
		{0, 64 * mb, 64 * mb, 0, 0},
	} {
		tries := 0
		got, err := Bisect(c.lo, c.hi, ProbeStep, func(size uint64) (bool, error) {
			tries++
			if size <= c.lo || size >= c.hi || size%ProbeStep != 0 {
				t.Errorf("tried %d MiB outside (%d, %d) MiB or off the step", size/mb, c.lo/mb, c.hi/mb)
			}
			return size <= c.limit, nil
		})
		if err != nil || got != c.want || tries > c.most {
			t.Errorf("limit %d MiB in [%d, %d) MiB: %d MiB after %d tries (at most %d), %v; want %d MiB",
				c.limit/mb, c.lo/mb, c.hi/mb, got/mb, tries, c.most, err, c.want/mb)
		}
	}
	boom := errors.New("no server")
	if got, err := Bisect(0, 4096<<20, ProbeStep, func(uint64) (bool, error) { return false, boom }); !errors.Is(err, boom) || got != 0 {
		t.Errorf("an error: %d, %v", got, err)
	}
}

func TestProbeResult(t *testing.T) {
	r := ProbeResult{GPU: "GPU-x (H100)", Slice: 4096 << 20, UID: 1001, Path: "/tmp/cvq-1 (0711)/gpushare (0755)/.../pipe (0755)", Largest: 1,
		Tries: []ProbeTry{
			{Alloc: 4096 << 20, Err: "cuMemAlloc_v2: 2 out of memory", Client: Reading{516 << 20, true}, Server: Reading{30 << 20, true}},
			{Alloc: 3584 << 20, Allowed: true, Client: Reading{4100 << 20, true}, Server: Reading{30 << 20, true}},
		},
		Server: "pid 42 uid 1001", ServerIdle: Reading{28 << 20, true}, Used: [4]uint64{600 << 20, 600 << 20, 4800 << 20, 700 << 20}}
	if c, ok := r.Context(); !ok || c != 516<<20 {
		t.Errorf("context %d, %v", c>>20, ok)
	}
	if !r.OverSlice() {
		t.Error("4100 MiB in a 4096 MiB slice is over it")
	}
	var b bytes.Buffer
	r.Markdown(&b)
	for _, want := range []string{"| largest allocation allowed | 3584 MiB (to within 64 MiB) |", "| figure − allocation (context) | 516 MiB |",
		"**yes**: 4100 MiB > 4096 MiB", "| MPS server's figure, no client | 28 MiB |", "| GPU used, server idle − before (what no slice counts) | 100 MiB |",
		"| 1 | 4096 MiB | refused: cuMemAlloc_v2: 2 out of memory | 516 MiB | 30 MiB |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in\n%s", want, b.String())
		}
	}
	if s := r.Summary(); !strings.Contains(s, "largest allowed 3584 MiB, NVML 4100 MiB (context 516 MiB), over the slice: yes") {
		t.Errorf("summary %q", s)
	}
	r.Tries[1].Client = Reading{}
	if _, ok := r.Context(); ok || r.OverSlice() {
		t.Error("a client NVML did not list has no context and is not over")
	}
	if s := (ProbeResult{Slice: 4096 << 20, Largest: -1}).Summary(); !strings.Contains(s, "no allocation allowed") {
		t.Errorf("nothing allowed: %q", s)
	}
}

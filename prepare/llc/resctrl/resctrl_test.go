package resctrl_test

import (
	"reflect"
	"testing"

	"github.com/carve-dra/carve/prepare/llc/resctrl"
)

func TestParseSchemata(t *testing.T) {
	s, err := resctrl.ParseSchemata("    L3:0=000ff;1=fff00\n    MB:0=100;1=30\n")
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.Mask(1); err != nil || m != 0xfff00 {
		t.Errorf("mask 1 = %x, %v", m, err)
	}
	if !reflect.DeepEqual(s["MB"], map[int]string{0: "100", 1: "30"}) {
		t.Errorf("MB = %v", s["MB"])
	}
	if _, err := s.Mask(2); err == nil {
		t.Errorf("mask of an unknown domain: no error")
	}
	for _, bad := range []string{"L3", "L3:x=ff", "L3:0", "L3:-1=f"} {
		if _, err := resctrl.ParseSchemata(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if got := resctrl.L3Line(map[int]uint64{1: 0xf0, 0: 0xff00}); got != "L3:0=ff00;1=f0" {
		t.Errorf("L3Line = %q", got)
	}
}

func TestMasks(t *testing.T) {
	for m, want := range map[uint64]bool{0: false, 1: true, 0xf0: true, 0x505: false, 0x8000000000000000: true, ^uint64(0): true} {
		if resctrl.Contiguous(m) != want {
			t.Errorf("Contiguous(%x) = %t", m, !want)
		}
	}
	if lo, n := resctrl.LargestRun(0b1110_0001_1100); lo != 2 || n != 3 {
		t.Errorf("LargestRun = %d, %d; want the lowest of the two longest runs: 2, 3", lo, n)
	}
	if r := resctrl.Run(4, 3); r != 0x70 {
		t.Errorf("Run(4, 3) = %x", r)
	}
	for _, tc := range []struct {
		cbm, shareable uint64
		min, want      int
	}{
		{0xffff, 0, 1, 15},
		{0x7ff, 0x600, 1, 9},
		{0x7ff, 0x600, 3, 6},
		{0x3, 0, 2, 0},
	} {
		if got := resctrl.ShareWays(tc.cbm, tc.shareable, tc.min); got != tc.want {
			t.Errorf("ShareWays(%x, %x, %d) = %d, want %d", tc.cbm, tc.shareable, tc.min, got, tc.want)
		}
	}
}

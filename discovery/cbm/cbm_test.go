package cbm_test

import (
	"testing"

	"github.com/carve-dra/carve/discovery/cbm"
)

func TestMasks(t *testing.T) {
	for m, want := range map[uint64]bool{0: false, 1: true, 0xf0: true, 0x505: false, 0x8000000000000000: true, ^uint64(0): true} {
		if cbm.Contiguous(m) != want {
			t.Errorf("Contiguous(%x) = %t", m, !want)
		}
	}
	if lo, n := cbm.LargestRun(0b1110_0001_1100); lo != 2 || n != 3 {
		t.Errorf("LargestRun = %d, %d; want the lowest of the two longest runs: 2, 3", lo, n)
	}
	if r := cbm.Run(4, 3); r != 0x70 {
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
		if got := cbm.ShareWays(tc.cbm, tc.shareable, tc.min); got != tc.want {
			t.Errorf("ShareWays(%x, %x, %d) = %d, want %d", tc.cbm, tc.shareable, tc.min, got, tc.want)
		}
	}
}

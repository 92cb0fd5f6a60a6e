// Package cbm is the arithmetic of cache allocation's capacity bitmasks
// (resctrl's L3 masks): runs of ways, and how many ways shares may take.
// It is pure, so that discovery, the slice builder and the LLC kind count
// ways the same way.
package cbm

import "math/bits"

// Contiguous reports whether a mask's set bits are one run.
func Contiguous(mask uint64) bool {
	if mask == 0 {
		return false
	}
	m := mask >> bits.TrailingZeros64(mask)
	return m&(m+1) == 0
}

// Run is the mask of n bits from bit lo.
func Run(lo, n int) uint64 {
	if n <= 0 {
		return 0
	}
	if n >= 64 {
		return ^uint64(0) << lo
	}
	return ((uint64(1) << n) - 1) << lo
}

// LargestRun is the longest run of set bits in a mask: its lowest bit and
// length (the lowest such run on a tie; 0, 0 for an empty mask).
func LargestRun(m uint64) (lo, n int) {
	for i := 0; i < 64; {
		if m&(1<<i) == 0 {
			i++
			continue
		}
		j := i
		for j < 64 && m&(1<<j) != 0 {
			j++
		}
		if j-i > n {
			lo, n = i, j-i
		}
		i = j
	}
	return lo, n
}

// ShareWays is how many ways shares may take in one domain: the ways
// outside the shareable bits, less what the default group must keep
// (min_cbm_bits) where the shareable bits cannot hold it.
func ShareWays(cbm, shareable uint64, minBits int) int {
	eligible := cbm &^ shareable
	n := bits.OnesCount64(eligible)
	if _, run := LargestRun(cbm & shareable); run < minBits {
		n -= minBits
	}
	return max(n, 0)
}

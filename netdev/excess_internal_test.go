package netdev

import (
	"maps"
	"testing"
)

// The borrowers' assured rates: floor plus the excess in proportion to the
// floors, water-filled under the ceilings, summing to the link less the
// unshared part; hard caps keep their floors and take their floors out of
// the excess.
func TestAssuredRates(t *testing.T) {
	const M = 1_000_000
	borrow := func(floor, ceil uint64) *excessShare {
		return &excessShare{rates: classRates{floor: floor * M, ceil: ceil * M}}
	}
	for _, c := range []struct {
		name     string
		shares   map[string]*excessShare
		unshared uint64
		want     map[string]uint64
	}{
		{"1:3", map[string]*excessShare{"a": borrow(100, 1000), "b": borrow(300, 1000)}, 0,
			map[string]uint64{"a": 250 * M, "b": 750 * M}},
		{"a hard cap beside them", map[string]*excessShare{"a": borrow(100, 1000), "b": borrow(300, 1000), "cap": borrow(100, 100)}, 0,
			map[string]uint64{"a": 225 * M, "b": 675 * M}},
		{"a ceiling leaves its part to the other", map[string]*excessShare{"a": borrow(100, 150), "b": borrow(300, 1000)}, 0,
			map[string]uint64{"a": 150 * M, "b": 850 * M}},
		{"both capped", map[string]*excessShare{"a": borrow(100, 200), "b": borrow(300, 400)}, 0,
			map[string]uint64{"a": 200 * M, "b": 400 * M}},
		{"the unshared part is not lent", map[string]*excessShare{"a": borrow(100, 1000), "b": borrow(300, 1000)}, 50 * M,
			map[string]uint64{"a": 237_500_000, "b": 712_500_000}},
		{"floors past the link: floors only", map[string]*excessShare{"a": borrow(600, 1000), "b": borrow(600, 1000)}, 0,
			map[string]uint64{"a": 600 * M, "b": 600 * M}},
		{"no borrower", map[string]*excessShare{"cap": borrow(100, 100)}, 0, map[string]uint64{}},
	} {
		got := assuredRates(c.shares, 1000*M, c.unshared)
		if !maps.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
		var sum uint64
		for key, s := range c.shares {
			if r, ok := got[key]; ok {
				sum += r
			} else {
				sum += s.rates.floor
			}
		}
		if floors := sumFloors(c.shares); floors+c.unshared <= 1000*M && sum+c.unshared > 1000*M {
			t.Errorf("%s: assured %d bit/s in all, past the link less the unshared part", c.name, sum)
		}
	}
}

func sumFloors(shares map[string]*excessShare) uint64 {
	var n uint64
	for _, s := range shares {
		n += s.rates.floor
	}
	return n
}

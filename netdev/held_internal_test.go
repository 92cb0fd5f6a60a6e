package netdev

import (
	"testing"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/slices"
)

// The "shares" capacity is built from this package's class minors and the
// classifier's compiled maps, which slices cannot import: the numbers it
// assumes are theirs.
func TestSharesCapacityInputs(t *testing.T) {
	if slices.HTBClassesPerParent != int(maxMinor-minMinor)/classBlock {
		t.Errorf("slices.HTBClassesPerParent = %d, but pickMinor hands out %d blocks", slices.HTBClassesPerParent, int(maxMinor-minMinor)/classBlock)
	}
	compiled, err := bpf.CompiledShareSlots()
	if err != nil {
		t.Fatal(err)
	}
	if slices.DefaultClassifierShares != compiled {
		t.Errorf("slices.DefaultClassifierShares = %d, the compiled classifier holds %d shares", slices.DefaultClassifierShares, compiled)
	}
}

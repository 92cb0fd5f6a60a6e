package resctrl

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/carve-dra/carve/discovery/cbm"
)

// L3Info is L3 cache allocation as info/L3 describes it.
type L3Info struct {
	// CBMMask is the full capacity bitmask, ShareableBits the ways that
	// other agents (I/O) may use too.
	CBMMask, ShareableBits uint64
	MinCBMBits             int
	NumCLOSIDs             int
}

// ReadL3Info reads info/L3; a filesystem without it has no L3 allocation.
func ReadL3Info(f FS) (L3Info, error) {
	var in L3Info
	read := func(name string, hex bool) (uint64, error) {
		b, err := f.ReadFile("info/L3/" + name)
		if err != nil {
			return 0, fmt.Errorf("resctrl info/L3/%s: %w", name, err)
		}
		s := strings.TrimSpace(string(b))
		base := 10
		if hex {
			base = 16
		}
		v, err := strconv.ParseUint(s, base, 64)
		if err != nil {
			return 0, fmt.Errorf("resctrl info/L3/%s: %q is not a number", name, s)
		}
		return v, nil
	}
	var err error
	if in.CBMMask, err = read("cbm_mask", true); err != nil {
		return in, err
	}
	if !cbm.Contiguous(in.CBMMask) || in.CBMMask&1 == 0 {
		return in, fmt.Errorf("resctrl info/L3/cbm_mask %x is not a run of bits from bit 0", in.CBMMask)
	}
	if in.ShareableBits, err = read("shareable_bits", true); err != nil {
		return in, err
	}
	v, err := read("min_cbm_bits", false)
	if err != nil {
		return in, err
	}
	in.MinCBMBits = max(int(v), 1)
	if v, err = read("num_closids", false); err != nil {
		return in, err
	}
	in.NumCLOSIDs = int(v)
	return in, nil
}

package nvmlinfo

// MemorySlices is the size of the GPU's placement space: the end of its
// furthest placement. It is 0 for a GPU that reports no placements.
func (d Device) MemorySlices() int {
	n := 0
	for _, p := range d.MIGProfiles {
		for _, pl := range p.Placements {
			n = max(n, pl.End())
		}
	}
	return n
}

// MaxDisjoint is the most that any set of pairwise disjoint placements adds
// up to, weighing each placement by its profile's value. It bounds what the
// GPU's memory and multiprocessors counters must hold so that every
// combination the slices allow stays allocatable.
func (d Device) MaxDisjoint(value func(MIGProfile) uint64) uint64 {
	n := d.MemorySlices()
	if n == 0 || n > MaxMemorySlices {
		return 0
	}
	// best[i] is the most the slices from i on can hold.
	best := make([]uint64, n+1)
	for i := n - 1; i >= 0; i-- {
		best[i] = best[i+1]
		for _, p := range d.MIGProfiles {
			for _, pl := range p.Placements {
				if pl.Start == i {
					best[i] = max(best[i], value(p)+best[pl.End()])
				}
			}
		}
	}
	return best[0]
}

package netdev

// KeyByAddress makes p tell every bandwidth share apart by address, as it
// does ipvlan's: where the kernel has no ipvlan, macvlan children (which
// have addresses too) carry the address-keyed path in tests.
func KeyByAddress(p *NICPreparer) { p.addressKeys = true }

// HeldShares is how many shares p counts on parent.
func HeldShares(p *NICPreparer, parent string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held[parent])
}

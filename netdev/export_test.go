package netdev

// KeyByAddress makes p tell every bandwidth share apart by address, as it
// does ipvlan's: where the kernel has no ipvlan, macvlan children (which
// have addresses too) carry the address-keyed path in tests.
func KeyByAddress(p *NICPreparer) { p.addressKeys = true }

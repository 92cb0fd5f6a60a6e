package addrbook

import (
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"strings"
)

const (
	// poolLabel holds the pool's hash: a pool's name need not be a valid
	// label value, and records are listed by pool.
	poolLabel = "carve.dev/address-pool"
	// The record's annotations: what a human reads, and the claim whose
	// deletion frees the address.
	poolAnnotation           = "carve.dev/pool"
	addressAnnotation        = "carve.dev/address"
	claimNamespaceAnnotation = "carve.dev/claim-namespace"
	claimNameAnnotation      = "carve.dev/claim-name"
	claimUIDAnnotation       = "carve.dev/claim-uid"
)

// poolHash is the first 8 bytes of the pool name's SHA-256, hex.
func poolHash(pool string) string {
	sum := sha256.Sum256([]byte(pool))
	return hex.EncodeToString(sum[:8])
}

// recordName is the one name the address of pool may have: a DNS
// subdomain of the hash and the address, its dots and colons dashes.
func recordName(pool string, addr netip.Addr) string {
	a := strings.NewReplacer(".", "-", ":", "-").Replace(addr.StringExpanded())
	return "carve-" + poolHash(pool) + "-" + a
}

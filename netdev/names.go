package netdev

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
)

// Everything netdev creates for a share is named from the share's key, so
// that a share can be found and removed from its allocation alone, after a
// crash that lost the undo record.

// shareHash is the first bytes of the key's SHA-256, in hex.
func shareHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// LinkName is the share's interface name on the node before the hook moves
// it into the pod: "cv" and ten hex digits, within IFNAMSIZ.
func LinkName(key string) string { return "cv" + shareHash(key)[:10] }

// ShareMAC is the share's MAC address: locally administered, unicast, and
// stable, so that the egress classifier can key on it before the pod exists.
func ShareMAC(key string) net.HardwareAddr {
	sum := sha256.Sum256([]byte(key))
	return net.HardwareAddr{0x02, sum[0], sum[1], sum[2], sum[3], sum[4]}
}

// preferredMinor is the HTB class minor a share asks for first; collisions
// move on to the next free one.
func preferredMinor(key string) uint16 {
	sum := sha256.Sum256([]byte(key))
	return minMinor + uint16((uint32(sum[5])<<8|uint32(sum[6]))%uint32(maxMinor-minMinor))
}

// Share classes take minors from 0x10 up; those below are left free. Each
// share takes a block of classBlock minors, aligned: its class, then its
// class's children (flows.go).
const (
	minMinor   uint16 = 0x10
	maxMinor   uint16 = 0xfff0
	classBlock        = 16
)

// Package netdev prepares network claims: a share of a parent NIC given to a
// pod as its own macvlan or ipvlan interface, with its bandwidth held to the
// allocation in both directions. It is, with bpf, the only package that
// calls netlink; the node's network namespace is passed in explicitly.
package netdev

// Package discovery builds an Inventory of the node's hardware (NICs, LLCs,
// FPGAs and the PCI functions of GPUs) by reading sysfs and procfs under a
// root path. The root is "/" in production and a fixture tree in tests, so the
// same code serves both. Discovery only reads; it never writes, and it knows
// nothing of how the inventory is published.
package discovery

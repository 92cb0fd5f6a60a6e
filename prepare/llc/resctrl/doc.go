// Package resctrl reads and writes the kernel's resource control filesystem
// (Intel RDT, AMD PQoS), mounted at <root>/sys/fs/resctrl: groups (one
// CLOSID each), their schemata and tasks. Access goes through FS, so that
// tests can use a fixture that validates writes as the kernel does
// (discovery/sysfstest.ResctrlFS), and the same code drives the real
// filesystem in production.
package resctrl

package llc_test

import "golang.org/x/sys/unix"

func mount(dir string) error { return unix.Mount("resctrl", dir, "resctrl", 0, "") }

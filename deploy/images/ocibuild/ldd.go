package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"strings"
)

// sharedLibs returns the absolute paths of the shared libraries and dynamic
// loader ldd lists for file, so cgo binaries run in the image as on the
// host; nothing for a static binary or a file that is not ELF. ldd, not
// debug/elf: it resolves the search path exactly as the host's loader does.
// Libraries loaded with dlopen are not listed: callers add them with --file.
func sharedLibs(file string) ([]string, error) {
	isELF, err := hasELFMagic(file)
	if err != nil || !isELF {
		return nil, err
	}
	out, err := exec.Command("ldd", file).Output() //nolint:gosec // G204: ldd of a file the caller names to put in the image
	// ldd exits non-zero for a static binary ("not a dynamic executable");
	// what it printed is still the answer. Only a missing ldd is an error.
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return nil, fmt.Errorf("ldd is required to scan %s: %w", file, err)
	}
	libs, missing := parseLdd(string(out))
	if missing != "" {
		return nil, fmt.Errorf("%s needs %s, which ldd cannot find", file, missing)
	}
	return libs, nil
}

// parseLdd reads ldd's lines, which look like
// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
// "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file. missing is
// the first library ldd could not find.
func parseLdd(out string) (libs []string, missing string) {
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		switch {
		case strings.Contains(line, "=> not found"):
			return nil, f[0]
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, path.Clean(f[2]))
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, path.Clean(f[0]))
		}
	}
	return libs, ""
}

// hasELFMagic reports whether file starts with the ELF magic number.
func hasELFMagic(file string) (bool, error) {
	f, err := os.Open(file)
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", file, err)
	}
	defer func() { _ = f.Close() }() // read only
	magic := make([]byte, 4)
	if _, err := io.ReadFull(f, magic); err != nil {
		// Shorter than the magic: not ELF.
		return false, nil
	}
	return bytes.Equal(magic, []byte("\x7fELF")), nil
}

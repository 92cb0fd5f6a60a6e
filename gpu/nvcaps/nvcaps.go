// Package nvcaps makes the /dev/nvidia-caps device nodes a MIG instance's
// capabilities are opened through, as nvidia-modprobe does
// (nvidia_cap_mknod in nvidia-modprobe-utils.c): the driver lists each
// capability in /proc/driver/nvidia/capabilities with its device file's
// minor and mode, and /proc/devices gives the nvidia-caps major. The driver
// makes none of these nodes itself, and the agent's container has no
// nvidia-modprobe to run. NVIDIA's Go libraries kept here do not do it:
// nvidia-container-toolkit's nvcaps is internal and reads only minors, and
// its nvdevices makes the control nodes only, with a fixed mode, keeping any
// file already at the path without a look.
package nvcaps

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Dir is where the nodes are, below the root.
const Dir = "/dev/nvidia-caps"

// capsDir is where the driver lists capabilities, below the root.
const capsDir = "proc/driver/nvidia/capabilities"

// MIG-wide capabilities: creating instances, and reading them.
const (
	Config  = "mig/config"
	Monitor = "mig/monitor"
)

// GPUInstance is the capability of GPU instance gi on the GPU of this minor.
func GPUInstance(gpuMinor int, gi uint32) string {
	return fmt.Sprintf("gpu%d/mig/gi%d/access", gpuMinor, gi)
}

// ComputeInstance is the capability of compute instance ci in GPU instance gi.
func ComputeInstance(gpuMinor int, gi, ci uint32) string {
	return fmt.Sprintf("gpu%d/mig/gi%d/ci%d/access", gpuMinor, gi, ci)
}

// Node is a capability's device node as the driver describes it.
type Node struct {
	// Path is the node's path seen from the host's root:
	// /dev/nvidia-caps/nvidia-cap<minor>.
	Path         string
	Major, Minor uint32
	Mode         os.FileMode
	UID, GID     int
	// Modify: the driver asks that an existing node's mode and owner be
	// set to these (DeviceFileModify: 1), not left as found.
	Modify bool
	// Source is the capability file read.
	Source string
}

// Read describes the capabilities' nodes from the files below root (caps
// relative to /proc/driver/nvidia/capabilities, such as GPUInstance's). It
// makes nothing.
func Read(root string, caps ...string) ([]Node, error) {
	major, err := Major(root)
	if err != nil {
		return nil, err
	}
	out := make([]Node, 0, len(caps))
	for _, c := range caps {
		n, err := readCap(filepath.Join(root, capsDir, c))
		if err != nil {
			return nil, err
		}
		n.Major = major
		out = append(out, n)
	}
	return out, nil
}

// Major is the nvidia-caps character device major from <root>/proc/devices.
func Major(root string) (uint32, error) {
	major, err := CharMajor(root, "nvidia-caps")
	if e := (NoDeviceError{}); errors.As(err, &e) {
		return 0, fmt.Errorf("%w (the driver is not loaded, or is too old for MIG)", err)
	}
	return major, err
}

// NoDeviceError is CharMajor's error where /proc/devices lists no such
// character device: its driver is not loaded.
type NoDeviceError struct{ Path, Name string }

func (e NoDeviceError) Error() string { return e.Path + ": no " + e.Name + " character device" }

// CharMajor is the major of the character device name (its driver's, as
// /proc/devices lists it) from <root>/proc/devices.
func CharMajor(root, name string) (uint32, error) {
	path := filepath.Join(root, "proc/devices")
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("%s major: %w", name, err)
	}
	char := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "Character devices:":
			char = true
		case strings.HasSuffix(line, "devices:"):
			char = false // block devices share the numbers, not the meaning
		case char:
			f := strings.Fields(line)
			if len(f) == 2 && f[1] == name {
				v, err := strconv.ParseUint(f[0], 10, 32)
				if err != nil {
					return 0, fmt.Errorf("%s: %s major %q: %w", path, name, f[0], err)
				}
				return uint32(v), nil
			}
		}
	}
	return 0, NoDeviceError{Path: path, Name: name}
}

// readCap parses a capability file: "Key: value" lines, of which
// DeviceFileMinor and DeviceFileMode must be there.
func readCap(path string) (Node, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Node{}, fmt.Errorf("MIG capability: %w", err)
	}
	vals := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "DeviceFileMinor", "DeviceFileMode", "DeviceFileModify", "DeviceFileUID", "DeviceFileGID":
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return Node{}, fmt.Errorf("MIG capability %s: %s %q is not a number", path, k, v)
			}
			vals[k] = n
		}
	}
	for _, k := range []string{"DeviceFileMinor", "DeviceFileMode"} {
		if _, ok := vals[k]; !ok {
			return Node{}, fmt.Errorf("MIG capability %s: no %s line", path, k)
		}
	}
	if m := vals["DeviceFileMode"]; m&^0o777 != 0 {
		return Node{}, fmt.Errorf("MIG capability %s: DeviceFileMode %d is more than permission bits", path, m)
	}
	minor := uint32(vals["DeviceFileMinor"])
	return Node{Path: fmt.Sprintf("%s/nvidia-cap%d", Dir, minor), Minor: minor, Mode: os.FileMode(vals["DeviceFileMode"]),
		UID: int(vals["DeviceFileUID"]), GID: int(vals["DeviceFileGID"]), Modify: vals["DeviceFileModify"] == 1, Source: path}, nil
}

// Ensure makes the capabilities' nodes below root, reading every file
// first so that bad input makes nothing. A node that is already right is
// kept (its mode and owner set where the driver asks, as nvidia-modprobe
// does); anything else at the path (another kind of file, another device)
// is replaced in one rename; a directory there is an error.
func Ensure(ctx context.Context, root string, caps ...string) ([]Node, error) {
	nodes, err := Read(root, caps...)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, Dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("MIG capability nodes: %w", err)
	}
	for _, n := range nodes {
		if err := ensure(ctx, filepath.Join(root, n.Path), n); err != nil {
			return nil, fmt.Errorf("MIG capability %s: %w", n.Source, err)
		}
	}
	return nodes, nil
}

func ensure(ctx context.Context, path string, n Node) error {
	logger := klog.FromContext(ctx)
	want := unix.Mkdev(n.Major, n.Minor)
	var st unix.Stat_t
	err := unix.Lstat(path, &st)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == want:
		if !n.Modify {
			return nil
		}
		if err := unix.Chmod(path, uint32(n.Mode)); err != nil {
			return fmt.Errorf("mode of %s: %w", path, err)
		}
		if err := unix.Lchown(path, n.UID, n.GID); err != nil {
			return fmt.Errorf("owner of %s: %w", path, err)
		}
		return nil
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return fmt.Errorf("%s is a directory, not device %d:%d; left alone", path, n.Major, n.Minor)
	case err != nil && !errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%s: %w", path, err)
	}
	// Made beside the path and renamed over it: whoever opens the path
	// sees the old file or the whole new node, never a node without its
	// mode.
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%s.carve-%d", filepath.Base(path), os.Getpid()))
	_ = os.Remove(tmp) // a crashed attempt's
	if err := unix.Mknod(tmp, unix.S_IFCHR|uint32(n.Mode), int(want)); err != nil {
		return fmt.Errorf("mknod %s c %d %d: %w", path, n.Major, n.Minor, err)
	}
	err = unix.Chmod(tmp, uint32(n.Mode)) // mknod's mode is less the umask
	if err == nil {
		err = unix.Lchown(tmp, n.UID, n.GID)
	}
	if err == nil {
		err = unix.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("device node %s: %w", path, err)
	}
	what := "Made"
	if st.Mode != 0 {
		what = "Replaced"
	}
	logger.Info(what+" a MIG capability device node", "path", path, "major", n.Major, "minor", n.Minor, "mode", n.Mode, "wasMode", fmt.Sprintf("%#o", st.Mode))
	return nil
}

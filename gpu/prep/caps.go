package prep

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// migCapNodes are the /dev/nvidia-caps nodes that give access to the GPU
// instance and its compute instance: the driver lists each one's minor in
// /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<id>[/ci<id>]/access.
func (p *Preparer) migCapNodes(rec migRecord) ([]*cdispec.DeviceNode, error) {
	base := filepath.Join("proc/driver/nvidia/capabilities", fmt.Sprintf("gpu%d", rec.ParentMinor), "mig", fmt.Sprintf("gi%d", rec.GPUInstanceID))
	var nodes []*cdispec.DeviceNode
	for _, rel := range []string{base, filepath.Join(base, fmt.Sprintf("ci%d", rec.ComputeInstanceID))} {
		minor, err := capMinor(filepath.Join(p.opts.Root, rel, "access"))
		if err != nil {
			return nil, err
		}
		node, err := p.deviceNode(fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor))
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, node)
	}
	return nodes, nil
}

// capMinor reads "DeviceFileMinor: N" from a capability's access file.
func capMinor(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("MIG capability: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "DeviceFileMinor:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < 0 {
				return 0, fmt.Errorf("MIG capability %s: DeviceFileMinor %q is not a minor number", path, strings.TrimSpace(v))
			}
			return n, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("MIG capability %s: %w", path, err)
	}
	return 0, fmt.Errorf("MIG capability %s: no DeviceFileMinor line", path)
}

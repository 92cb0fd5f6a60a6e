package bpf

import (
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
)

// Learned lists the MACs the classifier learned from pods' frames (a pod
// that changed its interface's MAC), each with the MAC of the share it
// belongs to: traffic towards them is shaped as that share's ingress.
func (s *Shaper) Learned() (map[string]string, error) {
	out := map[string]string{}
	var k, v shaperLearnedKey
	it := s.objs.LearnedMacs.Iterate()
	for it.Next(&k, &v) {
		out[net.HardwareAddr(k.Mac[:]).String()] = net.HardwareAddr(v.Mac[:]).String()
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read learned MACs: %w", err)
	}
	return out, nil
}

// forgetLearned removes every MAC learned for the share named by mac.
func (s *Shaper) forgetLearned(mac net.HardwareAddr) error {
	learned, err := s.Learned()
	if err != nil {
		return err
	}
	for m, owner := range learned {
		if owner != mac.String() {
			continue
		}
		hw, _ := net.ParseMAC(m)
		var k shaperLearnedKey
		copy(k.Mac[:], hw)
		if err := s.objs.LearnedMacs.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("forget MAC %s learned for share %s: %w", m, mac, err)
		}
	}
	return nil
}

package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
)

// forceSocketNetnsCookie makes OpenShaper load the classifier as for a
// kernel whose tc programs lack bpf_get_netns_cookie; tests set it to cover
// that path on kernels that have the helper.
var forceSocketNetnsCookie = false

// setNetnsCookieSource clears shaper.c's tc_netns_cookie where tc programs
// cannot call bpf_get_netns_cookie (before Linux 6.15), so that the
// classifier reads the sending socket's netns cookie itself (shaper.c,
// netns_cookie). It reports whether the helper is used.
func setNetnsCookieSource(spec *ebpf.CollectionSpec) (helper bool, err error) {
	helper = !forceSocketNetnsCookie
	if helper {
		switch err := features.HaveProgramHelper(ebpf.SchedCLS, asm.FnGetNetnsCookie); {
		case errors.Is(err, ebpf.ErrNotSupported):
			helper = false
		case err != nil:
			return false, fmt.Errorf("probe bpf_get_netns_cookie in tc programs: %w", err)
		}
	}
	v, ok := spec.Variables["tc_netns_cookie"]
	if !ok {
		return false, errors.New("the classifier has no variable tc_netns_cookie")
	}
	var set uint8
	if helper {
		set = 1
	}
	if err := v.Set(set); err != nil {
		return false, fmt.Errorf("set tc_netns_cookie: %w", err)
	}
	return helper, nil
}

package hook_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-dra/carve/prepare/hook"
)

// A container that may reshape its pod's network (CAP_NET_ADMIN or
// CAP_SYS_ADMIN in any of its capability sets; a privileged container has
// every one) does not get a NIC share unless its class allows it: the hook
// fails, so the runtime does not start the container, and says which
// option would allow it. Nothing is attached first.
func TestHookRefusesNetAdmin(t *testing.T) {
	root := t.TempDir()
	bundle := "/run/containerd/io.containerd.runtime.v2.task/k8s.io/c1"
	must(t, os.MkdirAll(filepath.Join(root, bundle), 0o755))
	writeBundle := func(caps string) {
		t.Helper()
		must(t, os.WriteFile(filepath.Join(root, bundle, "config.json"), []byte(`{"ociVersion":"1.2.0","process":{"capabilities":`+caps+`}}`), 0o644))
	}
	specFile := filepath.Join(t.TempDir(), "spec.json")
	writeSpec := func(allow bool) {
		t.Helper()
		b, err := json.Marshal(hook.AttachSpec{HostName: "cvtest", PodName: "net1", AllowNetAdmin: allow})
		must(t, err)
		must(t, os.WriteFile(specFile, b, 0o600))
	}
	// A pid no process has: past the check, the hook fails finding it.
	state := `{"ociVersion":"1.2.0","id":"c1","status":"created","pid":2147483000,"bundle":"` + bundle + `"}`
	runtimeDefault := `["CAP_CHOWN","CAP_DAC_OVERRIDE","CAP_FSETID","CAP_FOWNER","CAP_MKNOD","CAP_NET_RAW","CAP_SETGID","CAP_SETUID","CAP_SETFCAP","CAP_SETPCAP","CAP_NET_BIND_SERVICE","CAP_SYS_CHROOT","CAP_KILL","CAP_AUDIT_WRITE"]`
	for _, c := range []struct {
		name, caps string
		allow      bool
		refused    string // the capability named, "" where it passes the check
	}{
		{"the runtime's default set", `{"bounding":` + runtimeDefault + `,"effective":` + runtimeDefault + `,"permitted":` + runtimeDefault + `}`, false, ""},
		{"empty sets", `{}`, false, ""},
		{"NET_ADMIN added", `{"bounding":["CAP_NET_ADMIN"],"effective":["CAP_NET_ADMIN"],"permitted":["CAP_NET_ADMIN"]}`, false, "CAP_NET_ADMIN"},
		{"SYS_ADMIN in the bounding set only", `{"bounding":["CAP_CHOWN","CAP_SYS_ADMIN"]}`, false, "CAP_SYS_ADMIN"},
		{"NET_ADMIN as an ambient capability", `{"ambient":["CAP_NET_ADMIN"]}`, false, "CAP_NET_ADMIN"},
		{"NET_ADMIN, the class allowing it", `{"effective":["CAP_NET_ADMIN"]}`, true, ""},
	} {
		writeBundle(c.caps)
		writeSpec(c.allow)
		err := hook.RunAttach(specFile, root, strings.NewReader(state))
		if err == nil {
			t.Fatalf("%s: the hook attached to a pid no process has", c.name)
		}
		refused := strings.Contains(err.Error(), "allowNetAdmin")
		if want := c.refused != ""; refused != want || (want && !strings.Contains(err.Error(), "container c1 has "+c.refused)) {
			t.Errorf("%s: %v; refused for %q", c.name, err, c.refused)
		}
	}
	// A bundle without a capability list: runc then drops none.
	writeSpec(false)
	must(t, os.WriteFile(filepath.Join(root, bundle, "config.json"), []byte(`{"ociVersion":"1.2.0","process":{"args":["sh"]}}`), 0o644))
	if err := hook.RunAttach(specFile, root, strings.NewReader(state)); err == nil || !strings.Contains(err.Error(), "has CAP_NET_ADMIN") {
		t.Errorf("no capability list: %v", err)
	}
	// Without the bundle nothing says what the container may do.
	must(t, os.Remove(filepath.Join(root, bundle, "config.json")))
	if err := hook.RunAttach(specFile, root, strings.NewReader(state)); err == nil || !strings.Contains(err.Error(), "for its capabilities") {
		t.Errorf("no bundle: %v", err)
	}
}

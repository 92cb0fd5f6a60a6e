package hook_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/carve-dra/carve/prepare/hook"
)

// FuzzContainerPID reads the OCI state the runtime gives a hook on stdin.
// A pid it returns is positive, from stdin that is one JSON document and
// nothing after it, and survives an encode and a read again; anything else
// is an error that says it is the OCI state.
func FuzzContainerPID(f *testing.F) {
	for _, s := range []string{
		`{"ociVersion":"1.2.0","id":"c1","status":"created","pid":4242,"bundle":"/b","annotations":{"a":"b"}}`,
		`{"pid":1}`, `{"pid":0}`, `{"pid":-1}`, `{"pid":4194304}`, `{"pid":9223372036854775807}`,
		`{"pid":9223372036854775808}`, `{"pid":1e3}`, `{"pid":"12"}`, `{"pid":12,"pid":-12}`, `{"PID":7}`,
		`{"pid":5} trailing`, `{"id":"\u0000\n\u001b[2J","status":"x"}`, `[]`, `null`, ``,
		strings.Repeat(`{"a":`, 5000) + `1` + strings.Repeat(`}`, 5000),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		pid, err := hook.ContainerPID(bytes.NewReader(in))
		if err != nil {
			if pid != 0 || !strings.Contains(err.Error(), "OCI state on stdin") {
				t.Fatalf("ContainerPID(%q) = %d, %v", in, pid, err)
			}
			return
		}
		if pid <= 0 {
			t.Fatalf("ContainerPID(%q) = %d without an error", in, pid)
		}
		// The whole of stdin is one JSON document: nothing trails it.
		if !json.Valid(in) {
			t.Fatalf("ContainerPID(%q) = %d: stdin is not one JSON document", in, pid)
		}
		b, err := json.Marshal(specs.State{Version: specs.Version, ID: "c", Status: specs.StateCreated, Pid: pid, Bundle: "/b"})
		if err != nil {
			t.Fatal(err)
		}
		if again, err := hook.ContainerPID(bytes.NewReader(b)); err != nil || again != pid {
			t.Fatalf("pid %d from %q reads back as %d, %v", pid, in, again, err)
		}
	})
}

// FuzzReadAttachSpec reads an attach spec file of any content. A spec it
// reads writes (WriteAttachSpec) and reads back the same; an error names
// the file.
func FuzzReadAttachSpec(f *testing.F) {
	full, err := json.Marshal(hook.AttachSpec{ClaimUID: "u", Request: "r", Device: "d", ShareID: "s", BootID: "b",
		HostName: "cv1a2b3c", Parent: "eth1", Kind: "macvlan", Mode: "vepa", VLAN: 7, PodName: "net1", MTU: 1500,
		MAC: "02:00:00:00:00:01", Addresses: []string{"10.0.0.5/24"}, Routes: []hook.Route{{Destination: "default", Gateway: "10.0.0.1"}},
		PodShare: &hook.PodShareSpec{PinDir: "/sys/fs/bpf/carve", ParentIndex: 3, ClassID: 0x10002}})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		string(full), `{}`, `{"hostName":"a","hostName":"b"}`, `{"mtu":-1,"vlan":99999999999999999999}`,
		`{"podName":"../../etc","routes":[{}],"podShare":{"classID":-1}}`, `{"addresses":[],"routes":null,"podShare":null}`,
		`{"hostName":"\u0000\n"}`, `{"unknown":1}`, `[]`, `null`, ``, "\xff\xfe",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, "cv1.json")
		if err := os.WriteFile(path, content, 0o644); err != nil {
			t.Fatal(err)
		}
		spec, err := hook.ReadAttachSpec(path)
		if err != nil {
			if !strings.Contains(err.Error(), "attach spec "+path) {
				t.Fatalf("the error does not name the file: %v", err)
			}
			return
		}
		want, err := json.Marshal(spec)
		if err != nil {
			t.Fatalf("encode %+v: %v", spec, err)
		}
		again := filepath.Join(dir, "again.json")
		if err := hook.WriteAttachSpec(again, spec); err != nil {
			t.Fatalf("write back %+v: %v", spec, err)
		}
		back, err := hook.ReadAttachSpec(again)
		if err != nil {
			t.Fatalf("the spec written from %q does not read: %v", content, err)
		}
		if got, _ := json.Marshal(back); !bytes.Equal(got, want) {
			t.Fatalf("round trip changed the spec:\n%s\n%s", want, got)
		}
	})
}

// FuzzMain runs the hook's command line with any arguments, NUL-separated
// in argv, and an OCI state that has no pid, so that no hook ever reaches
// the kernel (netlink, resctrl, cgroup writes): each stops at its flags, its
// spec or the state. Main never panics, never succeeds, exits 2 for a
// command line it cannot use and 1 for a hook that failed, and says why.
// A --spec naming an existing file outside the test's directory is not run
// (it could be a FIFO or /dev/zero).
func FuzzMain(f *testing.F) {
	for _, args := range [][]string{
		nil, {""}, {"bogus"}, {"-h"}, {"netns-attach"}, {"netns-attach", "-h"},
		{"netns-attach", "--spec", "SPEC"}, {"netns-attach", "--spec=SPEC", "--root", "/nonexistent"},
		{"netns-attach", "--spec", "/nonexistent/cv1.json"}, {"netns-attach", "--spec", "SPEC", "extra"},
		{"netns-attach", "--spec", "SPEC", "--", "--spec"}, {"netns-attach", "---spec", "x"}, {"netns-attach", "--spec"},
		{"resctrl-attach"}, {"resctrl-attach", "--group", ".."}, {"resctrl-attach", "--group", "g", "--resctrl", "/nonexistent"},
		{"dmem-limit", "--region", "nvidia/0000:01:00.0/vidmem", "--max", "1073741824", "--min", "2147483648"},
		{"dmem-limit", "--region", "r", "--max", "-1"}, {"dmem-limit", "--region", "r", "--max", "18446744073709551616"},
		{"dmem-limit", "--region", "r", "--max", "0x10", "--record", ""}, {"dmem-limit", "--max=1", "--region=\n"},
		{"dmem-limit", "--bogus"}, {"dmem-limit", "--max", "1", "--max", "2"},
	} {
		f.Add(strings.Join(args, "\x00"), []byte(`{"ociVersion":"1.2.0","id":"c1","status":"creating"}`))
	}
	f.Fuzz(func(t *testing.T, argv string, state []byte) {
		dir := t.TempDir()
		spec := filepath.Join(dir, "cv1.json")
		if err := hook.WriteAttachSpec(spec, hook.AttachSpec{HostName: "cv1", PodName: "net1"}); err != nil {
			t.Fatal(err)
		}
		var args []string
		if argv != "" {
			args = strings.Split(strings.ReplaceAll(argv, "SPEC", spec), "\x00")
		}
		// Whatever the state says, it carries no pid: the hooks stop there.
		var s map[string]any
		if json.Unmarshal(state, &s) == nil {
			delete(s, "pid")
			for k := range s {
				if strings.EqualFold(k, "pid") {
					delete(s, k)
				}
			}
			state, _ = json.Marshal(s)
		}
		if _, err := hook.ContainerPID(bytes.NewReader(state)); err == nil {
			return // a pid in a form the map missed: not run
		}
		if len(args) > 0 && args[0] == "netns-attach" {
			_, fs, err := hook.Command("netns-attach")
			if err != nil {
				t.Fatal(err)
			}
			fs.SetOutput(new(bytes.Buffer))
			if fs.Parse(args[1:]) == nil {
				if p := fs.Lookup("spec").Value.String(); p != "" && !strings.HasPrefix(filepath.Clean(p), dir+"/") {
					if _, err := os.Lstat(p); err == nil {
						return
					}
				}
			}
		}
		var stderr bytes.Buffer
		code := hook.Main(args, bytes.NewReader(state), &stderr)
		if code != 1 && code != 2 {
			t.Fatalf("Main(%q) = %d with an OCI state without a pid (%s)", args, code, stderr.String())
		}
		if stderr.Len() == 0 {
			t.Fatalf("Main(%q) = %d, saying nothing", args, code)
		}
		if code == 1 && !strings.HasPrefix(stderr.String(), "carve-hook "+args[0]+": ") {
			t.Fatalf("Main(%q) failed without naming the hook: %q", args, stderr.String())
		}
	})
}

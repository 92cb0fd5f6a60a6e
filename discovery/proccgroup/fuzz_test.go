package proccgroup_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/carve-dra/carve/discovery/proccgroup"
)

// format writes entries back as /proc/<pid>/cgroup lines.
func format(entries []proccgroup.Entry) string {
	var b strings.Builder
	for _, e := range entries {
		fmt.Fprintf(&b, "%d:%s:%s\n", e.Hierarchy, strings.Join(e.Controllers, ","), e.Path)
	}
	return b.String()
}

// FuzzParse parses /proc/<pid>/cgroup of any content. A process names its
// own cgroups where it may create them (a delegated cgroup v2 subtree):
// their names, in the path, are the tenant's, with ':' and ',' in them.
// What parses is one entry per non-empty line, written back and parsed to
// the same; an error names the line.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"12:cpu,cpuacct:/kubepods/pod1\n1:name=systemd:/kubepods/pod1/c\n0::/kubepods.slice/kubepods-pod1.slice/cri-c.scope\n",
		"0::/\n", "0::/a:b:c,d\n", "0::\n", "0:,:/x\n", "\n\n0::/a", "+1::/a\n", "-0::/a\n", "01::/a\n",
		"9223372036854775807::/a\n", "9223372036854775808::/a\n", "-1::/a\n", "0:/a\n", "garbage", "0::/a\r\n",
		"0::/kubepods/podaaaaaaaa-0000-0000-0000-000000000001/ctr/evil\n0::/kubepods/podbbbbbbbb-0000-0000-0000-000000000002\n",
		"0::/\x00\x1b[2J\n", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		entries, err := proccgroup.Parse(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "cgroup line ") {
				t.Fatalf("Parse(%q): %v does not name the line", s, err)
			}
			return
		}
		lines := 0
		for _, l := range strings.Split(s, "\n") {
			if l != "" {
				lines++
			}
		}
		if len(entries) != lines {
			t.Fatalf("Parse(%q): %d entries of %d lines", s, len(entries), lines)
		}
		for _, e := range entries {
			if e.Hierarchy < 0 || strings.Contains(e.Path, "\n") || (e.Controllers != nil && len(e.Controllers) == 0) {
				t.Fatalf("Parse(%q): entry %+v", s, e)
			}
		}
		again, err := proccgroup.Parse(format(entries))
		if err != nil || !reflect.DeepEqual(again, entries) {
			t.Fatalf("round trip of %q: %+v then %+v (%v)", s, entries, again, err)
		}
		// The unified path is the first v2 entry's, whatever follows.
		u := proccgroup.Unified(entries)
		for _, e := range entries {
			if e.Hierarchy == 0 && len(e.Controllers) == 0 {
				if u != e.Path {
					t.Fatalf("Unified(%q) = %q, the first v2 entry is %q", s, u, e.Path)
				}
				return
			}
		}
		if u != "" {
			t.Fatalf("Unified(%q) = %q with no v2 entry", s, u)
		}
	})
}

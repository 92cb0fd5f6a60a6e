package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// `carve shares` against shares the agent prepared for real: it lists each
// with its allocation and says it is enforced, and exits non-zero, naming
// the share, once one of its classes is gone.
func TestSharesCommandOnPreparedShares(t *testing.T) {
	cs := client(t)
	ctx := context.Background()
	h := newAgentHost(t, cs, "e2e-shares")
	h.start()
	waitSlices(t, cs, h)
	plugin := h.register(ctx)
	defer plugin.Close()
	c1 := makeClaim(t, cs, h.node, "shares-c1", alloc{request: "net", device: "nic-0000-17-00-0", share: true, egress: "100M", ingress: "50M"})
	c2 := makeClaim(t, cs, h.node, "shares-c2", alloc{request: "net", device: "nic-0000-17-00-0", share: true, egress: "200M"})
	if _, err := plugin.Prepare(ctx, c1, c2); err != nil {
		t.Fatalf("prepare: %v\n%s", err, h.logs)
	}
	ns := filepath.Base(h.netns)
	run := func() ([]map[string]any, error) {
		// nsenter, not ip netns exec: that remounts /sys, hiding bpffs.
		cmd := exec.Command("nsenter", "--net="+h.netns, carveBinary(t), "shares", "--state-dir", h.path("state"),
			"--bpf-pin-dir", h.pins, "--interval", "200ms", "-o", "json")
		out, err := cmd.Output()
		var rows []map[string]any
		if jerr := json.Unmarshal(out, &rows); jerr != nil {
			t.Fatalf("carve shares -o json: %v (%v)\n%s", jerr, err, out)
		}
		return rows, err
	}
	rows, err := run()
	if err != nil {
		t.Fatalf("carve shares with every share enforced: %v\n%v", err, rows)
	}
	byClaim := map[string]map[string]any{}
	for _, r := range rows {
		for _, field := range []string{"claim", "shareID", "parent", "interface", "egressBandwidth", "ingressBandwidth", "egressRate", "ingressRate", "drops", "enforced"} {
			if _, ok := r[field]; !ok {
				t.Errorf("row %v lacks %q", r, field)
			}
		}
		if claim, _ := r["claim"].(string); claim != "" {
			byClaim[claim] = r
		}
	}
	want := map[string][2]float64{"default/shares-c1": {100e6, 50e6}, "default/shares-c2": {200e6, 0}}
	for claim, bw := range want {
		r, ok := byClaim[claim]
		if !ok {
			t.Errorf("carve shares does not list %s: %v", claim, rows)
			continue
		}
		if r["parent"] != "ens1f0np0" || r["egressBandwidth"] != bw[0] || r["ingressBandwidth"] != bw[1] || r["enforced"] != true {
			t.Errorf("%s: %v, want parent ens1f0np0, egress %g, ingress %g, enforced", claim, r, bw[0], bw[1])
		}
		if id, _ := r["shareID"].(string); id == "" {
			t.Errorf("%s: no shareID: %v", claim, r)
		}
	}

	// Take c2's egress class away behind the agent's back, from the
	// parent's egress shaper (cveg<the parent's ifindex>).
	link, err := exec.Command("ip", "-n", ns, "-o", "link", "show", "ens1f0np0").Output()
	if err != nil {
		t.Fatalf("the parent in %s: %v", ns, err)
	}
	shaper := "cveg" + strings.SplitN(string(link), ":", 2)[0]
	out, _ := exec.Command("ip", "netns", "exec", ns, "tc", "class", "show", "dev", shaper).Output()
	var classes []string
	for _, line := range strings.Split(string(out), "\n") {
		// The shares' classes, under the link class 1:1; their flow
		// children (where the kernel has no fq_codel) are under them.
		if f := strings.Fields(line); len(f) > 4 && f[0] == "class" && f[1] == "htb" && strings.HasPrefix(f[2], "1:") && f[3] == "parent" && f[4] == "1:1" {
			classes = append(classes, f[2])
		}
	}
	if len(classes) != 2 {
		t.Fatalf("HTB classes on %s: %v, want one per share\n%s", shaper, classes, out)
	}
	victim := ""
	for _, c := range classes {
		// The 200M class: tc prints its rate.
		if strings.Contains(classLine(string(out), c), "200Mbit") {
			victim = c
		}
	}
	if victim == "" {
		t.Fatalf("no 200Mbit class among %v\n%s", classes, out)
	}
	// Its children first: a class with children cannot go.
	var gone []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[0] == "class" && f[3] == "parent" && f[4] == victim {
			gone = append(gone, f[2])
		}
	}
	for _, c := range append(gone, victim) {
		if out, err := exec.Command("ip", "netns", "exec", ns, "tc", "class", "del", "dev", shaper, "classid", c).CombinedOutput(); err != nil {
			t.Fatalf("tc class del %s: %v\n%s", c, err, out)
		}
	}
	rows, err = run()
	if err == nil {
		t.Errorf("carve shares exited 0 with a share's class gone: %v", rows)
	}
	for _, r := range rows {
		enforced, _ := r["enforced"].(bool)
		if claim := r["claim"]; (claim == "default/shares-c2") == enforced {
			t.Errorf("%s: enforced=%v after c2's class was removed", claim, enforced)
		}
	}
}

// classLine is tc's line for class id.
func classLine(out, id string) string {
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "class htb "+id+" ") {
			return line
		}
	}
	return ""
}

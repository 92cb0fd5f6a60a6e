package acceptance

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

const gib = uint64(1) << 30

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func TestVerdicts(t *testing.T) {
	killedFast := []Sample{{ms(0), 8 * gib}, {ms(10), 16 * gib}, {ms(60), 16 * gib}, {ms(90), 8 * gib}}
	if r := Held("two", 10*gib, killedFast, false, true); !r.Passed || r.Most != 16*gib || r.OverFor != ms(80) {
		t.Errorf("killed in 80 ms: %+v", r)
	}
	slow := []Sample{{ms(0), 12 * gib}, {ms(150), 12 * gib}, {ms(250), 12 * gib}}
	if r := Held("slow", 10*gib, slow, false, true); r.Passed || !strings.HasPrefix(r.Outcome, "NOT HELD") {
		t.Errorf("over 250 ms passed: %+v", r)
	}
	if r := Held("refused", 10*gib, []Sample{{0, gib}}, true, false); !r.Passed {
		t.Errorf("refused: %+v", r)
	}
	if r := Held("kept", 10*gib, []Sample{{0, 12 * gib}, {ms(100), 9 * gib}}, false, false); r.Passed {
		t.Errorf("over, neither refused nor killed, passed: %+v", r)
	}
	if r := Allowed("8", 10*gib, []Sample{{0, 8 * gib}}, true); !r.Passed {
		t.Errorf("allowed: %+v", r)
	}
	if r := Allowed("8", 10*gib, []Sample{{0, 8 * gib}}, false); r.Passed {
		t.Errorf("a refused allowed attack passed: %+v", r)
	}
}

func TestTable(t *testing.T) {
	var b bytes.Buffer
	ok := Table(&b, []Row{
		{Attack: "a", Outcome: "held: process killed in time", Most: 16 * gib, OverFor: ms(80), Passed: true},
	})
	if !ok || !strings.Contains(b.String(), "16384 MiB") || !strings.Contains(b.String(), "80ms") {
		t.Errorf("table (ok=%v):\n%s", ok, b.String())
	}
	if Table(&b, []Row{{Attack: "x", Outcome: "NOT HELD"}}) || Table(&b, []Row{{Attack: "skips MPS", Outcome: "NOT HELD: over its slice for 2s", Most: 12 * gib}}) {
		t.Error("a failed row passed the table")
	}
	if p := strings.Join(Plan(true, false, 1001), "\n"); !strings.Contains(p, "compute mode Default: held only if policing kills it") ||
		!strings.Contains(p, "its mode is never changed") || !strings.Contains(p, "as uid 1001") || !strings.Contains(p, "MPS probe: a 4 GiB share of GPU 0 through carve's preparer") {
		t.Errorf("plan with the modes kept: %q", p)
	}
	if p := strings.Join(Plan(false, true, 1001), "\n"); !strings.Contains(p, "off again after") {
		t.Errorf("plan with MIG turned on: %q", p)
	}
}

package slices

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestAppendIndentAsJSONIndent holds appendIndent to json.Indent on what
// json.Marshal writes: nesting, empty objects and arrays (also nested),
// and strings holding brackets, commas, colons, quotes and backslashes.
func TestAppendIndentAsJSONIndent(t *testing.T) {
	for _, v := range []any{
		map[string]any{},
		[]any{},
		map[string]any{"a": []any{}, "b": map[string]any{}, "c": []any{[]any{}, map[string]any{"x": []any{}}}},
		[]any{1, -2.5, true, false, nil, "s"},
		map[string]any{`k{[,:"]}`: `v\"{,}[:]\\`, "esc\\": "\\", "q": `"`, "u": "\u2028<&>\x01", "": ""},
		map[string]any{"deep": map[string]any{"er": map[string]any{"est": []any{1, map[string]any{"a": "b"}}}}},
		"top-level string with \\\" inside",
		3,
	} {
		src, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		for _, prefix := range []string{"", "    "} {
			var want bytes.Buffer
			if err := json.Indent(&want, src, prefix, "  "); err != nil {
				t.Fatal(err)
			}
			if got := appendIndent([]byte("head"), src, prefix, "  "); string(got) != "head"+want.String() {
				t.Errorf("appendIndent(%s, %q):\n%s\nwant\n%s", src, prefix, got, want.String())
			}
		}
	}
}

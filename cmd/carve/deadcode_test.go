package main

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// buildTags is the line of the file buildtags that is not a comment: the
// tags `make build` builds carve with.
func buildTags() (string, error) {
	raw, err := os.ReadFile("buildtags")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			return line, nil
		}
	}
	return "", fmt.Errorf("buildtags: no tags")
}

// mappedBudget bounds the binary's text, rodata and pclntab: the agent maps
// them, and on a kernel that keeps a freshly written file in large folios
// (ext4, 6.x) nearly all of them are resident, so they are most of its RSS
// (41 MB of them in 58 MB at the time of writing; 64 MB when the linker
// kept every exported method).
const mappedBudget = 46_000_000

// TestDeadCode checks that the linker drops the methods nothing calls: it
// cannot where something reachable looks methods up by a name known only at
// run time (text/template's Execute, reached through golang.org/x/net/trace
// without the grpcnotrace tag), and it then keeps, among others, every typed
// client of client-go's clientset, which carve never calls.
func TestDeadCode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildCarve(t)
	out, err := exec.Command("go", "tool", "nm", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool nm: %v\n%s", err, out)
	}
	syms := string(out)
	for _, unused := range []string{
		"k8s.io/client-go/kubernetes/typed/apps/v1.(*AppsV1Client).Deployments",
		"k8s.io/client-go/kubernetes/typed/batch/v1.(*BatchV1Client).Jobs",
	} {
		if strings.Contains(syms, " "+unused+"\n") {
			var why []string
			for _, marker := range []string{"text/template.(*state).evalField", "golang.org/x/net/trace.New"} {
				if strings.Contains(syms, " "+marker+"\n") {
					why = append(why, marker)
				}
			}
			t.Errorf("the binary keeps %s, which nothing calls: the linker keeps every exported method (reachable: %v); see cmd/carve/buildtags", unused, why)
		}
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var mapped uint64
	for _, name := range []string{".text", ".rodata", ".gopclntab"} {
		s := f.Section(name)
		if s == nil {
			t.Fatalf("the binary has no %s section", name)
		}
		mapped += s.Size
	}
	t.Logf("text, rodata and pclntab: %.1f MB", float64(mapped)/1e6)
	if mapped > mappedBudget {
		t.Errorf("text, rodata and pclntab are %.1f MB, over the budget of %.1f MB: the agent maps them, and they are most of its RSS", float64(mapped)/1e6, float64(mappedBudget)/1e6)
	}
}

package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The binary, the chart and the changelog name one version: the chart's
// version and appVersion (its image tags' default) are the binary's, and
// the changelog has an entry for it or lists it as unreleased.
func TestVersionsAgree(t *testing.T) {
	chart, err := os.ReadFile("../../deploy/chart/carve/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"version", "appVersion"} {
		m := regexp.MustCompile(`(?m)^` + key + `:\s*"?([^"\s]+)"?\s*$`).FindSubmatch(chart)
		if m == nil || string(m[1]) != version {
			t.Errorf("Chart.yaml %s: %q, want the binary's %q", key, m, version)
		}
	}
	changelog, err := os.ReadFile("../../deploy/CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(changelog), "## ["+version+"]") {
		t.Errorf("deploy/CHANGELOG.md has no entry for %s", version)
	}
}

// `carve version` and `carve --version` print the same line: the version,
// the commit the toolchain recorded, the build date where `make release`
// set one.
func TestVersionCommand(t *testing.T) {
	out, stderr, code := runCarve(t, "", "version")
	if code != 0 || !regexp.MustCompile(`^carve v`+regexp.QuoteMeta(version)+`, commit ([0-9a-f]{40}|unknown)(-modified)?, built \S+, go\S+ \S+/\S+\n$`).MatchString(out) {
		t.Fatalf("carve version: exit %d, %q, stderr %s", code, out, stderr)
	}
	flag, _, code := runCarve(t, "", "--version")
	if code != 0 || flag != out {
		t.Errorf("carve --version: exit %d, %q; want %q", code, flag, out)
	}
}

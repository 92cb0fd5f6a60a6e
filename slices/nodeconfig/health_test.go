package nodeconfig_test

import (
	"strings"
	"testing"
	"time"

	"github.com/carve-dra/carve/slices/nodeconfig"
)

func TestHealthConfig(t *testing.T) {
	cfg, err := nodeconfig.Decode([]byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\n"))
	if err != nil {
		t.Fatal(err)
	}
	if hd, maxHD := cfg.Health.HoldDownOrDefault(); hd != 30*time.Second || maxHD != 240*time.Second {
		t.Errorf("defaults %v %v, want 30s and 4m", hd, maxHD)
	}
	if e := cfg.Health.Effect("degraded", "LinkDown"); e != "NoSchedule" {
		t.Errorf("degraded default %s", e)
	}
	if e := cfg.Health.Effect("lost", "DeviceGone"); e != "NoExecute" {
		t.Errorf("lost default %s", e)
	}
	cfg, err = nodeconfig.Decode([]byte(`apiVersion: carve.dev/v1alpha1
kind: NodeConfig
health: {holdDown: 2s, maxHoldDown: 10s, effects: {degraded: None}, reasons: {LinkDown: NoExecute}, errorsPerSecond: -1}
`))
	if err != nil {
		t.Fatal(err)
	}
	if hd, maxHD := cfg.Health.HoldDownOrDefault(); hd != 2*time.Second || maxHD != 10*time.Second {
		t.Errorf("%v %v", hd, maxHD)
	}
	if cfg.Health.Effect("degraded", "LinkDown") != "NoExecute" || cfg.Health.Effect("degraded", "ErrorRate") != "None" || cfg.Health.ErrorRate() != 0 {
		t.Errorf("overrides not applied: %+v", cfg.Health)
	}
	for bad, want := range map[string]string{
		`{holdDown: soon}`:                  "health.holdDown",
		`{holdDown: 10s, maxHoldDown: 5s}`:  "health.maxHoldDown",
		`{effects: {broken: NoSchedule}}`:   "health.effects[broken]",
		`{effects: {lost: Evict}}`:          "health.effects[lost]",
		`{reasons: {"not a value!": None}}`: "health.reasons",
		`{reasons: {LinkDown: NoExecuteX}}`: "health.reasons[LinkDown]",
	} {
		_, err := nodeconfig.Decode([]byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\nhealth: " + bad + "\n"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("health %s: %v, want an error naming %s", bad, err, want)
		}
	}
}

package prepare

import (
	"encoding/json"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/carve-dra/carve/slices/names"
)

// A claim adds variables to its devices' environment, but none that
// changes what code a container loads or runs, unless its class lists the
// name in claimEnv; a class that lists names lets its claims set only
// those. The class's own env is the admin's and may set any.
func TestClaimEnvPolicy(t *testing.T) {
	cfg := func(source resourceapi.AllocationConfigSource, body string) resourceapi.DeviceAllocationConfiguration {
		raw := []byte(`{"apiVersion":"carve.dev/v1alpha1","kind":"DeviceConfig",` + body + `}`)
		return resourceapi.DeviceAllocationConfiguration{Source: source, DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: fuzzDriver, Parameters: runtime.RawExtension{Raw: raw}}}}
	}
	class := func(body string) resourceapi.DeviceAllocationConfiguration {
		return cfg(resourceapi.AllocationConfigSourceClass, body)
	}
	claim := func(body string) resourceapi.DeviceAllocationConfiguration {
		return cfg(resourceapi.AllocationConfigSourceClaim, body)
	}
	// Every family, in its issue's spelling and a few of its members.
	for _, name := range []string{"LD_PRELOAD", "ld_library_path", "LD_AUDIT", "CUDA_INJECTION64_PATH", "NCCL_NET_PLUGIN",
		"NCCL_TUNER_PLUGIN", "nccl_profiler_plugin", "PYTHONPATH", "PYTHONSTARTUP", "NODE_OPTIONS", "JAVA_TOOL_OPTIONS",
		"_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "BASH_ENV", "ENV", "PATH", "PERL5OPT", "RUBYOPT", "GLIBC_TUNABLES",
		"MALLOC_CHECK_", "GCONV_PATH", "SHELLOPTS", "PS4", "PROMPT_COMMAND", "IFS", "LOCPATH", "HOSTALIASES", "FOO_PRELOAD"} {
		_, err := effectiveConfig(fuzzDriver, []resourceapi.DeviceAllocationConfiguration{claim(`"env":{"` + name + `":"x"}`)}, "r", names.KindFPGA)
		if err == nil || !strings.Contains(err.Error(), "config from claim: ") || !strings.Contains(err.Error(), "env["+name+"]: Forbidden") ||
			!strings.Contains(err.Error(), "unless the class lists the name in its claimEnv") {
			t.Errorf("a claim's %s: %v", name, err)
		}
	}
	// Names that load nothing pass, however close they look.
	for _, name := range []string{"NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS", "MY_PATH", "ENVIRONMENT", "HOME", "LANG", "A"} {
		if _, err := effectiveConfig(fuzzDriver, []resourceapi.DeviceAllocationConfiguration{claim(`"env":{"` + name + `":"x"}`)}, "r", names.KindFPGA); err != nil {
			t.Errorf("a claim's %s: %v", name, err)
		}
	}

	for _, c := range []struct {
		name    string
		configs []resourceapi.DeviceAllocationConfiguration
		want    string            // an error containing it; "" for none
		env     map[string]string // else the effective env
	}{
		{"the class sets the loader's", []resourceapi.DeviceAllocationConfiguration{class(`"env":{"LD_PRELOAD":"/lib/x.so"}`)}, "", map[string]string{"LD_PRELOAD": "/lib/x.so"}},
		{"the class lets its claims set one", []resourceapi.DeviceAllocationConfiguration{class(`"claimEnv":["PYTHONPATH","RUN_ID"]`), claim(`"env":{"PYTHONPATH":"/work"}`)}, "", map[string]string{"PYTHONPATH": "/work"}},
		{"only those the class lists", []resourceapi.DeviceAllocationConfiguration{class(`"claimEnv":["RUN_ID"]`), claim(`"env":{"RUN_ID":"1","OTHER":"2"}`)},
			`env[OTHER]: Forbidden: the DeviceClass lets its claims set only RUN_ID (its claimEnv)`, nil},
		{"an empty list lets a claim set none", []resourceapi.DeviceAllocationConfiguration{class(`"claimEnv":[]`), claim(`"env":{"A":"1"}`)},
			`env[A]: Forbidden: the DeviceClass lets its claims set no variable (its claimEnv is empty)`, nil},
		{"a claim cannot widen its own", []resourceapi.DeviceAllocationConfiguration{claim(`"claimEnv":["LD_PRELOAD"],"env":{"LD_PRELOAD":"/x.so"}`)},
			`claimEnv: Forbidden: set by the DeviceClass`, nil},
		{"a class's list names variables", []resourceapi.DeviceAllocationConfiguration{class(`"claimEnv":["1BAD"]`)}, `claimEnv[0]: Invalid value: "1BAD"`, nil},
		{"a class's list never names carve's", []resourceapi.DeviceAllocationConfiguration{class(`"claimEnv":["NVIDIA_VISIBLE_DEVICES"]`)}, `claimEnv[0]: Forbidden: NVIDIA_* variables are set by carve`, nil},
	} {
		raw, err := effectiveConfig(fuzzDriver, c.configs, "r", names.KindFPGA)
		if c.want != "" {
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %v; want %q", c.name, err, c.want)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		var eff EffectiveConfig
		if err := json.Unmarshal(raw, &eff); err != nil || eff.Device == nil || len(eff.Device.Env) != len(c.env) {
			t.Errorf("%s: effective %s, %v", c.name, raw, err)
			continue
		}
		for k, v := range c.env {
			if eff.Device.Env[k] != v {
				t.Errorf("%s: effective env %v, want %v", c.name, eff.Device.Env, c.env)
			}
		}
	}
}

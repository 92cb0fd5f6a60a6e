package v1alpha1

import "strings"

// What a claim may not add to a container's environment unless its
// DeviceClass lists the name in claimEnv: variables that make a program
// load or run code of the setter's choosing. A claim's author may be
// someone who cannot create pods (a claim template's, an operator's), and a
// device's environment reaches every container that uses it. The families,
// matched without regard to case:
var (
	codeHookPrefixes = []string{
		"LD_",            // the dynamic loader: LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT
		"CUDA_INJECTION", // CUDA_INJECTION64_PATH: a library the CUDA driver loads
		"PYTHON",         // PYTHONPATH, PYTHONSTARTUP, PYTHONHOME
		"PERL5",          // PERL5OPT, PERL5LIB
		"PERLLIB",        // Perl's library path
		"RUBYOPT",        // -r of Ruby's choosing
		"RUBYLIB",        // Ruby's library path
		"MALLOC_",        // glibc's allocator hooks
		"GLIBC_TUNABLES", // glibc's tunables (CVE-2023-4911)
		"GCONV_PATH",     // iconv modules glibc loads
		"JAVA_TOOL_OPTIONS",
		"_JAVA_OPTIONS",
		"JDK_JAVA_OPTIONS",
	}
	codeHookSuffixes = []string{
		"_PRELOAD", // any loader's preload list
	}
	codeHookNames = []string{
		"NODE_OPTIONS", // --require of Node's choosing
		"BASH_ENV",     // a file bash runs first
		"ENV",          // the same for sh
		"PATH",         // which binary a bare name runs
		"SHELLOPTS",    // bash options, xtrace with PS4 among them
		"BASHOPTS",
		"PS4",            // expanded, command substitution included, under xtrace
		"PROMPT_COMMAND", // run by interactive shells
		"IFS",
		"LOCPATH", // locale data glibc loads
		"NLSPATH",
		"HOSTALIASES",
	}
)

// CodeHookEnv is the family of code-loading variables name belongs to (as
// "LD_*", "*_PRELOAD", "NCCL_*PLUGIN*" or the name itself), "" where none.
func CodeHookEnv(name string) string {
	n := strings.ToUpper(name)
	for _, p := range codeHookPrefixes {
		if strings.HasPrefix(n, p) {
			return p + "*"
		}
	}
	for _, s := range codeHookSuffixes {
		if strings.HasSuffix(n, s) {
			return "*" + s
		}
	}
	// NCCL's network, tuner and profiler plugins are libraries it loads
	// by name.
	if strings.HasPrefix(n, "NCCL_") && strings.Contains(n, "PLUGIN") {
		return "NCCL_*PLUGIN*"
	}
	for _, c := range codeHookNames {
		if n == c {
			return c
		}
	}
	return ""
}

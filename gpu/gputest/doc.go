// Package gputest holds what the GPU packages' tests share: a check that
// they run as root where the host's namespaces and mounts are needed, and
// temporary directories short enough for MPS's socket paths.
package gputest

// Package integration holds tests that run real leasefs servers and FUSE
// mounts as processes and drive them with real tools; see its _test files.
package integration

// Package sim is a backend with no processes: each domain is a state
// machine that goes through the same micro-ops as a QEMU domain, each
// taking a configurable delay (Config.StepDelay, Config.Delays by
// micro-op), with failures injected by name. It serves hosts without a
// hypervisor and pools of hundreds of simulated hosts (tests/scale), and
// is never a stand-in for QEMU where QEMU can run.
//
// With Config.StateDir, started domains are kept in files, so that they
// outlive a daemon restart as processes would. Migration, disk mirrors
// and exports follow package backend's contracts and stream formats, so
// that xenops' migration code runs the same against it.
package sim

// Package suite holds the steps the pool test packages (tests/pool/...)
// share: starting and joining pools of real toolstackd processes, calls
// through one host with one session (RPC), waits with bounds, VMs and
// disks on the simulator and on QEMU, and the moves between SRs and pools.
//
// Every wait here has a bound of at least ten times what the step takes on
// a quiet machine, so that a busy machine slows the tests without failing
// them; Ctx ends a little before the test binary's own deadline.
package suite

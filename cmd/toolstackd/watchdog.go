package main

import (
	"errors"
	"os"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"toolstackd/internal/ha/journal"
	"toolstackd/internal/ha/watchdog"
	"toolstackd/internal/xenops/qemu"
)

// fakeWatchdogCmd is the fake watchdog's process (internal/ha/watchdog):
// started by a daemon run with --watchdog fake, fed pets on fd 3.
func fakeWatchdogCmd() *cobra.Command {
	var timeout time.Duration
	var pgid int
	var journalPath, host string
	cmd := &cobra.Command{
		Use:    watchdog.FakeCommand,
		Short:  "a fake watchdog for tests: kills a process group that stops petting it",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			in := os.NewFile(3, "pets")
			if in == nil {
				return errors.New("no pet pipe on fd 3")
			}
			return watchdog.RunFake(in, pgid, timeout, func() {
				if journalPath != "" {
					// Written after the kill: the host's instances end no
					// earlier than this.
					_ = journal.Append(journalPath, journal.Dead, "-", host)
				}
			})
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "how long without a pet before the kill")
	cmd.Flags().IntVar(&pgid, "pgid", 0, "the process group to kill")
	cmd.Flags().StringVar(&journalPath, "journal", "", "an instance journal to record the reset in")
	cmd.Flags().StringVar(&host, "host", "", "the host (ref) the journal names")
	return cmd
}

// leadProcessGroup makes this process the leader of a process group of
// its own, which the fake watchdog kills as a reset would (its QEMUs
// with it).
func leadProcessGroup() error {
	if syscall.Getpgrp() == os.Getpid() {
		return nil
	}
	return syscall.Setpgid(0, 0)
}

// qemuConfig is the QEMU backend's setting from the options: with the fake
// watchdog, the VMs join this daemon's process group, which the fake kills
// as a reset would.
func qemuConfig(o options) qemu.Config {
	c := o.qemu
	if o.watchdog == "fake" {
		c.ProcessGroup = os.Getpid()
	}
	return c
}

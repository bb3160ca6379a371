package sim

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// Signals to simulated guests (VM.send_sysrq, VM.send_trigger), disk
// growth (VDI.resize_online) and NIC moves (VIF.move). Each signal is
// recorded per domain for tests (Signals), and the guest reacts as a
// Linux guest would to the few that stop it: SysRq o powers off, b
// reboots, c crashes; the power trigger is the ACPI power button.

// signalLog holds what each domain of one simulator was sent; the zero
// value is ready.
type signalLog struct {
	mu   sync.Mutex
	sent map[string][]string
}

// maxSignals bounds the log of one domain, maxSignalled the domains a
// log holds (past it, the log starts afresh): a long-running simulated
// host keeps a bounded record.
const (
	maxSignals   = 1000
	maxSignalled = 4096
)

func (s *Simulator) note(uuid, what string) {
	l := &s.signals
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.sent[uuid]; !ok && len(l.sent) >= maxSignalled || l.sent == nil {
		l.sent = map[string][]string{}
	}
	if len(l.sent[uuid]) < maxSignals {
		l.sent[uuid] = append(l.sent[uuid], what)
	}
}

// Signals lists what was sent to domain uuid, oldest first: "sysrq:K"
// and "trigger:NAME".
func (s *Simulator) Signals(uuid string) []string {
	l := &s.signals
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.sent[uuid])
}

// running checks that a domain exists and its guest runs.
func (s *Simulator) running(uuid string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, err := s.get(uuid)
	if err != nil {
		return err
	}
	if d.Info.State != backend.DomainRunning {
		return xerr.New(xerr.VMBadPowerState, d.Spec.VMRef, "running", string(d.Info.State))
	}
	return nil
}

// SendSysrq records the key; o, b and c stop the guest as Linux does.
func (s *Simulator) SendSysrq(ctx context.Context, uuid string, key byte) error {
	if err := s.step(ctx, "signal"); err != nil {
		return err
	}
	if err := s.running(uuid); err != nil {
		return err
	}
	s.note(uuid, "sysrq:"+string(rune(key)))
	switch key {
	case 'o':
		s.GuestPowerOff(uuid)
	case 'b':
		s.GuestReboot(uuid)
	case 'c':
		s.Crash(uuid)
	}
	return nil
}

// SendTrigger records the trigger; power presses the power button.
func (s *Simulator) SendTrigger(ctx context.Context, uuid, trigger string) error {
	switch trigger {
	case "nmi", "power", "s3resume":
	default:
		return xerr.New(xerr.InvalidValue, "trigger", trigger)
	}
	if err := s.step(ctx, "signal"); err != nil {
		return err
	}
	if err := s.running(uuid); err != nil {
		return err
	}
	s.note(uuid, "trigger:"+trigger)
	if trigger == "power" {
		return s.RequestShutdown(ctx, uuid)
	}
	return nil
}

// ResizeDisk checks that the domain has the disk and records the resize.
func (s *Simulator) ResizeDisk(ctx context.Context, uuid, device string, size int64) error {
	err := s.modify(ctx, "resize", uuid, func(d *simDomain) error {
		if !slices.ContainsFunc(d.Info.Disks, func(x backend.Disk) bool { return x.Device == device && !x.ReadOnly && !x.CD }) {
			return fmt.Errorf("simulator: no writable disk %s", device)
		}
		return nil
	})
	if err == nil {
		s.note(uuid, fmt.Sprintf("resize:%s:%d", device, size))
	}
	return err
}

// MoveNIC records the NIC's new bridge.
func (s *Simulator) MoveNIC(ctx context.Context, uuid, device, bridge string) error {
	return s.modify(ctx, "nic", uuid, func(d *simDomain) error {
		for i := range d.Info.NICs {
			if d.Info.NICs[i].Device == device {
				d.Info.NICs[i].Bridge = bridge
				return nil
			}
		}
		return fmt.Errorf("simulator: no NIC %s", device)
	}, true)
}

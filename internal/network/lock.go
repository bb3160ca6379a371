package network

import (
	"context"
	"fmt"
	"reflect"

	"toolstackd/internal/network/locking"
	"toolstackd/internal/xerr"
)

// VIF locking (xapi's VIF.locking_mode, ipv4_allowed, ipv6_allowed):
// once the VM lifecycle has put a VIF's tap on its bridge it calls
// LockVIF, which applies the VIF's rules to the tap through
// Config.Locker (package network/locking); Release removes them. The
// module remembers each locked VIF's tap and rules, and Watch applies
// them again when the database changes what they should be (the VIF's
// locking fields or MAC, or its network's default_locking_mode), as
// xapi's refresh of filtering rules does.
//
// After a restart of the daemon, the VM lifecycle hands the taps of the
// domains it finds running back through LockVIF (xenops' reconcile), so
// their rules are applied again and followed from then on.

// Locker is what the module asks of the VIF locking rules.
type Locker interface {
	Apply(r locking.Rules) error
	Remove(port string) error
}

// lockedVIF is a VIF whose tap has rules.
type lockedVIF struct {
	tap   string
	rules locking.Rules
}

// LockVIF applies the VIF's locking rules to its tap (every mode,
// unlocked included: that clears what an earlier tap of the same name
// left). Without a Locker it does nothing, and a VIF that must be
// locked or disabled is refused rather than left open.
func (m *Manager) LockVIF(_ context.Context, vifRef, tap string) error {
	rules, err := locking.RulesFor(m.db.Snapshot(), vifRef, tap)
	if err != nil {
		return err
	}
	if m.cfg.Locker == nil {
		if rules.Mode == locking.ModeUnlocked {
			return nil
		}
		return errNoLocker(vifRef, rules.Mode)
	}
	if err := m.cfg.Locker.Apply(rules); err != nil {
		return err
	}
	m.lockMu.Lock()
	m.locked[vifRef] = lockedVIF{tap: tap, rules: rules}
	m.lockMu.Unlock()
	return nil
}

// errNoLocker refuses to run a VIF that must be locked or disabled when
// no rules can be written.
func errNoLocker(vifRef, mode string) error {
	return xerr.New(xerr.InternalError, fmt.Sprintf("VIF %s must be %s, and this host cannot write locking rules (nf_tables)", vifRef, mode))
}

// unlockVIF removes a VIF's rules, if it has any.
func (m *Manager) unlockVIF(vifRef string) {
	m.lockMu.Lock()
	l, ok := m.locked[vifRef]
	delete(m.locked, vifRef)
	m.lockMu.Unlock()
	if !ok || m.cfg.Locker == nil {
		return
	}
	if err := m.cfg.Locker.Remove(l.tap); err != nil {
		m.log.Warn("network: removing a VIF's locking rules", "vif", vifRef, "tap", l.tap, "err", err)
	}
}

// relock applies again the rules of locked VIFs whose rules the database
// now says differently.
func (m *Manager) relock() {
	if m.cfg.Locker == nil {
		return
	}
	snap := m.db.Snapshot()
	m.lockMu.Lock()
	defer m.lockMu.Unlock()
	for vif, l := range m.locked {
		rules, err := locking.RulesFor(snap, vif, l.tap)
		if err != nil {
			continue // the VIF is gone: its unplug removes the rules
		}
		if reflect.DeepEqual(rules, l.rules) {
			continue
		}
		if err := m.cfg.Locker.Apply(rules); err != nil {
			m.log.Warn("network: applying a VIF's new locking rules", "vif", vif, "err", err)
			continue
		}
		m.locked[vif] = lockedVIF{tap: l.tap, rules: rules}
	}
}

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

// lockedVIF is a VIF whose tap has rules, and its rate limit (qos.go)
// with what was wrong with its qos fields when last read; ruleNote is
// why the rules the database last asked for could not be made ("" when
// they could), so that relock logs it once.
type lockedVIF struct {
	tap      string
	rules    locking.Rules
	rate     Rate
	qosNote  string
	ruleNote string
}

// LockVIF applies the VIF's locking rules to its tap (every mode,
// unlocked included: that clears what an earlier tap of the same name
// left). Without a Locker it does nothing, and a VIF that must be
// locked or disabled is refused rather than left open.
//
// It also applies the VIF's rate limit (qos.go). A VIF whose tap has
// these very rules and limit already (the tap's plug applied them, and
// the VM lifecycle asks again) is left as it is.
func (m *Manager) LockVIF(ctx context.Context, vifRef, tap string) error {
	// A switch taking VIFs as ports learns which tap carries this one
	// (vifport.go).
	if err := m.tapVIFPort(ctx, vifRef, tap); err != nil {
		return err
	}
	snap := m.db.Snapshot()
	rules, err := locking.RulesFor(snap, vifRef, tap)
	if err != nil {
		return err
	}
	rate, note := vifRate(snap, vifRef)
	m.lockMu.Lock()
	old, had := m.locked[vifRef]
	m.lockMu.Unlock()
	if had && old.tap == tap && old.rate == rate && reflect.DeepEqual(old.rules, rules) {
		return nil
	}
	if !had || old.tap != tap {
		old = lockedVIF{}
	}
	if m.cfg.Locker == nil {
		if rules.Mode != locking.ModeUnlocked {
			return errNoLocker(vifRef, rules.Mode)
		}
	} else if err := m.cfg.Locker.Apply(rules); err != nil {
		return err
	}
	rate = m.setRate(vifRef, tap, old.rate, rate, note, old.qosNote)
	m.lockMu.Lock()
	m.locked[vifRef] = lockedVIF{tap: tap, rules: rules, rate: rate, qosNote: note}
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
	if !ok {
		return
	}
	if l.rate != (Rate{}) {
		m.setRate(vifRef, l.tap, l.rate, Rate{}, "", "")
	}
	if m.cfg.Locker == nil {
		return
	}
	if err := m.cfg.Locker.Remove(l.tap); err != nil {
		m.log.Warn("network: removing a VIF's locking rules", "vif", vifRef, "tap", l.tap, "err", err)
	}
}

// relock applies again the rules and rate limits of locked VIFs whose
// rules or limits the database now says differently.
func (m *Manager) relock() {
	snap := m.db.Snapshot()
	m.lockMu.Lock()
	defer m.lockMu.Unlock()
	for vif, l := range m.locked {
		rules, err := locking.RulesFor(snap, vif, l.tap)
		if err != nil {
			// A VIF that is gone has its rules removed by its unplug.
			// Otherwise what the database now says cannot be made into
			// rules (an address the rules cannot take): the tap keeps
			// the rules it has, and the log says why.
			if note := err.Error(); !xerr.HasCode(err, xerr.HandleInvalid) && note != l.ruleNote {
				m.log.Warn("network: keeping a VIF's locking rules: its new ones cannot be made", "vif", vif, "err", err)
				l.ruleNote = note
				m.locked[vif] = l
			}
			continue
		}
		if l.ruleNote != "" {
			l.ruleNote = ""
			m.locked[vif] = l
		}
		if rate, note := vifRate(snap, vif); rate != l.rate || note != l.qosNote {
			l.rate = m.setRate(vif, l.tap, l.rate, rate, note, l.qosNote)
			l.qosNote = note
			m.locked[vif] = l
		}
		if m.cfg.Locker == nil || reflect.DeepEqual(rules, l.rules) {
			continue
		}
		if err := m.cfg.Locker.Apply(rules); err != nil {
			m.log.Warn("network: applying a VIF's new locking rules", "vif", vif, "err", err)
			continue
		}
		l.rules = rules
		m.locked[vif] = l
	}
}

package xenops

import (
	"context"
	"time"

	"toolstackd/internal/db"

	"toolstackd/internal/ha/journal"
	"toolstackd/internal/xenops/backend"
)

// Fence kills, at once and without the database, the domains on this
// host of the VMs protect says HA protects (by VM uuid): HA calls it when
// the host's lease has run out, when it may not be able to write anything
// (docs/ha.md, rule 3). It goes by the domains that run here, not by the
// records, which may already place those VMs elsewhere. The records stay
// as they are: the coordinator moves them once it declares the host
// dead. It returns how many of those domains are left.
func (m *Manager) Fence(ctx context.Context, protect func(uuid string) bool) (left int) {
	for _, info := range m.be.List() {
		if info.State == backend.DomainGone || !protect(info.UUID) {
			continue
		}
		m.log.Warn("HA: killing a protected VM's domain", "vm", info.UUID, "domid", info.Domid)
		// Marked first: the domain's end must not be recorded as this
		// VM's stop (checkState) from what may be a stale replica.
		m.fenced.Store(info.UUID, time.Now())
		if err := m.be.Destroy(context.WithoutCancel(ctx), info.UUID); err != nil {
			m.log.Error("HA: cannot kill a protected VM's domain", "vm", info.UUID, "err", err)
		} else {
			m.journal(journal.Stop, info.UUID)
		}
		if now, ok := m.be.Info(info.UUID); ok && now.State != backend.DomainGone {
			left++
		}
	}
	return left
}

// fencedHold is how long a VM whose domain HA fenced here is left as
// its record has it: a host that comes back from a stop (SIGSTOP, a
// hang) reads a replica that may still place the VM here while the
// coordinator has restarted it elsewhere; recording it Halted from that
// replica would undo the restart. Once the hold is over (the replica
// caught up) the VM is looked at again: still placed here, it is
// recorded Halted, and HA restarts it as any protected VM that stopped.
const fencedHold = 15 * time.Second

// heldByFence reports whether the VM of uuid is within its fenced hold;
// when it is, it is looked at again once the hold is over.
func (m *Manager) heldByFence(uuid string) bool {
	v, ok := m.fenced.Load(uuid)
	if !ok {
		return false
	}
	left := fencedHold - time.Since(v.(time.Time))
	if left <= 0 {
		m.fenced.CompareAndDelete(uuid, v)
		return false
	}
	time.AfterFunc(left, func() { m.notify(uuid) })
	return true
}

// journal records a domain's start or stop in Config.Journal, if set.
func (m *Manager) journal(kind, uuid string) {
	if m.cfg.Journal == "" {
		return
	}
	if err := journal.Append(m.cfg.Journal, kind, uuid, m.host); err != nil {
		m.log.Error("cannot write the instance journal", "err", err)
	}
}

// SetHalted records, in tx, a VM whose domain is gone with its host (HA
// declaring the host dead): Halted, resident nowhere, its devices
// unplugged and its consoles gone, as any VM that stops.
func (m *Manager) SetHalted(tx *db.Tx, ref string) error { return m.setHalted(tx, ref) }

package xenops

import (
	"context"

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

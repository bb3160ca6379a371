package xenops

import (
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// Host other_config keys that say how guests are accelerated.
const (
	hostKeyAccel       = "accelerator"
	hostKeyAccelReason = "accelerator_reason"
)

// recordAccelerator writes the backend's choice into this host's
// other_config, so that an administrator sees it (xe host-param-get).
func (m *Manager) recordAccelerator(accel, reason string) {
	if m.host == "" {
		return
	}
	_, err := m.db.Update(func(tx *db.Tx) error {
		row, ok := tx.Get(dm.Host.Class, m.host)
		if !ok {
			return nil
		}
		old, _ := row.Get(dm.Host.OtherConfig).(map[string]string)
		if old[hostKeyAccel] == accel && old[hostKeyAccelReason] == reason {
			return nil
		}
		oc := make(map[string]string, len(old)+2)
		for k, v := range old {
			oc[k] = v
		}
		oc[hostKeyAccel], oc[hostKeyAccelReason] = accel, reason
		return tx.Set(dm.Host.OtherConfig, m.host, oc)
	})
	if err != nil {
		m.log.Warn("recording the accelerator in the host record", "err", err)
	}
}

package forwarding

import (
	"slices"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// HTTP handlers that touch one host's disks or domains run where those
// are, as the calls about them do.

// VDIHost is the host that serves a disk transfer of vdi: this host when
// it has the VDI's SR plugged, else the first host that has (the
// coordinator first for a shared SR). With no such host, or on a pool of
// one, it is self: the handler then answers for itself (SR_NOT_ATTACHED,
// HANDLE_INVALID...).
func VDIHost(snap db.Reader, self, vdi string) string {
	res := resolver{snap: snap, self: self}
	row, ok := res.get(dm.VDI.Class, vdi)
	if !ok || snap.Count(dm.Host.Class) <= 1 {
		return self
	}
	res.coord = res.coordinator()
	hosts := res.pbdHosts(row.String(dm.VDI.SR), true)
	if len(hosts) == 0 || slices.Contains(hosts, self) {
		return self
	}
	return hosts[0]
}

// VMHost is the host that runs vm's domain: the host it is resident on
// while running or paused, else self.
func VMHost(snap db.Reader, self, vm string) string {
	res := resolver{snap: snap, self: self}
	row, ok := res.get(dm.VM.Class, vm)
	if !ok {
		return self
	}
	if h, ok := res.residentHost(row); ok {
		return h
	}
	return self
}

package pool

import (
	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/pool/replica"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// What a joiner is checked for (issue 29): it is a stranger with an
// administrator's password until it has joined, and what it sends is
// hostile input.
//
//   - It names a uuid and an address no host of the pool has: a joiner
//     cannot take a member's place in raft.
//   - Its rows are its own objects only, each new to the pool: its host
//     row (with the joiner's uuid), that host's metrics and CPUs, its
//     PBDs with the SRs and VDIs only it sees, its PIFs with their metrics
//     and networks, and its control domain with the domain's metrics. A
//     row that names an object of the pool's, or of another host, or that
//     would overwrite a row the pool has, is refused whole: the
//     coordinator makes the joiner's rows, and none other.

// checkJoiner refuses a joiner whose uuid or address is a host of the
// pool already.
func (p *Pool) checkJoiner(snap db.Reader, uuid, address string) error {
	if _, ok := snap.ByUUID(dm.Host.Class, uuid); ok || p.knownID(uuid) {
		return xerr.New(xerr.InvalidValue, "uuid", uuid)
	}
	if p.isSelf(address) || p.knownMember(snap, address) {
		return xerr.New(xerr.InvalidValue, "address", address)
	}
	return nil
}

// knownID reports whether a raft server has the id.
func (p *Pool) knownID(id string) bool {
	for _, s := range p.raftServers() {
		if string(s.ID) == id {
			return true
		}
	}
	return false
}

// checkJoinRows checks that rows are the joining host's own objects, all
// new to the pool (see above).
func checkJoinRows(snap db.Reader, hostUUID string, rows []replica.Row) error {
	bad := func(why string) error { return xerr.New(xerr.InvalidValue, "rows", why) }
	str := func(r replica.Row, f *schema.Field) string { s, _ := r.Values[f.Index].(string); return s }
	byRef := map[string]replica.Row{}
	hostRef := ""
	for _, r := range rows {
		if _, dup := byRef[r.Ref]; dup {
			return bad("a row twice: " + r.Ref)
		}
		if _, exists := snap.Get(r.Class, r.Ref); exists {
			return bad("a " + r.Class.Name + " the pool has already: " + r.Ref)
		}
		if r.Class.UUID != nil {
			if u := str(r, r.Class.UUID); u != "" {
				if _, exists := snap.ByUUID(r.Class, u); exists {
					return bad("a " + r.Class.Name + " uuid the pool has already: " + u)
				}
			}
		}
		byRef[r.Ref] = r
		if r.Class == dm.Host.Class {
			if hostRef != "" || str(r, dm.Host.UUID) != hostUUID {
				return bad("one host row, the joining host's")
			}
			hostRef = r.Ref
		}
	}
	if hostRef == "" {
		return bad("no host row with the joining host's uuid")
	}
	// Every row must be reached from the host through the relations a
	// host's own objects hang by.
	mine := map[string]bool{hostRef: true}
	has := func(c *schema.Class, ref string) bool {
		r, ok := byRef[ref]
		return ok && r.Class == c
	}
	host := byRef[hostRef]
	if m := str(host, dm.Host.Metrics); has(dm.HostMetrics.Class, m) {
		mine[m] = true
	}
	srs := map[string]bool{}
	for _, r := range rows {
		switch r.Class {
		case dm.HostCPU.Class:
			mine[r.Ref] = str(r, dm.HostCPU.Host) == hostRef
		case dm.PBD.Class:
			if str(r, dm.PBD.Host) == hostRef {
				mine[r.Ref] = true
				srs[str(r, dm.PBD.SR)] = true
			}
		case dm.PIF.Class:
			if str(r, dm.PIF.Host) == hostRef {
				mine[r.Ref] = true
				if m := str(r, dm.PIF.Metrics); has(dm.PIFMetrics.Class, m) {
					mine[m] = true
				}
				if n := str(r, dm.PIF.Network); has(dm.Network.Class, n) {
					mine[n] = true
				}
			}
		case dm.VM.Class:
			// Its control domain only: no templates, no guests.
			if ctrl, _ := r.Values[dm.VM.IsControlDomain.Index].(bool); ctrl && str(r, dm.VM.ResidentOn) == hostRef {
				mine[r.Ref] = true
				for _, f := range []*schema.Field{dm.VM.Metrics, dm.VM.GuestMetrics} {
					if m := str(r, f); byRef[m].Class != nil {
						mine[m] = true
					}
				}
			}
		}
	}
	for _, r := range rows {
		if r.Class == dm.SR.Class && srs[r.Ref] {
			if shared, _ := r.Values[dm.SR.Shared.Index].(bool); !shared {
				mine[r.Ref] = true
			}
		}
	}
	for _, r := range rows {
		if r.Class == dm.VDI.Class && mine[str(r, dm.VDI.SR)] {
			mine[r.Ref] = true
		}
	}
	for _, r := range rows {
		if !mine[r.Ref] {
			return bad("a " + r.Class.Name + " that is not the joining host's own: " + r.Ref)
		}
	}
	return nil
}

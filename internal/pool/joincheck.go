package pool

import (
	"fmt"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/pool/replica"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// What a joiner is checked for (issue 29): it is a stranger with an
// administrator's password until it has joined, and what it sends is
// hostile input.
//
//   - It runs the XenAPI version (host.API_version_major/minor) and the
//     database schema version of the coordinator: rows of another schema
//     are not this pool's rows, and a host of another API version would
//     answer the pool's calls otherwise. A mismatch is refused with
//     xapi's POOL_JOINING_HOST_MUST_HAVE_SAME_API_VERSION or
//     POOL_JOINING_HOST_MUST_HAVE_SAME_DB_SCHEMA [joiner's, coordinator's]
//     (each "major.minor", "" when the joiner did not say), before its
//     rows are read. The joiner asks the coordinator for its versions
//     first and refuses itself, with the same errors, before it sends
//     anything of its own.
//   - It names a uuid and an address no host of the pool has: a joiner
//     cannot take a member's place in raft.
//   - Its rows are its own objects only, each new to the pool: its host
//     row (with the joiner's uuid), that host's metrics and CPUs, its
//     PBDs with the SRs and VDIs only it sees, its PIFs with their metrics
//     and networks, and its control domain with the domain's metrics. A
//     row that names an object of the pool's, or of another host, or that
//     would overwrite a row the pool has, is refused whole: the
//     coordinator makes the joiner's rows, and none other.

// Version is a major.minor version pair: the XenAPI's or the database
// schema's.
type Version struct {
	Major int64 `json:"major"`
	Minor int64 `json:"minor"`
}

// String is the version as xapi's join errors name it, "major.minor";
// "" for none.
func (v *Version) String() string {
	if v == nil {
		return ""
	}
	return fmt.Sprintf("%d.%d", v.Major, v.Minor)
}

// APIVersion is this toolstackd's XenAPI version, as its host record's
// API_version_major and API_version_minor say.
func APIVersion() *Version { return &Version{Major: api.APIVersionMajor, Minor: api.APIVersionMinor} }

// SchemaVersion is the database schema version of model m.
func SchemaVersion(m *schema.Model) *Version {
	return &Version{Major: int64(m.SchemaMajor), Minor: int64(m.SchemaMinor)}
}

// checkVersions refuses a joiner whose API version (joinerAPI) or schema
// version (joinerSchema) is not the coordinator's (masterAPI,
// masterSchema); a version not given is a mismatch.
func checkVersions(joinerAPI, joinerSchema, masterAPI, masterSchema *Version) error {
	same := func(a, b *Version) bool { return a != nil && b != nil && *a == *b }
	if !same(joinerAPI, masterAPI) {
		return xerr.New(xerr.PoolJoiningHostMustHaveSameAPIVersion, joinerAPI.String(), masterAPI.String())
	}
	if !same(joinerSchema, masterSchema) {
		return xerr.New(xerr.PoolJoiningHostMustHaveSameDBSchema, joinerSchema.String(), masterSchema.String())
	}
	return nil
}

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

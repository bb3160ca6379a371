package pool

import (
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

// The pieces of pool.join that internal/testkit/poolfarm, the test tool that runs
// many light simulated hosts in one process, uses to join a real
// coordinator exactly as a real host does (and the pool tests, to send a
// coordinator joins no real host would). Nothing in the daemon uses them.

// JoinPath is the coordinator's endpoint of pool.join (POST, with the
// coordinator's pool-admin credentials as basic authorization and a
// JoinRequest as JSON).
const JoinPath = joinPath

// JoinRequest is the body a joining host sends to JoinPath.
type JoinRequest = joinRequest

// JoinReply is the coordinator's answer to a JoinRequest.
type JoinReply = joinReply

// OwnRows are the rows a joining host brings into the pool (its host,
// metrics, CPUs, local storage and control domain), read from snap, whose
// host row is self.
func OwnRows(snap db.Reader, self string) []*db.Row { return ownRows(snap, self) }

// OwnVersions are the XenAPI and database schema versions a host of this
// toolstackd, with the datamodel m, names in its JoinRequest.
func OwnVersions(m *schema.Model) (apiVer, dbSchema *Version) { return apiVersion(), schemaVersion(m) }

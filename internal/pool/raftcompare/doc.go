// Package raftcompare holds one measured comparison and nothing the
// daemon uses: how long a replicated, durable write takes with
// go.etcd.io/raft/v3 (the fallback the design names behind the
// replication seam) against github.com/hashicorp/raft (what the daemon
// runs), both against the floor of a single host, one fsync'd append.
// The package has no code outside its tests; this file is its manual.
//
// # Why etcd's raft could be faster
//
// hashicorp/raft's leader stores a new entry in its log, synced, before
// it sends the entry to the followers; each follower stores it, synced,
// before it answers. A commit therefore costs two syncs in series plus a
// round trip. etcd's raft hands the application a Ready batch holding the
// new entries and the messages that carry them, and its rules allow the
// leader to send those messages before its own write of the same entries
// has finished (the leader writes to its disk in parallel with its
// followers, section 10.2.1 of Ongaro's thesis). A commit then costs
// about max(leader sync, round trip + follower sync).
//
// # What the tests build
//
// Three etcd raft nodes in one process, each with
//
//   - its log on disk in internal/pool/raftwal (the append-only segment
//     log already in the tree, one fdatasync a save), each entry stored as
//     a raftwal record whose data is the marshalled raftpb.Entry, and a
//     raft.MemoryStorage holding the same entries for raft to read;
//   - its term and vote in a small file of two checksummed slots written
//     in turn, synced before any message is sent that depends on them
//     (the commit index rides along when it is written, bounded by the
//     last entry on disk; raft treats the commit index as volatile, so a
//     stale one on disk is safe);
//   - a loopback TCP transport: one listener per node on 127.0.0.1–3,
//     one connection and one bounded queue per peer, each message a
//     4-byte big-endian length and the marshalled raftpb.Message. A frame
//     longer than maxFrame, or one that does not decode or is not
//     addressed to the node, closes the connection. A full queue drops
//     the message and reports the peer unreachable, which raft tolerates
//     (it resends).
//
// Each node runs the standard Ready loop of etcd's documentation: persist
// the hard state and entries, send messages, apply committed entries,
// Advance. The one liberty taken is the documented one: messages that do
// not depend on the batch's entries being durable (the leader's appends
// and heartbeats) are queued for sending before the batch is written,
// and the write runs while they travel; responses that acknowledge
// entries or grant votes (MsgAppResp, MsgVoteResp, MsgPreVoteResp) are
// sent only after the write returns. A batch that changes the term or the
// vote writes everything first and sends after.
//
// A second etcd cluster runs with AsyncStorageWrites, etcd raft's other
// documented way: the Ready loop never calls Advance; each batch's write
// and each run of committed entries arrive as messages for a local
// append goroutine and a local apply goroutine, each carrying the
// responses to deliver once it is done. Appends queued behind the one in
// progress are written together with one sync. In this mode raft applies
// only entries already on the node's own disk.
//
// The hashicorp clusters are built as the groundwork benchmarks build
// them (internal/pool/raftnet's TestNetCluster and raftwal's
// BenchmarkRaftApply): three nodes, rafttest.Config with 1 s timeouts,
// the daemon's Conservative wrapper, here over raft's own TCP
// transport on 127.0.0.1–3, with the log either on raftwal or on
// internal/pool/raftstore (bbolt, as the daemon has it); the stable
// store is raftstore in both.
//
// The floor is a file on the same disk to which writers append records
// of the same size; a single goroutine writes whatever is queued and
// fdatasyncs once, so with one writer every write is one append and one
// sync, and with sixteen the writes share syncs as a host's group commit
// does.
//
// The three nodes of every cluster here share one disk, so their syncs
// contend as those of three hosts would not. A second floor shows what
// that costs: three files on the disk, each appended to and synced at
// the same moment, a write done when all three are.
//
// # Measuring
//
// TestCompare measures, for each of the six (the floor, three syncs at
// once, etcd on raftwal in either mode, hashicorp on raftwal, hashicorp
// on bbolt), the latency of one write from the call to its being
// committed and applied on the leader (for the floors: synced), with 1
// and with 16 concurrent writers, in 3 rounds with the order of the six
// rotated each round. It logs p50 and p99 of each, their ratios to the
// floor of the same round, and for etcd how many entries each node's
// log write held.
// Every write is 512 bytes of command. Under -short it is skipped;
// TOOLSTACKD_LONG=1 makes each measurement ten times longer.
//
// TestEtcdStages follows each write of 16 writers through the etcd
// nodes in either mode (when each node began writing it, when it was on
// each disk, when the leader applied it) and checks that the leader
// never applies a write that is not yet on two of the three disks.
//
//	go test -count=1 -v -run 'TestCompare|TestEtcdStages' ./internal/pool/raftcompare/
//	TOOLSTACKD_LONG=1 go test -count=1 -v -run TestCompare ./internal/pool/raftcompare/
//
// Failover is not measured here, nor snapshots: the etcd nodes never
// compact their logs, and the comparison says nothing about how either
// library behaves when a leader dies.
package raftcompare

// Package raftnet carries raft traffic between the hosts of a pool.
//
// It has two parts.
//
// Conservative wraps a raft.Transport so that raft uses neither of two
// paths of hashicorp/raft (v1.7.3) that are known to break:
//
//   - The heartbeat fast path. raft lets a transport hand heartbeats to a
//     callback that runs outside raft's main goroutine; that path is the
//     cause of hashicorp/raft#695, where logs that were committed can
//     diverge after a partition heals. With the wrapper, heartbeats
//     arrive on the transport's consumer channel like every other RPC and
//     are handled in order by the main loop. The price: a heartbeat waits
//     behind whatever the main loop is doing, a log sync included, so the
//     election timeout must exceed the slowest fsync of the machine (keep
//     it at 1 s or more).
//   - Pipelined appends. When a follower answers an append in the
//     pipeline with failure (or the answer cannot be read), raft's reader
//     of the answers returns while the sender goes on; the transport's
//     decoder then blocks handing over the next answer, its queue fills,
//     and the sender blocks in AppendEntries for ever. That follower gets
//     no entry again from this leader (its heartbeats go on, so nothing
//     times out), and raft.Shutdown waits for the stuck goroutine: a
//     daemon stopped after partitions hung at SIGTERM (100 partition
//     cycles, tests/pool/core TestPartitionHeal in its long mode), and
//     grafana/pyroscope#5518 describes the same stall. Without a pipeline
//     raft replicates with one AppendEntries at a time per follower,
//     which costs nothing measurable here (docs/performance.md).
//
// StreamLayer is a raft.StreamLayer that rides on the daemon's HTTP
// listener instead of a port of its own, so a pool needs one port, with
// TLS where the daemon serves HTTPS. A peer opens a connection with
//
//	POST /pool/raft HTTP/1.1
//	Connection: Upgrade
//	Upgrade: toolstackd-raft/1
//	X-Toolstackd-Pool-Auth: <a signature with the pool secret>
//
// and, when the signature is one of a valid secret, fresh, and addressed
// to this host (package peerauth), is answered "101 Switching Protocols"
// with the host's proof that it holds the secret too; the dialer hands
// the connection to raft only with that proof. From then on the
// connection carries raft's own protocol (raft.NewNetworkTransportWithConfig
// over the StreamLayer). The secret itself is never sent. A missing or
// wrong signature gets 403, a full accept queue or a closed layer 503. The handler is mounted by the daemon on its router at Path; the
// http.Server's ReadHeaderTimeout and MaxHeaderBytes bound the request,
// Dial bounds the answer (HandshakeTimeout, MaxHeaderBytes) and the queue
// of upgraded connections not yet accepted by raft is QueueSize long.
package raftnet

import (
	"io"

	"github.com/hashicorp/raft"
)

// Conservative returns t with SetHeartbeatHandler made a no-op,
// AppendEntriesPipeline refused (raft.ErrPipelineReplicationNotSupported)
// and everything else forwarded to t. The optional interfaces raft v1.7.3
// looks for on a transport are kept exactly when t has them:
// raft.WithClose (closed on shutdown), raft.WithPreVote (pre-vote is
// used only if the transport supports it) and raft.WithPeers (the
// in-memory transport's Connect and Disconnect, which tests use; Connect
// accepts a wrapped peer transport and unwraps it). Wrapping twice
// returns the first wrapper.
func Conservative(t raft.Transport) raft.Transport {
	if _, ok := t.(conservativeMarker); ok {
		return t
	}
	return conservative(t, nil)
}

// ConservativeGated is Conservative, and an append that tells the
// follower the leader's commit index c (AppendEntriesRequest's
// LeaderCommitIndex) is sent only once gate(c) returned nil; an error
// from gate is the append's. A leader that syncs its own log behind the
// writer (raftwal's StoreLogsAsync) passes its log's WaitDurable, so no
// follower applies an entry before the leader's disk holds it
// (internal/pool/dbraft). Heartbeats carry no commit index and are not
// held. A wrapper from Conservative is unwrapped first.
func ConservativeGated(t raft.Transport, gate func(commit uint64) error) raft.Transport {
	return conservative(Unwrap(t), gate)
}

func conservative(t raft.Transport, gate func(uint64) error) raft.Transport {
	if t == nil {
		return nil
	}
	b := base{Transport: t}
	if gate != nil {
		b.gate = &commitGate{gate}
	}
	c, hasC := t.(raft.WithClose)
	v, hasV := t.(raft.WithPreVote)
	p, hasP := t.(raft.WithPeers)
	pe := peers{p}
	switch {
	case hasC && hasV && hasP:
		return struct {
			base
			raft.WithClose
			raft.WithPreVote
			peers
		}{b, c, v, pe}
	case hasC && hasV:
		return struct {
			base
			raft.WithClose
			raft.WithPreVote
		}{b, c, v}
	case hasC && hasP:
		return struct {
			base
			raft.WithClose
			peers
		}{b, c, pe}
	case hasV && hasP:
		return struct {
			base
			raft.WithPreVote
			peers
		}{b, v, pe}
	case hasC:
		return struct {
			base
			raft.WithClose
		}{b, c}
	case hasV:
		return struct {
			base
			raft.WithPreVote
		}{b, v}
	case hasP:
		return struct {
			base
			peers
		}{b, pe}
	default:
		return b
	}
}

// Unwrap returns the transport a Conservative wrapper forwards to,
// or t itself when it is not such a wrapper.
func Unwrap(t raft.Transport) raft.Transport {
	if w, ok := t.(conservativeMarker); ok {
		return w.Unwrap()
	}
	return t
}

type conservativeMarker interface {
	raft.Transport
	Unwrap() raft.Transport
	conservative()
}

// base forwards raft.Transport except SetHeartbeatHandler, holding
// appends for gate (nil: none).
type base struct {
	raft.Transport
	gate *commitGate // a pointer: wrappers stay comparable
}

type commitGate struct{ wait func(commit uint64) error }

// SetHeartbeatHandler ignores the callback: heartbeats stay on the
// consumer channel and so on raft's main goroutine.
func (base) SetHeartbeatHandler(func(raft.RPC)) {}

func (b base) Unwrap() raft.Transport { return b.Transport }

func (base) conservative() {}

// The methods below are spelled out so that the embedding structs get
// them at depth one from base, never ambiguously: they all forward.

func (b base) Consumer() <-chan raft.RPC              { return b.Transport.Consumer() }
func (b base) LocalAddr() raft.ServerAddress          { return b.Transport.LocalAddr() }
func (b base) DecodePeer(p []byte) raft.ServerAddress { return b.Transport.DecodePeer(p) }

func (b base) EncodePeer(id raft.ServerID, addr raft.ServerAddress) []byte {
	return b.Transport.EncodePeer(id, addr)
}

// AppendEntriesPipeline refuses: raft then replicates without a pipeline
// (see Conservative).
func (base) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}

func (b base) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if b.gate != nil && args.LeaderCommitIndex > 0 {
		if err := b.gate.wait(args.LeaderCommitIndex); err != nil {
			return err
		}
	}
	return b.Transport.AppendEntries(id, target, args, resp)
}

func (b base) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	return b.Transport.RequestVote(id, target, args, resp)
}

func (b base) InstallSnapshot(id raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest, resp *raft.InstallSnapshotResponse, data io.Reader) error {
	return b.Transport.InstallSnapshot(id, target, args, resp, data)
}

func (b base) TimeoutNow(id raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	return b.Transport.TimeoutNow(id, target, args, resp)
}

// peers forwards raft.WithPeers, unwrapping the transport given to
// Connect: raft's InmemTransport only connects to another
// *raft.InmemTransport.
type peers struct{ p raft.WithPeers }

func (p peers) Connect(peer raft.ServerAddress, t raft.Transport) { p.p.Connect(peer, Unwrap(t)) }
func (p peers) Disconnect(peer raft.ServerAddress)                { p.p.Disconnect(peer) }
func (p peers) DisconnectAll()                                    { p.p.DisconnectAll() }

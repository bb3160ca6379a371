package raftnet_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"toolstackd/internal/pool/raftnet"
	"toolstackd/internal/pool/raftstore"
	"toolstackd/internal/testkit/rafttest"
)

func raftnetAddr(s string) raft.ServerAddress { return raft.ServerAddress(s) }

// The wrapper keeps exactly the optional interfaces of what it wraps.
func TestConservativeInterfaces(t *testing.T) {
	_, inm := raft.NewInmemTransport("a")
	w := raftnet.Conservative(inm)
	if _, ok := w.(raft.WithClose); !ok {
		t.Error("wrapped InmemTransport lost WithClose")
	}
	if _, ok := w.(raft.WithPreVote); !ok {
		t.Error("wrapped InmemTransport lost WithPreVote")
	}
	if _, ok := w.(raft.WithPeers); !ok {
		t.Error("wrapped InmemTransport lost WithPeers")
	}
	if _, ok := w.(raft.LoopbackTransport); !ok {
		t.Error("wrapped InmemTransport is no longer a LoopbackTransport")
	}
	if raftnet.Conservative(w) != w {
		t.Error("wrapping twice made a second wrapper")
	}
	if raftnet.Unwrap(w) != raft.Transport(inm) {
		t.Error("Unwrap did not return the inner transport")
	}
	if raftnet.Conservative(nil) != nil {
		t.Error("wrapping nil is not nil")
	}

	// A transport with none of the optional interfaces gets none.
	bare := struct{ raft.Transport }{inm}
	wb := raftnet.Conservative(bare)
	if _, ok := wb.(raft.WithClose); ok {
		t.Error("wrapper invented WithClose")
	}
	if _, ok := wb.(raft.WithPreVote); ok {
		t.Error("wrapper invented WithPreVote")
	}
	if _, ok := wb.(raft.WithPeers); ok {
		t.Error("wrapper invented WithPeers")
	}
	// Only pre-vote.
	pv := struct {
		raft.Transport
		raft.WithPreVote
	}{inm, inm}
	wpv := raftnet.Conservative(pv)
	if _, ok := wpv.(raft.WithPreVote); !ok {
		t.Error("wrapper lost WithPreVote")
	}
	if _, ok := wpv.(raft.WithClose); ok {
		t.Error("wrapper invented WithClose")
	}

	// Connect accepts a wrapped peer (InmemTransport insists on its own
	// type) and RPCs flow.
	_, inmB := raft.NewInmemTransport("b")
	wB := raftnet.Conservative(inmB)
	w.(raft.WithPeers).Connect("b", wB)
	go func() {
		rpc := <-wB.Consumer()
		rpc.Respond(&raft.RequestVoteResponse{Term: 9, Granted: true}, nil)
	}()
	var resp raft.RequestVoteResponse
	if err := w.RequestVote("b", "b", &raft.RequestVoteRequest{Term: 9}, &resp); err != nil || !resp.Granted {
		t.Fatalf("RequestVote through wrapped transports: %+v, %v", resp, err)
	}
	// No pipelined appends, even where the transport has them.
	if p, err := inm.AppendEntriesPipeline("b", "b"); err != nil {
		t.Fatalf("the in-memory transport has no pipeline to refuse: %v", err)
	} else {
		_ = p.Close()
	}
	if p, err := w.AppendEntriesPipeline("b", "b"); p != nil || !errors.Is(err, raft.ErrPipelineReplicationNotSupported) {
		t.Errorf("AppendEntriesPipeline through the wrapper: %v, %v", p, err)
	}
}

// With the wrapper, a heartbeat reaches the consumer channel (raft's main
// loop) even though raft asked for the fast path.
func TestHeartbeatGoesThroughConsumer(t *testing.T) {
	sec := newSecrets("hb")
	a := startHost(t, "127.0.0.1", sec, nil, nil, 0)
	b := startHost(t, "127.0.0.1", sec, nil, nil, 0)
	logger := hclog.New(&hclog.LoggerOptions{Output: io.Discard})
	ta := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: a.layer, MaxPool: 2, Timeout: 2 * time.Second, Logger: logger})
	tb := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: b.layer, MaxPool: 2, Timeout: 2 * time.Second, Logger: logger})
	defer ta.Close()
	defer tb.Close()
	wa := raftnet.Conservative(ta)
	var fast atomic.Int32
	wa.SetHeartbeatHandler(func(rpc raft.RPC) {
		fast.Add(1)
		rpc.Respond(&raft.AppendEntriesResponse{Success: true}, nil)
	})
	go func() {
		rpc := <-wa.Consumer()
		rpc.Respond(&raft.AppendEntriesResponse{Term: 3, Success: true}, nil)
	}()
	hb := &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ID: []byte("b"), Addr: []byte(b.addr)},
		Term:      3,
	}
	var resp raft.AppendEntriesResponse
	if err := tb.AppendEntries("a", raftnetAddr(a.addr), hb, &resp); err != nil {
		t.Fatal(err)
	}
	if fast.Load() != 0 || resp.Term != 3 {
		t.Fatalf("heartbeat took the fast path (%d calls, resp %+v)", fast.Load(), resp)
	}
	// Control: the same request to an unwrapped transport does take the
	// fast path, so it is a heartbeat in raft's eyes.
	tb.SetHeartbeatHandler(func(rpc raft.RPC) {
		fast.Add(1)
		rpc.Respond(&raft.AppendEntriesResponse{Term: 4, Success: true}, nil)
	})
	hb.RPCHeader = raft.RPCHeader{ID: []byte("a"), Addr: []byte(a.addr)}
	if err := ta.AppendEntries("b", raftnetAddr(b.addr), hb, &resp); err != nil {
		t.Fatal(err)
	}
	if fast.Load() != 1 || resp.Term != 4 {
		t.Fatalf("unwrapped transport: fast path %d calls, resp %+v", fast.Load(), resp)
	}
}

// netNode is one raft node on a real StreamLayer.
type netNode struct {
	id    raft.ServerID
	host  *host
	trans *raft.NetworkTransport
	store *raftstore.Store
	fsm   *rafttest.FSM
	raft  *raft.Raft
}

// startNetCluster runs 3 raft nodes on 127.0.0.1..3, each on its own HTTP
// listener with the raft stream mounted, over NetworkTransport wrapped in
// Conservative, with raftstore files.
func startNetCluster(t testing.TB) []*netNode {
	sec := newSecrets("cluster-secret")
	var nodes []*netNode
	var servers []raft.Server
	logger := hclog.New(&hclog.LoggerOptions{Output: io.Discard, Level: hclog.Warn})
	if os.Getenv("RAFTTEST_LOG") == "1" {
		logger = hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Warn})
	}
	for i := range 3 {
		h := startHost(t, "127.0.0."+strconv.Itoa(i+1), sec, nil, nil, 0)
		n := &netNode{id: raft.ServerID(fmt.Sprintf("n%d", i)), host: h}
		n.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
			Stream: h.layer, MaxPool: 3, Timeout: 5 * time.Second, Logger: logger,
		})
		st, err := raftstore.Open(t.TempDir(), raftstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		n.store = st
		nodes = append(nodes, n)
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: n.id, Address: raft.ServerAddress(h.addr)})
	}
	for _, n := range nodes {
		conf := rafttest.Config(n.id, time.Second)
		conf.Logger = logger
		snaps, err := raft.NewFileSnapshotStore(t.TempDir(), 2, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		trans := raftnet.Conservative(n.trans)
		if err := raft.BootstrapCluster(conf, n.store, n.store, snaps, trans, raft.Configuration{Servers: servers}); err != nil {
			t.Fatal(err)
		}
		n.fsm = rafttest.NewFSM()
		r, err := raft.NewRaft(conf, n.fsm, n.store, n.store, snaps, trans)
		if err != nil {
			t.Fatal(err)
		}
		n.raft = r
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.raft.Shutdown().Error()
			n.trans.Close()
			n.store.Close()
		}
	})
	return nodes
}

func waitNetLeader(t testing.TB, nodes []*netNode) *netNode {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range nodes {
			if n.raft.State() == raft.Leader {
				return n
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no leader elected over the stream layer")
	return nil
}

// currentLeader is the node that leads now, waiting up to bound for one
// (nil if none did).
func currentLeader(nodes []*netNode, bound time.Duration) *netNode {
	deadline := time.Now().Add(bound)
	for {
		for _, n := range nodes {
			if n.raft.State() == raft.Leader {
				return n
			}
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// leadershipMoved reports an Apply refused because the node it was made
// on is no longer (or not yet) the leader: a client tries the new one.
func leadershipMoved(err error) bool {
	return errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipTransferInProgress)
}

// apply commits cmd as a client of the cluster does: through the leader,
// and through the next one when leadership moves under it (a loaded
// machine can starve a heartbeat), for up to a minute. It returns how
// many times it had to try again.
func apply(nodes []*netNode, cmd []byte, timeout time.Duration) (retries int, err error) {
	deadline := time.Now().Add(time.Minute)
	for {
		leader := currentLeader(nodes, 15*time.Second)
		if leader == nil {
			return retries, errors.New("no leader")
		}
		err = leader.raft.Apply(cmd, timeout).Error()
		if err == nil || !leadershipMoved(err) || time.Now().After(deadline) {
			return retries, err
		}
		retries++
	}
}

// drive runs writers concurrent writers through the leader for d and
// returns the acknowledged commits per second (writes retried after a
// change of leader count once, with the time they took).
func drive(t testing.TB, nodes []*netNode, writers int, d time.Duration, prefix string) float64 {
	var n, retried atomic.Int64
	var failed atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range writers {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				r, err := apply(nodes, rafttest.EncodePut(fmt.Sprintf("%s-%d-%d", prefix, w, i), "v"), 5*time.Second)
				retried.Add(int64(r))
				if err != nil {
					failed.Add(1)
					continue
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Errorf("%d writes failed", failed.Load())
	}
	if retried.Load() > 0 {
		t.Logf("%s: %d writes tried again after leadership moved", prefix, retried.Load())
	}
	return float64(n.Load()) / time.Since(start).Seconds()
}

// TestNetCluster elects a leader among 3 nodes talking over the stream
// layer on real loopback HTTP, replicates 1000 commands to every node and
// measures commits/s with 1 and 16 writers (logged; RAFTNET_MEASURE sets
// the measuring time per figure, default 2s).
func TestNetCluster(t *testing.T) {
	nodes := startNetCluster(t)
	waitNetLeader(t, nodes)

	const commands = 1000
	var wg sync.WaitGroup
	errs := make(chan error, commands)
	sem := make(chan struct{}, 16)
	for i := range commands {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := apply(nodes, rafttest.EncodePut(fmt.Sprintf("k%d", i), strconv.Itoa(i)), 10*time.Second); err != nil {
				errs <- fmt.Errorf("command %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	leader := currentLeader(nodes, 15*time.Second)
	if leader == nil {
		t.Fatal("no leader after the writes")
	}
	if err := leader.raft.Barrier(10 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	want := leader.fsm.LastApplied()
	deadline := time.Now().Add(15 * time.Second)
	for _, n := range nodes {
		for n.fsm.LastApplied() != want && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n.fsm.Len() != commands {
			t.Fatalf("%s has %d keys, want %d", n.id, n.fsm.Len(), commands)
		}
		for i := range commands {
			if v, _ := n.fsm.Get(fmt.Sprintf("k%d", i)); v != strconv.Itoa(i) {
				t.Fatalf("%s: k%d = %q", n.id, i, v)
			}
		}
		if a, b := n.fsm.Applied(), leader.fsm.Applied(); len(a) != len(b) {
			t.Fatalf("%s applied %d entries, leader %d", n.id, len(a), len(b))
		} else {
			for i := range a {
				if a[i] != b[i] {
					t.Fatalf("%s applied entry %d = %+v, leader %+v", n.id, i, a[i], b[i])
				}
			}
		}
	}

	d := 2 * time.Second
	if s := os.Getenv("RAFTNET_MEASURE"); s != "" {
		if v, err := time.ParseDuration(s); err == nil {
			d = v
		}
	}
	if testing.Short() {
		d = 500 * time.Millisecond
	}
	one := drive(t, nodes, 1, d, "one")
	sixteen := drive(t, nodes, 16, d, "sixteen")
	t.Logf("3 nodes over the HTTP stream layer, fsync, Conservative: %.0f commits/s with 1 writer, %.0f with 16", one, sixteen)
}

// ConservativeGated holds an append that carries a commit index until
// the gate passes it, returns the gate's error, and lets heartbeats
// (no commit index) through untouched.
func TestGatedAppendWaitsForTheGate(t *testing.T) {
	_, a := raft.NewInmemTransport("a")
	_, b := raft.NewInmemTransport("b")
	a.Connect("b", b)
	go func() {
		for rpc := range b.Consumer() {
			rpc.Respond(&raft.AppendEntriesResponse{Success: true}, nil)
		}
	}()
	release := make(chan struct{})
	var asked []uint64
	var mu sync.Mutex
	refuse := errors.New("the log failed")
	w := raftnet.ConservativeGated(a, func(commit uint64) error {
		mu.Lock()
		asked = append(asked, commit)
		mu.Unlock()
		if commit == 99 {
			return refuse
		}
		<-release
		return nil
	})
	var resp raft.AppendEntriesResponse
	if err := w.AppendEntries("b", "b", &raft.AppendEntriesRequest{Term: 1}, &resp); err != nil || !resp.Success {
		t.Fatalf("heartbeat: %v %+v", err, resp)
	}
	done := make(chan error, 1)
	go func() {
		done <- w.AppendEntries("b", "b", &raft.AppendEntriesRequest{Term: 1, LeaderCommitIndex: 7}, &raft.AppendEntriesResponse{})
	}()
	select {
	case err := <-done:
		t.Fatalf("an append with commit index 7 was sent before the gate passed it (%v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := w.AppendEntries("b", "b", &raft.AppendEntriesRequest{Term: 1, LeaderCommitIndex: 99}, &resp); !errors.Is(err, refuse) {
		t.Fatalf("the gate's error: got %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(asked) != "[7 99]" {
		t.Fatalf("gate asked for %v, want [7 99] (never for the heartbeat)", asked)
	}
	if raftnet.Unwrap(w) != raft.Transport(a) {
		t.Fatal("Unwrap of a gated wrapper")
	}
}

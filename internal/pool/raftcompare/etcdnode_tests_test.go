package raftcompare

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

func ents(from, to, term uint64) []raftpb.Entry {
	var e []raftpb.Entry
	for i := from; i <= to; i++ {
		e = append(e, raftpb.Entry{Index: i, Term: term, Type: raftpb.EntryNormal, Data: []byte{byte(i)}})
	}
	return e
}

// The node's disk keeps its log and hard state across a reopen,
// replaces a conflicting tail, bounds the commit index by the log, and
// survives a torn hard-state slot by reading the other one.
func TestDiskRecovers(t *testing.T) {
	dir := t.TempDir()
	d, had, err := openDisk(dir)
	if err != nil {
		t.Fatal(err)
	}
	if had {
		t.Fatal("a fresh directory has state")
	}
	if err := d.appendEntries(ents(1, 5, 1)); err != nil {
		t.Fatal(err)
	}
	if err := d.writeHardState(raftpb.HardState{Term: 1, Vote: 2, Commit: 3}); err != nil {
		t.Fatal(err)
	}
	if err := d.writeHardState(raftpb.HardState{Term: 2, Vote: 1, Commit: 9}); err != nil {
		t.Fatal(err)
	}
	// A deposed leader's entries 4 and 5 are replaced by the new term's.
	if err := d.appendEntries(ents(4, 6, 2)); err != nil {
		t.Fatal(err)
	}
	if err := d.appendEntries(ents(8, 8, 2)); err == nil {
		t.Error("an append leaving a gap was accepted")
	}
	if err := d.close(); err != nil {
		t.Fatal(err)
	}

	d, had, err = openDisk(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !had {
		t.Fatal("reopened disk has no state")
	}
	if want := (raftpb.HardState{Term: 2, Vote: 1, Commit: 5}); d.hs != want {
		t.Errorf("hard state %+v, want %+v (commit bounded by the log at the time)", d.hs, want)
	}
	last, _ := d.mem.LastIndex()
	if last != 6 || d.last != 6 {
		t.Fatalf("last index %d (disk %d), want 6", last, d.last)
	}
	got, err := d.mem.Entries(1, 7, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range got {
		want := uint64(1)
		if e.Index >= 4 {
			want = 2
		}
		if e.Term != want || len(e.Data) != 1 || e.Data[0] != byte(e.Index) {
			t.Errorf("entry %d: term %d data %v", e.Index, e.Term, e.Data)
		}
	}
	if err := d.close(); err != nil {
		t.Fatal(err)
	}

	// Tear the newer slot (sequence 2, slot 0): the older one is read.
	f, err := os.OpenFile(filepath.Join(dir, hsName), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff, 0xff}, 20); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	d, _, err = openDisk(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.close() }()
	if want := (raftpb.HardState{Term: 1, Vote: 2, Commit: 3}); d.hs != want {
		t.Errorf("after a torn slot: hard state %+v, want %+v", d.hs, want)
	}
}

// Three etcd nodes replicate concurrent writes in one order; a follower
// stopped and started again from its directory has every entry it had
// applied on disk and catches up with what it missed.
func TestEtcdReplicatesAndRestarts(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) { testEtcdReplicatesAndRestarts(t, mode.async) })
	}
}

// modes are the two ways the etcd nodes drive raft: the Ready loop
// with Advance, and AsyncStorageWrites.
var modes = []struct {
	name  string
	async bool
}{{"ready-loop", false}, {"async-writes", true}}

func testEtcdReplicatesAndRestarts(t *testing.T, async bool) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c, err := startEtcdCluster(ctx, dirs(t), async)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	leader := c.Leader()
	write := func(writers, each int) {
		var wg sync.WaitGroup
		for range writers {
			wg.Go(func() {
				for range each {
					wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
					err := leader.Write(wctx, cmdBytes)
					wcancel()
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	write(16, 20)
	if err := c.converged(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(leader.Applied()); n != 320 {
		t.Fatalf("leader applied %d writes, want 320", n)
	}

	// Stop the third node and look at its disk.
	follower := c.nodes[2]
	applied := follower.Applied()
	follower.Stop()
	d, _, err := openDisk(c.dirs[2])
	if err != nil {
		t.Fatal(err)
	}
	onDisk := map[uint64]bool{}
	for i := uint64(1); i <= d.last; i++ {
		es, err := d.mem.Entries(i, i+1, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if es[0].Type == raftpb.EntryNormal && len(es[0].Data) >= 8 {
			onDisk[binary.BigEndian.Uint64(es[0].Data)] = true
		}
	}
	_ = d.close()
	for _, id := range applied {
		if !onDisk[id] {
			t.Fatalf("write %#x was applied by the follower but is not on its disk", id)
		}
	}

	write(4, 25) // while it is down
	if err := c.restart(2); err != nil {
		t.Fatal(err)
	}
	if err := c.converged(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(c.nodes[2].Applied()); n != 420 {
		t.Errorf("restarted follower applied %d writes, want 420", n)
	}
}

// The transport closes a connection that sends a frame over the bound,
// a frame that is not a message, or a message for another node, and
// hands a good message to the node.
func TestTransportRefusesBadFrames(t *testing.T) {
	ln, err := listen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	tr := newTransport(1, ln, nil)
	got := make(chan raftpb.Message, 1)
	tr.step = func(_ context.Context, m raftpb.Message) error { got <- m; return nil }
	tr.unreachable = func(uint64) {}
	tr.start()
	defer tr.close()

	closed := func(name string, b []byte) {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("%s: connection not closed by the node (%v)", name, err)
		}
	}
	huge := binary.BigEndian.AppendUint32(nil, maxFrame+1)
	closed("oversized frame", huge)
	closed("garbage", append(binary.BigEndian.AppendUint32(nil, 3), 0xff, 0xff, 0xff))
	other, err := frame(raftpb.Message{Type: raftpb.MsgHeartbeat, To: 2, From: 3})
	if err != nil {
		t.Fatal(err)
	}
	closed("message for another node", other)

	good, err := frame(raftpb.Message{Type: raftpb.MsgHeartbeat, To: 1, From: 3, Term: 7})
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Write(good); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m.Type != raftpb.MsgHeartbeat || m.From != 3 || m.Term != 7 {
			t.Errorf("node was handed %+v", m)
		}
	case <-time.After(5 * time.Second):
		t.Error("a good message did not reach the node")
	}
	select {
	case m := <-got:
		t.Errorf("a refused frame reached the node: %+v", m)
	default:
	}
}

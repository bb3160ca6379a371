package raftcompare

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	hraft "github.com/hashicorp/raft"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"toolstackd/internal/pool/raftwal"
)

// maxFrame bounds one message on the wire.
const maxFrame = 16 << 20

// storageQueue bounds the writes and applications waiting for the
// storage goroutines of a node with AsyncStorageWrites.
const storageQueue = 256

// peerQueue bounds the messages waiting to go to one peer.
const peerQueue = 1024

// tick is the raft clock; elections after 100 ticks (1 s, as the
// hashicorp clusters) and heartbeats every 10.
const tick = 10 * time.Millisecond

// ---- disk: one node's durable state ----

// disk is a node's log (raftwal) and hard state (two slots in a file),
// with a raft.MemoryStorage mirroring the log for raft to read.
type disk struct {
	wal  *raftwal.WAL
	hsf  *os.File
	mem  *raft.MemoryStorage
	seq  uint64 // sequence of the last hard-state slot written
	last uint64 // last index durable in the wal
	hs   raftpb.HardState
}

const (
	hsName     = "hardstate"
	hsSlot     = 64
	hsRecBytes = 8 * 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// openDisk opens (creating them if needed) the log and hard state in
// dir and loads both into a fresh MemoryStorage. It reports whether
// there was any state.
func openDisk(dir string) (*disk, bool, error) {
	if err := os.MkdirAll(filepath.Join(dir, "wal"), 0o700); err != nil {
		return nil, false, err
	}
	w, err := raftwal.Open(filepath.Join(dir, "wal"), raftwal.Options{})
	if err != nil {
		return nil, false, err
	}
	f, err := os.OpenFile(filepath.Join(dir, hsName), os.O_RDWR|os.O_CREATE, 0o600) //nolint:gosec // a test's temporary directory
	if err != nil {
		_ = w.Close()
		return nil, false, err
	}
	d := &disk{wal: w, hsf: f, mem: raft.NewMemoryStorage()}
	if err := d.load(); err != nil {
		_ = d.close()
		return nil, false, err
	}
	return d, d.last > 0 || !raft.IsEmptyHardState(d.hs), nil
}

func (d *disk) load() error {
	first, err := d.wal.FirstIndex()
	if err != nil {
		return err
	}
	last, err := d.wal.LastIndex()
	if err != nil {
		return err
	}
	if first > 1 {
		return fmt.Errorf("log starts at %d: compaction is not supported here", first)
	}
	var ents []raftpb.Entry
	for i := first; i <= last && last > 0; i++ {
		var l hraft.Log
		if err := d.wal.GetLog(i, &l); err != nil {
			return err
		}
		var e raftpb.Entry
		if err := e.Unmarshal(l.Data); err != nil {
			return fmt.Errorf("entry %d: %w", i, err)
		}
		if e.Index != i {
			return fmt.Errorf("record %d holds entry %d", i, e.Index)
		}
		ents = append(ents, e)
	}
	if err := d.mem.Append(ents); err != nil {
		return err
	}
	d.last = last
	var best []byte
	for slot := range 2 {
		b := make([]byte, hsRecBytes+4)
		if _, err := d.hsf.ReadAt(b, int64(slot*hsSlot)); err != nil {
			continue // short file: slot never written
		}
		if crc32.Checksum(b[:hsRecBytes], castagnoli) != binary.BigEndian.Uint32(b[hsRecBytes:]) {
			continue // torn or never written
		}
		if best == nil || binary.BigEndian.Uint64(b) > binary.BigEndian.Uint64(best) {
			best = b
		}
	}
	if best != nil {
		d.seq = binary.BigEndian.Uint64(best)
		d.hs = raftpb.HardState{
			Term:   binary.BigEndian.Uint64(best[8:]),
			Vote:   binary.BigEndian.Uint64(best[16:]),
			Commit: binary.BigEndian.Uint64(best[24:]),
		}
		if d.hs.Commit > d.last {
			return fmt.Errorf("hard state commits %d beyond the log's end %d", d.hs.Commit, d.last)
		}
		if err := d.mem.SetHardState(d.hs); err != nil {
			return err
		}
	}
	return nil
}

// appendEntries makes ents durable, replacing any entries from the
// first one's index on (a deposed leader's conflicting tail).
func (d *disk) appendEntries(ents []raftpb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	from := ents[0].Index
	if from > d.last+1 {
		return fmt.Errorf("entries from %d leave a gap after %d", from, d.last)
	}
	if from <= d.last {
		if err := d.wal.DeleteRange(from, d.last); err != nil {
			return err
		}
	}
	logs := make([]*hraft.Log, len(ents))
	for i := range ents {
		data, err := ents[i].Marshal()
		if err != nil {
			return err
		}
		logs[i] = &hraft.Log{Index: ents[i].Index, Term: ents[i].Term, Type: hraft.LogCommand, Data: data}
	}
	if err := d.wal.StoreLogs(logs); err != nil {
		return err
	}
	d.last = ents[len(ents)-1].Index
	return d.mem.Append(ents)
}

// writeHardState makes hs durable in the older of the two slots, with
// its commit index no further than the log on disk reaches.
func (d *disk) writeHardState(hs raftpb.HardState) error {
	hs.Commit = min(hs.Commit, d.last)
	d.seq++
	b := make([]byte, hsRecBytes+4)
	binary.BigEndian.PutUint64(b, d.seq)
	binary.BigEndian.PutUint64(b[8:], hs.Term)
	binary.BigEndian.PutUint64(b[16:], hs.Vote)
	binary.BigEndian.PutUint64(b[24:], hs.Commit)
	binary.BigEndian.PutUint32(b[hsRecBytes:], crc32.Checksum(b[:hsRecBytes], castagnoli))
	if _, err := d.hsf.WriteAt(b, int64((d.seq%2)*hsSlot)); err != nil {
		return err
	}
	if err := fdatasync(d.hsf); err != nil {
		return err
	}
	d.hs = hs
	return nil
}

func (d *disk) close() error {
	return errors.Join(d.wal.Close(), d.hsf.Close())
}

func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// ---- transport: length-prefixed raftpb.Message over loopback TCP ----

type transport struct {
	self  uint64
	ln    net.Listener
	peers map[uint64]*peer
	// step hands a received message to the node; unreachable reports a
	// message that could not be sent.
	step        func(context.Context, raftpb.Message) error
	unreachable func(uint64)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
}

type peer struct {
	id   uint64
	addr string
	q    chan []byte
}

func listen(ip string) (net.Listener, error) {
	return net.Listen("tcp", net.JoinHostPort(ip, "0"))
}

// newTransport serves ln and sends to addrs (node id to address, self
// excluded). Call start once step and unreachable are set.
func newTransport(self uint64, ln net.Listener, addrs map[uint64]string) *transport {
	ctx, cancel := context.WithCancel(context.Background())
	t := &transport{self: self, ln: ln, peers: map[uint64]*peer{}, ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
	for id, a := range addrs {
		if id != self {
			t.peers[id] = &peer{id: id, addr: a, q: make(chan []byte, peerQueue)}
		}
	}
	return t
}

func (t *transport) start() {
	t.wg.Go(t.accept)
	for _, p := range t.peers {
		t.wg.Go(func() { t.sendLoop(p) })
	}
}

// frame marshals m behind its length. It runs in the Ready loop, as
// etcd's documentation asks (entries must not change while marshalled).
func frame(m raftpb.Message) ([]byte, error) {
	n := m.Size()
	if n > maxFrame {
		return nil, fmt.Errorf("message of %d bytes", n)
	}
	b := make([]byte, 4+n)
	binary.BigEndian.PutUint32(b, uint32(n)) //nolint:gosec // bounded by maxFrame
	if _, err := m.MarshalTo(b[4:]); err != nil {
		return nil, err
	}
	return b, nil
}

// send queues a framed message for its peer, dropping it when the
// queue is full.
func (t *transport) send(to uint64, b []byte) {
	p := t.peers[to]
	if p == nil {
		return
	}
	select {
	case p.q <- b:
	default:
		t.unreachable(to)
	}
}

func (t *transport) sendLoop(p *peer) {
	var conn net.Conn
	var w *bufio.Writer
	defer func() {
		if conn != nil {
			_ = conn.Close()
		}
	}()
	for {
		var b []byte
		select {
		case <-t.ctx.Done():
			return
		case b = <-p.q:
		}
		if conn == nil {
			d := net.Dialer{Timeout: time.Second}
			c, err := d.DialContext(t.ctx, "tcp", p.addr)
			if err != nil {
				t.unreachable(p.id)
				continue
			}
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetNoDelay(true)
			}
			conn, w = c, bufio.NewWriterSize(c, 64<<10)
		}
		_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, err := w.Write(b)
		// Write whatever else is queued, then flush once.
		for more := true; more && err == nil; {
			select {
			case b = <-p.q:
				_, err = w.Write(b)
			default:
				more = false
			}
		}
		if err == nil {
			err = w.Flush()
		}
		if err != nil {
			_ = conn.Close()
			conn = nil
			t.unreachable(p.id)
		}
	}
}

func (t *transport) accept() {
	for {
		c, err := t.ln.Accept()
		if err != nil {
			return
		}
		t.mu.Lock()
		if t.ctx.Err() != nil {
			t.mu.Unlock()
			_ = c.Close()
			return
		}
		t.conns[c] = struct{}{}
		t.mu.Unlock()
		t.wg.Go(func() {
			defer func() {
				t.mu.Lock()
				delete(t.conns, c)
				t.mu.Unlock()
				_ = c.Close()
			}()
			_ = t.serve(c)
		})
	}
}

// serve reads frames from one connection until it fails; a frame that
// is too long, does not decode or is addressed elsewhere ends it.
func (t *transport) serve(c net.Conn) error {
	r := bufio.NewReaderSize(c, 64<<10)
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > maxFrame {
			return fmt.Errorf("frame of %d bytes", n)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return err
		}
		var m raftpb.Message
		if err := m.Unmarshal(b); err != nil {
			return err
		}
		if m.To != t.self {
			return fmt.Errorf("message for %d on %d's connection", m.To, t.self)
		}
		if err := t.step(t.ctx, m); err != nil {
			return err
		}
	}
}

func (t *transport) close() {
	t.mu.Lock()
	t.cancel()
	for c := range t.conns {
		_ = c.Close()
	}
	t.mu.Unlock()
	_ = t.ln.Close()
	t.wg.Wait()
}

// ---- node: the Ready loop ----

type etcdNode struct {
	id   uint64
	disk *disk
	node raft.Node
	tr   *transport

	mu      sync.Mutex
	waiters map[uint64]chan struct{}
	applied []uint64 // proposal ids in the order applied
	err     error    // the first thing that went wrong in the loop

	// With AsyncStorageWrites, the Ready loop hands writes and
	// applications to two goroutines through these bounded queues.
	async    bool
	toAppend chan raftpb.Message
	toApply  chan raftpb.Message
	threads  sync.WaitGroup

	nextID  atomic.Uint64
	stats   loopStats
	stop    chan struct{}
	stopped chan struct{}
}

// traceHook, when set before a cluster starts (and cleared only after
// it stopped), is told when each proposal reaches a node's Ready
// and its write there begins ("writing"), is on its disk ("synced") and is applied ("applied").
var traceHook func(node uint64, stage string, pid uint64)

var quietLogger = &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}

// startEtcdNode starts node id on the listener, with its state in dir
// (a fresh node bootstraps the cluster of ids; a node with state
// restarts from it).
func startEtcdNode(id uint64, dir string, ln net.Listener, addrs map[uint64]string, ids []uint64, async bool) (*etcdNode, error) {
	d, had, err := openDisk(dir)
	if err != nil {
		return nil, err
	}
	c := &raft.Config{
		ID:              id,
		ElectionTick:    100,
		HeartbeatTick:   10,
		Storage:         d.mem,
		MaxSizePerMsg:   1 << 20,
		MaxInflightMsgs: 256,
		CheckQuorum:     true,
		PreVote:         true,
		Logger:          quietLogger,

		AsyncStorageWrites: async,
	}
	n := &etcdNode{
		id: id, disk: d, async: async, waiters: map[uint64]chan struct{}{},
		stop: make(chan struct{}), stopped: make(chan struct{}),
		toAppend: make(chan raftpb.Message, storageQueue), toApply: make(chan raftpb.Message, storageQueue),
	}
	if had {
		n.node = raft.RestartNode(c)
	} else {
		var peers []raft.Peer
		for _, p := range ids {
			peers = append(peers, raft.Peer{ID: p})
		}
		n.node = raft.StartNode(c, peers)
	}
	n.tr = newTransport(id, ln, addrs)
	n.tr.step = n.node.Step
	n.tr.unreachable = n.node.ReportUnreachable
	n.tr.start()
	if async {
		n.threads.Go(n.appendThread)
		n.threads.Go(n.applyThread)
		go n.runAsync()
	} else {
		go n.run()
	}
	return n, nil
}

func (n *etcdNode) fail(err error) {
	n.mu.Lock()
	if n.err == nil {
		n.err = err
	}
	n.mu.Unlock()
}

// Err is the first failure of the node's loop, if any.
func (n *etcdNode) Err() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.err
}

// dependsOnWrite: the messages raft queues until the batch's entries and
// hard state are durable (its msgsAfterAppend).
func dependsOnWrite(t raftpb.MessageType) bool {
	return t == raftpb.MsgAppResp || t == raftpb.MsgVoteResp || t == raftpb.MsgPreVoteResp
}

func (n *etcdNode) run() {
	n.loop(func(rd raft.Ready) bool {
		if err := n.handle(rd); err != nil {
			n.fail(err)
			n.node.Stop()
			<-n.stop
			return false
		}
		n.node.Advance()
		return true
	})
}

// loop ticks the node and hands each Ready to ready until the node is
// stopped or ready returns false (having stopped it).
func (n *etcdNode) loop(ready func(rd raft.Ready) bool) {
	defer close(n.stopped)
	tk := time.NewTicker(tick)
	defer tk.Stop()
	for {
		select {
		case <-n.stop:
			n.node.Stop()
			return
		case <-tk.C:
			n.node.Tick()
		case rd := <-n.node.Ready():
			if !ready(rd) {
				return
			}
		}
	}
}

// loopStats counts what the Ready loop did, for the figures' notes.
type loopStats struct {
	readies   atomic.Int64 // log writes (each one sync)
	entries   atomic.Int64 // entries written
	writeTime atomic.Int64 // nanoseconds in the log's writes
}

func (s *loopStats) snapshot() (readies, entries int64, write time.Duration) {
	return s.readies.Load(), s.entries.Load(), time.Duration(s.writeTime.Load())
}

// runAsync is the Ready loop with AsyncStorageWrites (etcd raft's
// doc.go, "Usage with Asynchronous Storage Writes"): no Advance; the
// batch's write and its applications arrive as messages to the local
// append and apply threads, each carrying the responses to deliver once
// it is done. Everything else goes to the network at once, so the
// leader's appends travel while its own write runs, and a node may
// have several writes queued behind the one in progress.
func (n *etcdNode) runAsync() {
	n.loop(func(rd raft.Ready) bool {
		for _, m := range rd.Messages {
			var q chan raftpb.Message
			switch m.To {
			case raft.LocalAppendThread:
				q = n.toAppend
			case raft.LocalApplyThread:
				q = n.toApply
			default:
				b, err := frame(m)
				if err != nil {
					n.fail(err)
					continue
				}
				n.tr.send(m.To, b)
				continue
			}
			select {
			case q <- m:
			case <-n.stop:
				n.node.Stop()
				return false
			}
		}
		return true
	})
}

// deliver sends the responses of a finished local write or apply: to
// this node through Step, to others over the network.
func (n *etcdNode) deliver(resps []raftpb.Message) error {
	for _, r := range resps {
		if r.To == n.id {
			if err := n.node.Step(context.Background(), r); err != nil && !errors.Is(err, raft.ErrStopped) {
				return err
			}
			continue
		}
		b, err := frame(r)
		if err != nil {
			return err
		}
		n.tr.send(r.To, b)
	}
	return nil
}

// appendThread writes what the append messages carry. Messages queued
// behind the one it took are written with it, one sync for all (a later
// message's entries may replace the tail of an earlier one's), and then
// their responses are delivered in order.
func (n *etcdNode) appendThread() {
	for {
		var batch []raftpb.Message
		select {
		case <-n.stop:
			return
		case m := <-n.toAppend:
			batch = append(batch, m)
		}
		for more := true; more; {
			select {
			case m := <-n.toAppend:
				batch = append(batch, m)
			default:
				more = false
			}
		}
		if err := n.writeBatch(batch); err != nil {
			n.fail(err)
			return
		}
	}
}

func (n *etcdNode) writeBatch(batch []raftpb.Message) error {
	var ents []raftpb.Entry
	var hs raftpb.HardState
	for _, m := range batch {
		if m.Snapshot != nil && !raft.IsEmptySnap(*m.Snapshot) {
			return errors.New("a snapshot arrived: not supported here")
		}
		if len(m.Entries) > 0 {
			if len(ents) > 0 {
				first := ents[0].Index
				cut := m.Entries[0].Index
				if cut < first {
					ents = ents[:0]
				} else if cut <= ents[len(ents)-1].Index {
					ents = ents[:cut-first]
				}
			}
			ents = append(ents, m.Entries...)
		}
		if h := (raftpb.HardState{Term: m.Term, Vote: m.Vote, Commit: m.Commit}); !raft.IsEmptyHardState(h) {
			hs = h
		}
	}
	if traceHook != nil {
		for _, e := range ents {
			if len(e.Data) >= 8 {
				traceHook(n.id, "writing", binary.BigEndian.Uint64(e.Data))
			}
		}
	}
	if len(ents) > 0 {
		t0 := time.Now()
		if err := n.disk.appendEntries(ents); err != nil {
			return err
		}
		n.stats.readies.Add(1)
		n.stats.entries.Add(int64(len(ents)))
		n.stats.writeTime.Add(int64(time.Since(t0)))
		if traceHook != nil {
			for _, e := range ents {
				if len(e.Data) >= 8 {
					traceHook(n.id, "synced", binary.BigEndian.Uint64(e.Data))
				}
			}
		}
	}
	if !raft.IsEmptyHardState(hs) && (hs.Term != n.disk.hs.Term || hs.Vote != n.disk.hs.Vote) {
		if err := n.disk.writeHardState(hs); err != nil {
			return err
		}
	}
	for _, m := range batch {
		if err := n.deliver(m.Responses); err != nil {
			return err
		}
	}
	return nil
}

func (n *etcdNode) applyThread() {
	for {
		var m raftpb.Message
		select {
		case <-n.stop:
			return
		case m = <-n.toApply:
		}
		if err := n.apply(m.Entries); err != nil {
			n.fail(err)
			return
		}
		if err := n.deliver(m.Responses); err != nil {
			n.fail(err)
			return
		}
	}
}

type outgoing struct {
	to uint64
	b  []byte
}

func (n *etcdNode) handle(rd raft.Ready) error {
	if !raft.IsEmptySnap(rd.Snapshot) {
		return errors.New("a snapshot arrived: not supported here")
	}
	hs := rd.HardState
	termVote := !raft.IsEmptyHardState(hs) && (hs.Term != n.disk.hs.Term || hs.Vote != n.disk.hs.Vote)
	var early, late []outgoing
	for _, m := range rd.Messages {
		b, err := frame(m)
		if err != nil {
			return err
		}
		if termVote || dependsOnWrite(m.Type) {
			late = append(late, outgoing{m.To, b})
		} else {
			early = append(early, outgoing{m.To, b})
		}
	}
	// The leader's appends and heartbeats travel while the batch is
	// written (thesis 10.2.1; etcd raft's doc.go, step 2).
	for _, o := range early {
		n.tr.send(o.to, o.b)
	}
	// Committed entries already on this node's disk are applied before
	// the batch's write (steps 1 and 3 may run in parallel); on the
	// leader that is all of them, so a write is not held behind the
	// next batch's sync. Those in this batch wait for its write, so that
	// what a node applied is always on its disk.
	ready := len(rd.CommittedEntries)
	for i, e := range rd.CommittedEntries {
		if e.Index > n.disk.last {
			ready = i
			break
		}
	}
	if err := n.apply(rd.CommittedEntries[:ready]); err != nil {
		return err
	}
	if traceHook != nil {
		for _, e := range rd.Entries {
			if len(e.Data) >= 8 {
				traceHook(n.id, "writing", binary.BigEndian.Uint64(e.Data))
			}
		}
	}
	if len(rd.Entries) > 0 {
		t0 := time.Now()
		if err := n.disk.appendEntries(rd.Entries); err != nil {
			return err
		}
		n.stats.readies.Add(1)
		n.stats.entries.Add(int64(len(rd.Entries)))
		n.stats.writeTime.Add(int64(time.Since(t0)))
		if traceHook != nil {
			for _, e := range rd.Entries {
				if len(e.Data) >= 8 {
					traceHook(n.id, "synced", binary.BigEndian.Uint64(e.Data))
				}
			}
		}
	}
	if termVote {
		if err := n.disk.writeHardState(hs); err != nil {
			return err
		}
	}
	for _, o := range late {
		n.tr.send(o.to, o.b)
	}
	return n.apply(rd.CommittedEntries[ready:])
}

func (n *etcdNode) apply(ents []raftpb.Entry) error {
	for _, e := range ents {
		switch e.Type {
		case raftpb.EntryConfChange:
			var cc raftpb.ConfChange
			if err := cc.Unmarshal(e.Data); err != nil {
				return err
			}
			n.node.ApplyConfChange(cc)
		case raftpb.EntryConfChangeV2:
			var cc raftpb.ConfChangeV2
			if err := cc.Unmarshal(e.Data); err != nil {
				return err
			}
			n.node.ApplyConfChange(cc)
		case raftpb.EntryNormal:
			if len(e.Data) < 8 {
				continue // the empty entry of a new leader's term
			}
			pid := binary.BigEndian.Uint64(e.Data)
			if traceHook != nil {
				traceHook(n.id, "applied", pid)
			}
			n.mu.Lock()
			n.applied = append(n.applied, pid)
			if ch, ok := n.waiters[pid]; ok {
				close(ch)
				delete(n.waiters, pid)
			}
			n.mu.Unlock()
		}
	}
	return nil
}

// isLeader reports whether raft on this node is the leader.
func (n *etcdNode) isLeader() bool {
	return n.node.Status().RaftState == raft.StateLeader
}

// Write proposes a command of size bytes (at least 8) and waits until
// this node has applied it.
func (n *etcdNode) Write(ctx context.Context, size int) error {
	pid := n.id<<48 | n.nextID.Add(1)
	data := make([]byte, max(size, 8))
	binary.BigEndian.PutUint64(data, pid)
	ch := make(chan struct{})
	n.mu.Lock()
	n.waiters[pid] = ch
	n.mu.Unlock()
	drop := func() {
		n.mu.Lock()
		delete(n.waiters, pid)
		n.mu.Unlock()
	}
	if err := n.node.Propose(ctx, data); err != nil {
		drop()
		return err
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		drop()
		return ctx.Err()
	case <-n.stopped:
		drop()
		return errors.New("node stopped")
	}
}

// Applied is a copy of the proposal ids applied so far, in order.
func (n *etcdNode) Applied() []uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]uint64(nil), n.applied...)
}

// Stop ends the loop and the transport and closes the files; the node's
// listener is closed with its transport.
func (n *etcdNode) Stop() {
	select {
	case <-n.stop:
		return
	default:
	}
	close(n.stop)
	<-n.stopped
	n.threads.Wait()
	n.tr.close()
	_ = n.disk.close()
}

// ---- cluster ----

type etcdCluster struct {
	async bool
	ids   []uint64
	dirs  []string
	addrs map[uint64]string
	nodes []*etcdNode
}

// startEtcdCluster starts 3 nodes on 127.0.0.1–3 with their state in
// dirs and waits for node 1 to lead.
func startEtcdCluster(ctx context.Context, dirs []string, async bool) (*etcdCluster, error) {
	c := &etcdCluster{dirs: dirs, addrs: map[uint64]string{}, async: async}
	var lns []net.Listener
	for i := range dirs {
		ln, err := listen(fmt.Sprintf("127.0.0.%d", i+1))
		if err != nil {
			for _, l := range lns {
				_ = l.Close()
			}
			return nil, err
		}
		lns = append(lns, ln)
		id := uint64(i + 1) //nolint:gosec // small
		c.ids = append(c.ids, id)
		c.addrs[id] = ln.Addr().String()
	}
	for i, id := range c.ids {
		n, err := startEtcdNode(id, dirs[i], lns[i], c.addrs, c.ids, async)
		if err != nil {
			for _, l := range lns[i:] {
				_ = l.Close()
			}
			c.Stop()
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	if err := c.elect(ctx, 0); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// elect asks node i to campaign until it leads.
func (c *etcdCluster) elect(ctx context.Context, i int) error {
	for {
		if c.nodes[i].isLeader() {
			return nil
		}
		_ = c.nodes[i].node.Campaign(ctx)
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %d did not become leader: %w", c.ids[i], ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Leader is the node that leads, or nil.
func (c *etcdCluster) Leader() *etcdNode {
	for _, n := range c.nodes {
		if n != nil && n.isLeader() {
			return n
		}
	}
	return nil
}

// restart stops node i and starts it again from its directory on the
// same address.
func (c *etcdCluster) restart(i int) error {
	c.nodes[i].Stop()
	id := c.ids[i]
	ln, err := net.Listen("tcp", c.addrs[id])
	if err != nil {
		return err
	}
	n, err := startEtcdNode(id, c.dirs[i], ln, c.addrs, c.ids, c.async)
	if err != nil {
		_ = ln.Close()
		return err
	}
	c.nodes[i] = n
	return nil
}

func (c *etcdCluster) Stop() {
	for _, n := range c.nodes {
		if n != nil {
			n.Stop()
		}
	}
}

// Err is the first failure of any node's loop.
func (c *etcdCluster) Err() error {
	for _, n := range c.nodes {
		if err := n.Err(); err != nil {
			return fmt.Errorf("node %d: %w", n.id, err)
		}
	}
	return nil
}

// converged waits until every node has applied what the leader has and
// checks that they applied the same proposals in the same order.
func (c *etcdCluster) converged(ctx context.Context) error {
	want := c.nodes[0].Applied()
	if l := c.Leader(); l != nil {
		want = l.Applied()
	}
	for _, n := range c.nodes {
		for {
			got := n.Applied()
			if len(got) >= len(want) {
				for i := range want {
					if got[i] != want[i] {
						return fmt.Errorf("node %d applied %#x at %d, the leader %#x", n.id, got[i], i, want[i])
					}
				}
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("node %d applied %d of %d: %w", n.id, len(got), len(want), ctx.Err())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return c.Err()
}

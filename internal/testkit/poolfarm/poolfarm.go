// Package poolfarm runs many light simulated hosts of a pool in one
// process: a test tool for measuring a real coordinator with more hosts
// than the machine could run as toolstackd processes (issue 12's 128-host
// figures). Nothing in the daemon imports it.
//
// # What a light host is
//
// Each light host has its own loopback address (Options.Base, by default
// 127.0.2.2, then 127.0.2.3, ...; pooltest's real hosts are on 127.0.0.N
// and their fault proxies on 127.0.1.N, so nothing collides) and listens
// on the pool's port with a small HTTP server of its own. It joins the
// pool through the coordinator's real POST /pool/join, as pool.join on a
// real host does: it makes its own rows the way a real host's first boot
// makes them (api.FirstBoot into a throw-away in-memory database, then
// the rows pool.join sends: host, host_metrics, host_cpu, control
// domain), sends them with the coordinator's pool-admin credentials, and
// keeps the pool secret of the answer. The coordinator writes those rows
// through raft and adds the host to raft as a non-voter, exactly as for a
// real joiner.
//
// The light host then runs a real hashicorp/raft node (the version the
// daemon uses) as that non-voter, over raftnet's stream layer on its own
// address (so the coordinator dials it with the pool secret as it dials
// any member, and heartbeats go through raft's main loop as on a real
// member), with in-memory log and stable stores. Its state machine applies
// nothing; a snapshot the coordinator installs is read to the end and
// discarded (the bytes cross the network and are counted, nothing is
// kept), and the node compacts its own log often, so 125 of them fit in
// one process however large the pool's database is. Replication,
// heartbeats and the coordinator's liveness bookkeeping (host_metrics.live
// from raft's heartbeat observations) are therefore the real ones.
//
// # What a light host is not
//
// It runs no calls. Its host_metrics say it has little memory free
// (Options.MemoryFree, 16 MiB by default, of 1 GiB), so that placement
// has a reason to prefer the real hosts, and a call the coordinator
// forwards to it (POST /pool/call) is answered 503 "a light simulated
// host runs no calls", which the coordinator reports to its client as
// CANNOT_CONTACT_HOST. Its host.other_config has poolfarm=light so that
// nobody mistakes it for a real host.
//
// It never votes. The coordinator keeps the largest odd number of voters
// up to 5 among all members (pool.MaxVoters), but promotes only members
// that show they are live toolstackd hosts (they answer the coordinator's
// signed check at their own address with their raft state), and a light
// host answers no such check: its raft log is in memory and never
// synced, and a write quorum with it would no longer be a real one. With
// fewer than 5 real hosts the pool keeps fewer voters and the
// coordinator logs each light host as staying a non-voter. Host.Voter
// tells.
//
// # Use
//
//	f, err := poolfarm.New(poolfarm.Options{Coordinator: "127.0.0.2:8080", Port: 8080,
//		Username: "root", Password: pw, Hosts: 123})
//	defer f.Close()
//	err = f.JoinAll(ctx, 1) // one after the other, each timed (Host.JoinTime)
//
// Everything is bounded: connections per light host (MaxConns), the
// join's request and answer, raft's accept queue (raftnet's QueueSize)
// and its log (TrailingLogs).
package poolfarm

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/pool"
	"toolstackd/internal/pool/raftnet"
	"toolstackd/internal/pool/replica"
)

// Bounds.
const (
	// MaxHosts bounds Options.Hosts: one /24 of loopback addresses.
	MaxHosts = 250
	// MaxConns bounds the connections one light host serves at once.
	MaxConns = 32
	// JoinTimeout bounds one host's join, from the request to holding
	// the coordinator's index.
	JoinTimeout = 120 * time.Second
	// maxReply bounds the coordinator's answer to a join.
	maxReply = 1 << 20
)

// Options say how to run a farm.
type Options struct {
	// Coordinator is the coordinator's address ("ip:port"), the one
	// pool.join's master_address would name.
	Coordinator string
	// Port is the pool's port: every light host listens on it.
	Port int
	// Username and Password are the coordinator's pool-admin credentials.
	Username, Password string
	// Hosts is how many light hosts (1 to MaxHosts).
	Hosts int
	// Base is light host 0's address; host i has Base+i. Zero: 127.0.2.2.
	Base netip.Addr
	// MemoryTotal and MemoryFree are what each light host's host_metrics
	// say; zero: 1 GiB and 16 MiB.
	MemoryTotal, MemoryFree int64
	// Tune, if set, adjusts each light host's raft configuration.
	Tune func(*raft.Config)
	// LogOutput receives raft's warnings and errors of every light host;
	// nil: they are dropped.
	LogOutput io.Writer
}

// Farm is a set of light hosts.
type Farm struct {
	opts      Options
	Hosts     []*Host
	closeOnce sync.Once
}

// Host is one light host.
type Host struct {
	// Index is its number in the farm; Addr its "ip:port".
	Index int
	Addr  string
	// UUID is its host uuid (its raft ID), HostRef its host ref; both
	// are set once its rows are made (by Join).
	UUID, HostRef string
	// JoinTime is how long its join took: from sending the request to
	// its raft node holding the index the coordinator answered with.
	JoinTime time.Duration
	// SnapshotBytes counts the snapshot bytes it received and discarded.
	SnapshotBytes atomic.Int64

	farm   *Farm
	ip     netip.Addr
	secret atomic.Pointer[string]
	layer  *raftnet.StreamLayer
	ln     net.Listener
	srv    *http.Server
	mu     sync.Mutex // guards rf
	rf     *raft.Raft
}

// New checks o, listens on every light host's address and serves them
// (each answers raft's upgrade with 403 until it has joined). It fails,
// with nothing left running, when an address cannot be listened on.
func New(o Options) (*Farm, error) {
	if o.Hosts < 1 || o.Hosts > MaxHosts {
		return nil, fmt.Errorf("poolfarm: %d hosts (1 to %d)", o.Hosts, MaxHosts)
	}
	if _, _, err := net.SplitHostPort(o.Coordinator); err != nil {
		return nil, fmt.Errorf("poolfarm: coordinator address %q: %w", o.Coordinator, err)
	}
	if o.Port < 1 || o.Port > 65535 {
		return nil, fmt.Errorf("poolfarm: port %d", o.Port)
	}
	if !o.Base.IsValid() {
		o.Base = netip.AddrFrom4([4]byte{127, 0, 2, 2})
	}
	if !o.Base.Is4() || !o.Base.IsLoopback() || int(o.Base.As4()[3])+o.Hosts > 255 {
		return nil, fmt.Errorf("poolfarm: base address %v for %d hosts: a loopback IPv4 address with room in its /24", o.Base, o.Hosts)
	}
	if o.MemoryTotal <= 0 {
		o.MemoryTotal = 1 << 30
	}
	if o.MemoryFree <= 0 {
		o.MemoryFree = 16 << 20
	}
	f := &Farm{opts: o}
	ip := o.Base
	for i := range o.Hosts {
		h, err := f.serve(i, ip)
		if err != nil {
			_ = f.Close()
			return nil, err
		}
		f.Hosts = append(f.Hosts, h)
		ip = ip.Next()
	}
	return f, nil
}

// serve starts light host i's listener and HTTP server.
func (f *Farm) serve(i int, ip netip.Addr) (*Host, error) {
	h := &Host{Index: i, farm: f, ip: ip, Addr: net.JoinHostPort(ip.String(), strconv.Itoa(f.opts.Port))}
	empty := ""
	h.secret.Store(&empty)
	layer, err := raftnet.NewStreamLayer(raftnet.Config{
		Advertise: h.Addr, LocalAddr: &net.TCPAddr{IP: ip.AsSlice()},
		Secrets: func() []string { return []string{*h.secret.Load()} },
	})
	if err != nil {
		return nil, err
	}
	h.layer = layer
	ln, err := net.Listen("tcp", h.Addr)
	if err != nil {
		return nil, fmt.Errorf("poolfarm: light host %d: %w", i, err)
	}
	h.ln = &limitListener{Listener: ln, slots: make(chan struct{}, MaxConns), done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.Handle(raftnet.Path, layer)
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "a light simulated host (poolfarm) runs no calls", http.StatusServiceUnavailable)
	})
	h.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 16 << 10,
		IdleTimeout: 60 * time.Second}
	go func() { _ = h.srv.Serve(h.ln) }()
	return h, nil
}

// JoinAll joins every host not joined yet, parallel at a time (at least
// one), and returns the first error.
func (f *Farm) JoinAll(ctx context.Context, parallel int) error {
	parallel = max(parallel, 1)
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for _, h := range f.Hosts {
		if h.Joined() {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := h.Join(ctx); err != nil {
				once.Do(func() { first = err })
			}
		}()
	}
	wg.Wait()
	return first
}

// Joined reports whether the host runs raft (its join was answered).
func (h *Host) Joined() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rf != nil
}

// Raft is the host's raft node, nil before it joined.
func (h *Host) Raft() *raft.Raft {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rf
}

// AppliedIndex is the raft index the host's node has applied (0 before
// it joined).
func (h *Host) AppliedIndex() uint64 {
	if rf := h.Raft(); rf != nil {
		return rf.AppliedIndex()
	}
	return 0
}

// LastContact is when the host's node last heard from the leader (zero
// before it joined).
func (h *Host) LastContact() time.Time {
	if rf := h.Raft(); rf != nil {
		return rf.LastContact()
	}
	return time.Time{}
}

// rows makes the host's own rows as a real host's first boot would, with
// the farm's memory figures, and returns them with its uuid and ref.
func (h *Host) rows() ([]*db.Row, string, string, error) {
	o := h.farm.opts
	name := "poolfarm-" + strconv.Itoa(h.Index)
	a := h.ip.As4()
	facts := api.HostFacts{
		Hostname: name, Address: h.ip.String(), Device: "eth0",
		MAC:  fmt.Sprintf("02:00:%02x:%02x:%02x:%02x", a[0], a[1], a[2], a[3]),
		CPUs: 1, CPUModel: "poolfarm light simulated host", CPUVendor: "poolfarm",
		MemTotal: o.MemoryTotal, MemFree: o.MemoryFree,
	}
	rows, uuid, ref, err := HostRows(facts, map[string]string{"poolfarm": "light"})
	if err != nil {
		return nil, "", "", fmt.Errorf("poolfarm: light host %d: %w", h.Index, err)
	}
	return rows, uuid, ref, nil
}

// HostRows are the rows a host whose first boot found facts brings to a
// pool it joins (pool.OwnRows), with otherConfig as its
// host.other_config, and its host uuid and ref: what a join request
// carries for a host that is not a toolstackd process.
func HostRows(facts api.HostFacts, otherConfig map[string]string) (rows []*db.Row, uuid, ref string, err error) {
	d := db.New(dm.Model, db.Options{})
	ref, err = api.FirstBoot(d, facts, api.BootOptions{Hostname: facts.Hostname})
	if err != nil {
		return nil, "", "", fmt.Errorf("first boot: %w", err)
	}
	_, err = d.Update(func(tx *db.Tx) error {
		return tx.Set(dm.Host.OtherConfig, ref, otherConfig)
	})
	if err != nil {
		return nil, "", "", err
	}
	snap := d.Snapshot()
	host, ok := snap.Get(dm.Host.Class, ref)
	if !ok {
		return nil, "", "", errors.New("first boot made no host")
	}
	return pool.OwnRows(snap, ref), host.UUID(), ref, nil
}

// Join joins the host to the pool (see the package doc) and records
// JoinTime. It returns once the host's raft node holds the index the
// coordinator answered with, or with an error within JoinTimeout.
func (h *Host) Join(ctx context.Context) error {
	if h.Joined() {
		return fmt.Errorf("poolfarm: light host %d has joined already", h.Index)
	}
	rows, id, ref, err := h.rows()
	if err != nil {
		return err
	}
	h.UUID, h.HostRef = id, ref
	apiVer, dbSchema := pool.APIVersion(), pool.SchemaVersion(dm.Model)
	body, err := json.Marshal(pool.JoinRequest{UUID: id, Address: h.Addr, Rows: replica.EncodeRows(rows),
		APIVersion: apiVer, DBSchema: dbSchema})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, JoinTimeout)
	defer cancel()
	start := time.Now()
	reply, err := h.post(ctx, body)
	if err != nil {
		return err
	}
	if err := h.startRaft(reply.Secret); err != nil {
		return err
	}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for h.AppliedIndex() < reply.Index {
		select {
		case <-ctx.Done():
			return fmt.Errorf("poolfarm: light host %d holds index %d, not the coordinator's %d: %w",
				h.Index, h.AppliedIndex(), reply.Index, ctx.Err())
		case <-tick.C:
		}
	}
	h.JoinTime = time.Since(start)
	return nil
}

// post sends the join request from the host's own address and reads the
// coordinator's answer.
func (h *Host) post(ctx context.Context, body []byte) (*pool.JoinReply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+h.farm.opts.Coordinator+pool.JoinPath, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.SetBasicAuth(h.farm.opts.Username, h.farm.opts.Password)
	dialer := &net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: h.ip.AsSlice()}}
	tr := &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("poolfarm: light host %d cannot reach the coordinator: %w", h.Index, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxReply+1))
	if err != nil {
		return nil, fmt.Errorf("poolfarm: light host %d: the coordinator's answer: %w", h.Index, err)
	}
	if len(raw) > maxReply {
		return nil, fmt.Errorf("poolfarm: light host %d: the coordinator's answer is over %d bytes", h.Index, maxReply)
	}
	var reply pool.JoinReply
	if err := json.Unmarshal(raw, &reply); err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("poolfarm: light host %d: the coordinator answered %s: %.200s", h.Index, resp.Status, raw)
	}
	if len(reply.Error) > 0 {
		return nil, fmt.Errorf("poolfarm: light host %d: the coordinator refused the join: %v", h.Index, reply.Error)
	}
	if reply.Secret == "" {
		return nil, fmt.Errorf("poolfarm: light host %d: the coordinator gave no pool secret", h.Index)
	}
	return &reply, nil
}

// startRaft keeps the pool secret and starts the host's raft node.
func (h *Host) startRaft(secret string) error {
	h.secret.Store(&secret)
	o := h.farm.opts
	out := o.LogOutput
	if out == nil {
		out = io.Discard
	}
	conf := raft.DefaultConfig()
	conf.LocalID = raft.ServerID(h.UUID)
	conf.Logger = hclog.New(&hclog.LoggerOptions{Name: "poolfarm-" + strconv.Itoa(h.Index), Output: out, Level: hclog.Warn})
	// A light host's log only has to hold what the leader may still
	// check consistency against: compact it often.
	conf.TrailingLogs = 1024
	conf.SnapshotThreshold = 1024
	conf.SnapshotInterval = 30 * time.Second
	conf.NoSnapshotRestoreOnStart = true
	if o.Tune != nil {
		o.Tune(conf)
	}
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: h.layer, MaxPool: 3, Timeout: 10 * time.Second,
		Logger: hclog.New(&hclog.LoggerOptions{Name: "poolfarm-net", Output: out, Level: hclog.Warn}),
	})
	store := raft.NewInmemStore()
	rf, err := raft.NewRaft(conf, discardFSM{}, store, store, &discardSnapshots{host: h}, raftnet.Conservative(trans))
	if err != nil {
		_ = trans.Close()
		return fmt.Errorf("poolfarm: light host %d's raft: %w", h.Index, err)
	}
	h.mu.Lock()
	h.rf = rf
	h.mu.Unlock()
	return nil
}

// Close stops every light host: raft first (which closes its transport
// and the stream layer), then the HTTP servers.
func (f *Farm) Close() error {
	var (
		mu    sync.Mutex
		first error
	)
	f.closeOnce.Do(func() {
		var wg sync.WaitGroup
		for _, h := range f.Hosts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if rf := h.Raft(); rf != nil {
					if err := rf.Shutdown().Error(); err != nil {
						mu.Lock()
						first = cmp.Or(first, err)
						mu.Unlock()
					}
				}
				_ = h.layer.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = h.srv.Shutdown(ctx)
			}()
		}
		wg.Wait()
	})
	return first
}

// limitListener serves at most cap(slots) connections at once; a
// connection's slot is given back when it closes (a raft connection
// hijacked from the HTTP server keeps its slot until raft closes it).
type limitListener struct {
	net.Listener
	slots chan struct{}
	once  sync.Once
	done  chan struct{} // closed by Close: a full listener stops waiting
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// Voter reports whether the host's node counts itself a voter in the
// newest raft configuration it knows (it should not; see the package
// doc).
func (h *Host) Voter() (bool, error) {
	rf := h.Raft()
	if rf == nil {
		return false, nil
	}
	f := rf.GetConfiguration()
	if err := f.Error(); err != nil {
		return false, err
	}
	for _, s := range f.Configuration().Servers {
		if s.ID == raft.ServerID(h.UUID) {
			return s.Suffrage == raft.Voter, nil
		}
	}
	return false, nil
}

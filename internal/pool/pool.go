// Package pool makes a host a member of a pool: hosts join a coordinator,
// the database is replicated on raft (package dbraft), and members send
// clients to the coordinator.
//
// # Pieces
//
//   - The pool secret (package secret) authenticates hosts to each other:
//     a joining host receives it from the coordinator, and every
//     intra-pool request is signed with it and every answer proves it
//     (package peerauth; auth.go): the secret itself never travels
//     again.
//   - Raft runs over the API's own listener: raftnet's stream layer is
//     mounted at raftnet.Path, so one port serves clients and peers. A
//     host's raft ID is its host uuid and its raft address the address
//     peers reach it at (--advertise, by default the listen address).
//   - A host that serves HTTPS (Config.TLS) talks to the others over it
//     alone, raft included, and accepts a peer only by its certificate
//     pinned in the database (Certificate rows of type host_internal; see
//     pin.go); a host without HTTPS speaks plain HTTP, authenticated by
//     the pool secret as always.
//   - POST /pool/db takes a member's own database changes (deltas, see
//     dbraft) on the coordinator; POST /pool/join is the coordinator's
//     side of pool.join.
//
// # Joining
//
// pool.join runs on the joining host. It asks the coordinator for its
// XenAPI and database schema versions and goes on only when they are its
// own; then it sends the coordinator, with the coordinator's pool-admin
// credentials, its versions and its own rows (host, metrics, CPUs, local
// storage, control domain). The coordinator — if it was a host alone, it
// first makes a pool of itself: raft bootstrapped with one voter and a
// snapshot of its whole database — checks the versions and the rows
// (joincheck.go), writes the rows through raft, adds the host to raft as
// a non-voter and answers with the pool secret. The joiner keeps the
// secret, starts raft, and raft replaces its database with the pool's
// (the snapshot, then the log); the same process goes on serving. Once
// it holds the pool's database it tells the coordinator, which makes it
// a voter, if the pool has fewer than the largest odd number of voters
// up to 5, when it has shown it is a live toolstackd (voters.go).
//
// # Members
//
// A member answers session.login_with_password with HOST_IS_SLAVE and
// the coordinator's address (with its port only when it differs from the
// member's own). session.slave_local_login_with_password opens a session
// on the member's own replica. Writes made on a member (its modules, or a
// slave-local session) reach the pool through the coordinator.
package pool

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/mux"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/pool/dbraft"
	"toolstackd/internal/pool/peerauth"
	"toolstackd/internal/pool/raftnet"
	"toolstackd/internal/pool/secret"
)

// Config is what a host's pool layer needs.
type Config struct {
	// DataDir holds the pool secret and raft's files (DataDir/raft).
	DataDir string
	// Advertise is the address ("ip:port") other hosts reach this one at.
	Advertise string
	// Port is this host's API port, the default port of a master address
	// without one.
	Port string
	// LocalIP, when set, is the address outgoing pool connections leave
	// from (hosts sharing a machine on 127.0.0.N).
	LocalIP net.IP
	// Dial, when set, makes every outgoing intra-pool TCP connection
	// (raft's included) instead of a dialer bound to LocalIP: the daemon's
	// reaches a peer's management address in the network namespace its
	// PIFs live in (see Readdress).
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// TLS, when set, makes intra-pool connections speak TLS, each peer
	// checked by its pinned certificate (see pin.go); its first
	// certificate is this host's own, the one its HTTPS listener serves.
	TLS *tls.Config
	// OwnCert, when set, is this host's pinned certificate now (it
	// changes with host.refresh_server_certificate); without it the
	// first certificate of TLS is.
	OwnCert func() *x509.Certificate
	// HostUUID is this host's uuid: its raft server ID.
	HostUUID string
	Server   *api.Server
	Repl     *dbraft.Replicator
	Log      *slog.Logger
	// Tune adjusts raft's configuration (tests).
	Tune func(*raft.Config)
	// Eject, once this host has left its pool (pool.eject), starts it
	// afresh as a pool of its own with root's password hash kept; it is
	// called after the call that ejected it has been answered.
	Eject func(rootHash string)
}

// Pool is a host's pool layer.
type Pool struct {
	cfg     Config
	log     *slog.Logger
	secrets *secret.Store
	lcfg    raftnet.Config
	// advertise is the address other hosts reach this one at now
	// (Config.Advertise until Readdress changes it).
	advertise atomic.Pointer[string]
	// layer is raft's stream layer of the raft now running (raft closes
	// its transport, and so the layer, when it shuts down; each start
	// makes a new one).
	layer atomic.Pointer[raftnet.StreamLayer]
	// client is the HTTP client of intra-pool requests, unsigned (a
	// join's first contact); peer signs them and checks the answers'
	// proof (auth.go): every request to a host of the pool goes through
	// peer.
	client *http.Client
	peer   *http.Client
	// auth checks peers' signatures, raft's included.
	auth *peerauth.Verifier
	// peerIPs caches the other hosts' addresses (IsPeer).
	peerIPs atomic.Pointer[peerAddrs]
	// sources are the source addresses of requests that proved the pool
	// secret (IsPeer, peersource.go).
	sources sourceBook

	joinMu sync.Mutex // one join (either side) at a time
	// joinPin is the coordinator's certificate fingerprint seen by a join
	// in progress on this host, trusted until the pool's database arrives.
	joinPin atomic.Pointer[string]

	stopWatch chan struct{} // closed to stop watching raft (under joinMu or at Close)
	watching  sync.WaitGroup

	mig migrationState // live migrations arriving (migrate.go)

	votes voters // who is promoted to voter (voters.go)
}

// Open sets up the pool layer; a host that was in a pool when it stopped
// starts raft again at once.
func Open(cfg Config) (*Pool, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	p := &Pool{cfg: cfg, log: cfg.Log}
	p.votes.kick = make(chan struct{}, 1)
	p.advertise.Store(&cfg.Advertise)
	var err error
	if p.secrets, err = secret.Open(cfg.DataDir); err != nil {
		return nil, err
	}
	var clientTLS *tls.Config
	if cfg.TLS != nil {
		clientTLS = pinnedTLS(cfg.TLS, p.verifyPeer)
	}
	p.auth = peerauth.NewVerifier()
	p.lcfg = raftnet.Config{Advertise: cfg.Advertise, Secrets: p.secrets.Valid, TLS: clientTLS, Verifier: p.auth, IsSelf: p.isSelf,
		Verified: p.noteSource}
	dialer := net.Dialer{Timeout: 10 * time.Second}
	if cfg.LocalIP != nil {
		p.lcfg.LocalAddr = &net.TCPAddr{IP: cfg.LocalIP}
		dialer.LocalAddr = p.lcfg.LocalAddr
	}
	dial := dialer.DialContext
	if cfg.Dial != nil {
		dial = cfg.Dial
		p.lcfg.DialTCP = func(ctx context.Context, addr string) (net.Conn, error) { return cfg.Dial(ctx, "tcp", addr) }
	}
	if _, err := raftnet.NewStreamLayer(p.lcfg); err != nil {
		return nil, err // the configuration is checked once, at start
	}
	// No overall timeout here: every request carries its own deadline in
	// its context (a forwarded VM operation may rightly take minutes; a
	// small message has seconds).
	p.client = &http.Client{
		Transport: &http.Transport{
			DialContext: dial, TLSClientConfig: clientTLS, TLSHandshakeTimeout: 10 * time.Second,
			// Idle connections are let go before the API listener's
			// default idle timeout (30 s) would close them under a call.
			MaxIdleConnsPerHost: 8, IdleConnTimeout: 20 * time.Second,
			// Disk transfers pass through here: big buffers, fewer calls.
			ReadBufferSize: 256 << 10, WriteBufferSize: 256 << 10,
		},
	}
	p.peer = &http.Client{Transport: &signingTransport{p: p, base: p.client.Transport}}
	cfg.Server.SetPoolRole(p)
	cfg.Server.SetForwarder(p)
	if p.inPool() {
		if err := p.startRaft(false); err != nil {
			return nil, fmt.Errorf("pool: restarting raft: %w", err)
		}
		p.log.Info("rejoined the pool", "coordinator", p.Coordinator())
	}
	return p, nil
}

func (p *Pool) raftDir() string { return filepath.Join(p.cfg.DataDir, "raft") }

// inPool reports whether this host has raft state: it is in a pool.
func (p *Pool) inPool() bool { return HasState(p.cfg.DataDir) }

// transport makes raft's transport over a new stream layer, which the
// /pool/raft route serves from now on.
func (p *Pool) transport() (*raft.NetworkTransport, error) {
	layer, err := raftnet.NewStreamLayer(p.lcfg)
	if err != nil {
		return nil, err
	}
	if old := p.layer.Swap(layer); old != nil {
		_ = old.Close()
	}
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: layer, MaxPool: 3, Timeout: 10 * time.Second,
		Logger: hclog.New(&hclog.LoggerOptions{Name: "raft-net", Output: os.Stderr, Level: hclog.Warn}),
	}), nil
}

// startOptions are raft's options for this host.
func (p *Pool) startOptions(trans raft.Transport, bootstrap bool) dbraft.StartOptions {
	return dbraft.StartOptions{ID: raft.ServerID(p.cfg.HostUUID), Dir: p.raftDir(), Transport: trans,
		Bootstrap: bootstrap, Tune: p.cfg.Tune}
}

func (p *Pool) startRaft(bootstrap bool) error {
	trans, err := p.transport()
	if err != nil {
		return err
	}
	if err := p.cfg.Repl.Start(p.startOptions(trans, bootstrap)); err != nil {
		_ = trans.Close()
		return err
	}
	p.stopWatch = make(chan struct{})
	p.watching.Add(2)
	go func() {
		defer p.watching.Done()
		p.watchLiveness(p.cfg.Repl.Raft(), p.stopWatch)
	}()
	go func(stop <-chan struct{}) {
		defer p.watching.Done()
		p.keepVoters(stop)
	}(p.stopWatch)
	return nil
}

// stopWatching stops what watches raft.
func (p *Pool) stopWatching() {
	if p.stopWatch != nil {
		close(p.stopWatch)
		p.watching.Wait()
		p.stopWatch = nil
	}
}

// Routes mounts the intra-pool endpoints.
func (p *Pool) Routes(r *mux.Router) {
	r.HandleFunc(raftnet.Path, func(w http.ResponseWriter, r *http.Request) {
		if l := p.layer.Load(); l != nil {
			l.ServeHTTP(w, r)
			return
		}
		http.Error(w, "this host runs no raft", http.StatusServiceUnavailable)
	})
	r.HandleFunc(deltaPath, p.peerOnly(p.serveDelta)).Methods(http.MethodPost)
	r.HandleFunc(JoinPath, p.serveJoin).Methods(http.MethodPost, http.MethodGet)
	r.HandleFunc(joinedPath, p.peerOnly(p.serveJoined)).Methods(http.MethodPost)
	r.HandleFunc(alivePath, p.peerOnly(p.serveAlive)).Methods(http.MethodPost)
	r.HandleFunc(callPath, p.peerOnly(p.serveCall)).Methods(http.MethodPost)
	r.HandleFunc(pingPath, p.peerOnly(servePing)).Methods(http.MethodPost)
	r.HandleFunc(transferPath, p.peerOnly(p.serveTransfer)).Methods(http.MethodPost)
	r.HandleFunc(sessionPath, p.peerOnly(p.serveSession)).Methods(http.MethodPost)
	r.HandleFunc(rejoinPath, p.peerOnly(p.serveRejoin)).Methods(http.MethodPost)
	r.HandleFunc(readdPath, p.peerOnly(p.serveReadd)).Methods(http.MethodPost)
	r.HandleFunc(secretPath, p.peerOnly(p.serveSecret)).Methods(http.MethodPost)
	r.HandleFunc(leavePath, p.peerOnly(p.serveLeave)).Methods(http.MethodPost)
	r.HandleFunc(migratePath, p.peerOnly(p.serveMigration)).Methods(http.MethodPost)
	r.HandleFunc(addressPath, p.peerOnly(p.serveAddress)).Methods(http.MethodPost)
}

// Register installs the pool calls this layer serves.
func (p *Pool) Register(srv *api.Server) {
	api.Register(srv, p.join)
	api.Register(srv, p.designateNewMaster)
	api.Register(srv, p.syncDatabase)
	api.Register(srv, p.emergencyTransitionToMaster)
	api.Register(srv, p.recoverSlaves)
	api.Register(srv, p.emergencyResetMaster)
	api.Register(srv, p.rotateSecret)
	api.Register(srv, p.eject)
	api.Register(srv, p.hostDestroy)
}

// Member reports whether this host is in a pool and not its coordinator
// (api.PoolRole).
func (p *Pool) Member() bool {
	m := p.cfg.Repl.Mode()
	return m == dbraft.Follower
}

// Coordinator is the coordinator's address as HOST_IS_SLAVE names it: with
// its port only when that differs from this host's (api.PoolRole).
func (p *Pool) Coordinator() string {
	addr := p.cfg.Repl.LeaderAddr()
	if host, port, err := net.SplitHostPort(addr); err == nil && port == p.cfg.Port {
		return host
	}
	return addr
}

// Close stops the host's part in the pool: writes fail from now on (the
// replicator closes: nothing may be acknowledged that the pool does not
// have), raft stops, then the transport.
func (p *Pool) Close() error {
	p.stopWatching()
	err := p.cfg.Repl.Close() // raft closes its transport
	if l := p.layer.Load(); l != nil {
		_ = l.Close()
	}
	return err
}

// SendDelta sends a member's own database change to the coordinator
// (dbraft's Forward).
func (p *Pool) SendDelta(ctx context.Context, entry []byte) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	leader, err := p.cfg.Repl.WaitLeader(ctx)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", dbraft.ErrNotLeader, err)
	}
	resp, err := p.post(ctx, leader, deltaPath, "application/octet-stream", entry)
	if err != nil {
		return 0, fmt.Errorf("%w: the coordinator %s: %w", dbraft.ErrNotLeader, leader, err)
	}
	defer func() { _ = resp.Body.Close() }()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch resp.StatusCode {
	case http.StatusOK:
		index, _ := strconv.ParseUint(resp.Header.Get(headerIndex), 10, 64) // 0 from an older coordinator
		return index, nil
	case http.StatusConflict:
		return 0, fmt.Errorf("%w: %s", dbraft.ErrNotLeader, msg)
	}
	return 0, fmt.Errorf("pool: the coordinator %s refused a change: %s: %s", leader, resp.Status, msg)
}

// post sends an intra-pool request, signed; an answer that does not
// prove the peer holds the secret is an error.
func (p *Pool) post(ctx context.Context, addr, path, ctype string, body []byte) (*http.Response, error) {
	req, err := p.request(ctx, addr, path, ctype, body)
	if err != nil {
		return nil, err
	}
	return p.peer.Do(req)
}

// request makes an intra-pool request (signed when sent by p.peer).
func (p *Pool) request(ctx context.Context, addr, path, ctype string, body []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", ctype)
	p.toPeer(req, addr)
	return req, nil
}

// toPeer addresses req to the host at addr, over TLS when the pool speaks
// it. It is signed when sent (p.peer, or sign for a raw exchange).
func (p *Pool) toPeer(req *http.Request, addr string) {
	req.URL.Scheme = "http"
	if p.cfg.TLS != nil {
		req.URL.Scheme = "https"
	}
	req.URL.Host, req.Host = addr, addr
}

// maxDelta bounds a member's change sent to the coordinator.
const maxDelta = 64 << 20

// deltaPath is where a member sends its change to the coordinator.
const deltaPath = "/pool/db"

// JoinPath is the coordinator's endpoint of pool.join: a POST with the
// coordinator's pool-admin credentials as basic authorization and a
// JoinRequest as its body, answered by a JoinReply; a GET answers the
// coordinator's versions. Join's wire types are exported so that a tool
// (poolfarm's light hosts) joins exactly as a host does.
const JoinPath = "/pool/join"

// serveDelta applies a member's change on the coordinator.
func (p *Pool) serveDelta(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxDelta))
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	switch index, err := p.cfg.Repl.ApplyRemote(r.Context(), body); {
	case err == nil:
		w.Header().Set(headerIndex, strconv.FormatUint(index, 10))
		w.WriteHeader(http.StatusOK)
	case errors.Is(err, dbraft.ErrNotLeader):
		http.Error(w, err.Error(), http.StatusConflict)
	default:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// OnLeader runs when this host becomes the coordinator (dbraft's
// OnLeader): operations the old coordinator recorded in progress are
// forgotten (as xapi's master does at start), the pool record names this
// host master, it is live, and the pool's voters are rebalanced.
func (p *Pool) OnLeader() {
	self := p.cfg.Server.Cfg.HostRef
	_, err := p.cfg.Server.DB.Update(func(tx *db.Tx) error {
		if err := api.ClearOperations(p.cfg.Server.Model, tx); err != nil {
			return err
		}
		for _, pool := range tx.All(dm.Pool.Class) {
			if pool.String(dm.Pool.Master) != self {
				if err := tx.Set(dm.Pool.Master, pool.Ref, self); err != nil {
					return err
				}
			}
		}
		if host, ok := tx.Get(dm.Host.Class, self); ok {
			if m := host.String(dm.Host.Metrics); m != "" {
				if r, ok := tx.Get(dm.HostMetrics.Class, m); ok && r.Get(dm.HostMetrics.Live) != true {
					return tx.Set(dm.HostMetrics.Live, m, true)
				}
			}
		}
		return nil
	})
	if err != nil {
		p.log.Warn("the new coordinator could not record itself", "err", err)
	}
	if err := p.balanceVoters(); err != nil {
		p.log.Warn("could not rebalance the pool's voters", "err", err)
	}
	p.handOffIfWitness()
}

// handOffIfWitness gives leadership away when a witness was elected (it
// votes, so raft may elect it): the coordinator should be a host that
// runs VMs. With no other voter left it stays.
func (p *Pool) handOffIfWitness() {
	row, ok := p.cfg.Server.DB.Snapshot().Get(dm.Host.Class, p.cfg.Server.Cfg.HostRef)
	if !ok {
		return
	}
	if oc, _ := row.Get(dm.Host.OtherConfig).(map[string]string); oc["witness"] != "true" {
		return
	}
	rf := p.cfg.Repl.Raft()
	if rf == nil {
		return
	}
	if err := rf.LeadershipTransfer().Error(); err != nil {
		p.log.Info("a witness coordinates the pool: no other voter could take over", "err", err)
		return
	}
	p.log.Info("a witness was elected and handed the pool to another voter")
}

// HasState reports whether the host whose data dir is dir is in a pool
// (it has raft state).
func HasState(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "raft", "raft.db"))
	return err == nil
}

package pool

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"toolstackd/internal/netguard"
)

// Migration streams: a live migration's bytes between two hosts of the
// pool travel inside one intra-pool connection, never on a port of their
// own. The sending host POSTs to migratePath on the receiving one with
// the pool secret (over TLS when the pool speaks it, the peer checked by
// its pinned certificate), asking to upgrade the connection to
// MigrateProtocol; the receiving host waits until its replica holds the
// raft index the sender had (so that it sees the VM as the sender saw
// it), answers 101 and hands the raw connection to its
// MigrationReceiver. What flows on it is the VM lifecycle's business
// (internal/xenops, migrate*.go).

// MigrateProtocol is the Upgrade token of a migration stream.
const MigrateProtocol = "toolstackd-migrate/1"

// migratePath takes migration streams.
const migratePath = "/pool/migrate"

// migrateHandshake bounds the upgrade, both ways.
const migrateHandshake = 30 * time.Second

// maxMigrationsIn bounds the migration streams a host receives at once.
const maxMigrationsIn = 64

// MigrationReceiver is the receiving side of migration streams (the VM
// lifecycle). ServeMigration owns conn and closes it; ctx ends when the
// host shuts down.
type MigrationReceiver interface {
	ServeMigration(ctx context.Context, conn net.Conn)
}

// migrationState is the pool's part of migrations: who receives, and how
// many streams are being received.
type migrationState struct {
	recv   atomic.Pointer[MigrationReceiver]
	active atomic.Int64
}

func (p *Pool) migrations() *migrationState { return &p.mig }

// SetMigrationReceiver makes r the receiver of migration streams sent to
// this host (nil refuses them).
func (p *Pool) SetMigrationReceiver(r MigrationReceiver) {
	if r == nil {
		p.migrations().recv.Store(nil)
		return
	}
	p.migrations().recv.Store(&r)
}

// DialMigration opens a migration stream to the host hostRef: an
// intra-pool connection upgraded to MigrateProtocol. The connection has
// no deadline once upgraded; ctx bounds the handshake only.
func (p *Pool) DialMigration(ctx context.Context, hostRef string) (net.Conn, error) {
	addr := p.addressOf(hostRef)
	if addr == "" {
		return nil, fmt.Errorf("pool: host %s is not in raft's configuration", hostRef)
	}
	dctx, cancel := context.WithTimeout(ctx, migrateHandshake)
	defer cancel()
	conn, err := p.dial(dctx, addr)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(dctx, http.MethodPost, migratePath, http.NoBody)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	p.toPeer(req, addr)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", MigrateProtocol)
	p.carryIndex(req.Header)
	nonce, q := p.sign(req)
	br, resp, err := exchange(dctx, conn, req)
	if err != nil {
		return nil, fmt.Errorf("pool: migration stream to %s: %w", addr, err)
	}
	if !p.proven(resp, nonce, q) {
		// Nothing of the VM goes to a host that is not of the pool.
		_ = conn.Close()
		return nil, fmt.Errorf("pool: migration stream to %s: %w", addr, errNoProof)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || !hasToken(resp.Header, "Upgrade", MigrateProtocol) {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		_ = conn.Close()
		return nil, fmt.Errorf("pool: migration stream to %s refused: %s: %s", addr, resp.Status, msg)
	}
	_ = conn.SetDeadline(time.Time{})
	return &bufferedConn{Conn: conn, r: br}, nil
}

// serveMigration is the handler of POST migratePath (behind peerOnly).
func (p *Pool) serveMigration(w http.ResponseWriter, r *http.Request) {
	st := p.migrations()
	rp := st.recv.Load()
	if rp == nil {
		http.Error(w, "this host receives no migrations", http.StatusServiceUnavailable)
		return
	}
	if !hasToken(r.Header, "Upgrade", MigrateProtocol) || !hasToken(r.Header, "Connection", "Upgrade") {
		w.Header().Set("Upgrade", MigrateProtocol)
		http.Error(w, "upgrade to "+MigrateProtocol+" required", http.StatusUpgradeRequired)
		return
	}
	if st.active.Add(1) > maxMigrationsIn {
		st.active.Add(-1)
		http.Error(w, "too many migrations arriving", http.StatusServiceUnavailable)
		return
	}
	defer st.active.Add(-1)
	if idx, err := strconv.ParseUint(r.Header.Get(headerIndex), 10, 64); err == nil {
		ctx, cancel := context.WithTimeout(r.Context(), migrateHandshake)
		err := p.cfg.Repl.WaitApplied(ctx, idx)
		cancel()
		if err != nil {
			http.Error(w, "this host's replica is behind: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	c, err := netguard.Upgrade(w, MigrateProtocol, migrateHandshake)
	if err != nil {
		return
	}
	// The request's context ends with the handler; the stream's life is
	// the receiver's, bounded by its own deadlines.
	(*rp).ServeMigration(context.WithoutCancel(r.Context()), c)
}

// hasToken reports whether a comma-separated header lists token (case
// does not matter).
func hasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

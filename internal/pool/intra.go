package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/hashicorp/raft"

	"toolstackd/internal/xerr"
)

// Intra-pool requests: small JSON messages between hosts, each carrying
// the pool secret.

// maxMessage bounds an intra-pool JSON message (not a join's rows, nor a
// delta, nor a forwarded call, which have their own bounds).
const maxMessage = 64 << 10

// refusal is a host's answer other than 200 to an intra-pool message.
type refusal struct {
	status string
	msg    string
}

func (e *refusal) Error() string { return e.status + ": " + e.msg }

// notify sends v as JSON to path on the host at addr and returns nil when
// it answers 200, a *refusal when it answers otherwise, or the transport's
// error.
func (p *Pool) notify(ctx context.Context, addr, path string, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	resp, err := p.post(ctx, addr, path, "application/json", body)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return &refusal{resp.Status, string(msg)}
	}
	return nil
}

// notifyXen is notify for a XenAPI call's sake: a host that cannot be
// reached is CANNOT_CONTACT_HOST [addr], one that refuses an
// INTERNAL_ERROR saying why.
func (p *Pool) notifyXen(ctx context.Context, addr, path string, v any) error {
	err := p.notify(ctx, addr, path, v)
	var r *refusal
	switch {
	case err == nil:
		return nil
	case errors.As(err, &r):
		return xerr.New(xerr.InternalError, fmt.Sprintf("%s refused: %s", addr, r))
	}
	p.log.Warn("cannot reach a host of the pool", "host", addr, "path", path, "err", err)
	return xerr.New(xerr.CannotContactHost, addr)
}

// peerOnly serves h to hosts of the pool: requests signed with the pool
// secret and addressed to this host (auth.go); the answer carries this
// host's proof.
func (p *Pool) peerOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if p.verify(w, r) != nil {
			http.Error(w, "pool secret required", http.StatusForbidden)
			return
		}
		h(w, r)
	}
}

// readJSON decodes a small JSON message into v, or answers 400 and
// returns false.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(io.LimitReader(r.Body, maxMessage)).Decode(v); err != nil {
		http.Error(w, "the message is not the JSON expected: "+err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

// answer writes 200, or err with status.
func answer(w http.ResponseWriter, err error, status int) {
	if err != nil {
		http.Error(w, err.Error(), status)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// NotifyCoordinator sends v as JSON to path on the pool's coordinator (a
// small intra-pool message, with the pool secret): nil when it answers
// 200.
func (p *Pool) NotifyCoordinator(ctx context.Context, path string, v any) error {
	leader, err := p.cfg.Repl.WaitLeader(ctx)
	if err != nil {
		return err
	}
	return p.notify(ctx, leader, path, v)
}

// PeerOnly serves h to hosts of the pool only (the pool secret), for the
// intra-pool endpoints of other modules (HA's lease renewals).
func (p *Pool) PeerOnly(h http.HandlerFunc) http.HandlerFunc { return p.peerOnly(h) }

// Voters counts the pool's voting and non-voting members in raft's
// configuration (1, 0 for a host alone).
func (p *Pool) Voters() (voters, nonVoters int) {
	rf := p.cfg.Repl.Raft()
	if rf == nil {
		return 1, 0
	}
	f := rf.GetConfiguration()
	if f.Error() != nil {
		return 1, 0
	}
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters++
		} else {
			nonVoters++
		}
	}
	return max(voters, 1), nonVoters
}

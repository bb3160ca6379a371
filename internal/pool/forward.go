package pool

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/hashicorp/raft"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/xerr"
)

// callPath takes calls the coordinator forwards to the host that must run
// them.
const callPath = "/pool/call"

// Headers of a forwarded call: who it runs as, and the coordinator's raft
// index the host must hold first (so that it sees what the coordinator
// saw when it routed the call).
const (
	headerIdentity = "X-Toolstackd-Identity"
	headerIndex    = "X-Toolstackd-Index"
)

// maxReply bounds a forwarded call's reply.
const maxReply = 256 << 20

// forwardTimeout bounds a forwarded call (long operations are Async on the
// coordinator; the host's work itself is bounded by its own timeouts).
const forwardTimeout = 24 * time.Hour

// Forward sends a call to the host that must run it (api.Forwarder).
func (p *Pool) Forward(ctx context.Context, hostRef string, body []byte, id api.Identity) ([]byte, error) {
	unreachable := func(err error) error {
		p.log.Warn("cannot forward a call", "host", hostRef, "err", err)
		return xerr.New(xerr.CannotContactHost, hostRef)
	}
	addr := p.addressOf(hostRef)
	if addr == "" {
		return nil, unreachable(errors.New("the host is not in raft's configuration"))
	}
	ctx, cancel := context.WithTimeout(ctx, forwardTimeout)
	defer cancel()
	ctx, progress := followProgress(ctx) // forward_progress.go
	req, err := p.request(ctx, addr, callPath, "application/json", body)
	if err != nil {
		return nil, err
	}
	if progress {
		req.Header.Set(headerProgress, "1")
	}
	if err := p.onBehalf(req, id); err != nil {
		return nil, err
	}
	resp, err := p.peer.Do(req)
	if err != nil {
		return nil, unreachable(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, unreachable(errors.New(resp.Status + ": " + string(msg)))
	}
	reply, err := io.ReadAll(io.LimitReader(resp.Body, maxReply+1))
	if err != nil {
		return nil, unreachable(err)
	}
	if len(reply) > maxReply {
		return nil, xerr.New(xerr.InternalError, "a forwarded call's reply is over "+strconv.Itoa(maxReply)+" bytes")
	}
	return reply, nil
}

// onBehalf marks req as run for id, once the receiving host holds this
// host's raft index.
func (p *Pool) onBehalf(req *http.Request, id api.Identity) error {
	who, err := json.Marshal(id)
	if err != nil {
		return err
	}
	req.Header.Set(headerIdentity, string(who))
	p.carryIndex(req.Header)
	return nil
}

// carryIndex puts in a request to another host the raft index the
// receiver waits to have applied (dbraft's SeenIndex). On the
// coordinator it nudges the members (dbraft's Nudge), so that the
// receiver learns at once that the index is committed instead of at
// raft's next idle append, 50-100 ms later.
func (p *Pool) carryIndex(h http.Header) {
	i := p.cfg.Repl.SeenIndex()
	p.cfg.Repl.Nudge(i)
	h.Set(headerIndex, strconv.FormatUint(i, 10))
}

// addressOf is where raft reaches a host (its advertised address).
func (p *Pool) addressOf(hostRef string) string {
	row, ok := p.cfg.Server.DB.Snapshot().Get(dm.Host.Class, hostRef)
	rf := p.cfg.Repl.Raft()
	if !ok || rf == nil {
		return ""
	}
	f := rf.GetConfiguration()
	if f.Error() != nil {
		return ""
	}
	for _, s := range f.Configuration().Servers {
		if s.ID == raft.ServerID(row.UUID()) {
			return string(s.Address)
		}
	}
	return ""
}

// serveCall runs a call the coordinator forwarded here.
func (p *Pool) serveCall(w http.ResponseWriter, r *http.Request) {
	id, status, err := p.identityOf(r)
	if err != nil {
		http.Error(w, err.Error(), status)
		return
	}
	if r.Header.Get(headerProgress) != "" {
		// The caller follows the call's progress (forward_progress.go).
		pw := newProgressWriter(w)
		defer pw.close()
		w, r = pw, r.WithContext(api.WithProgress(r.Context(), pw.report))
	}
	p.cfg.Server.ServeForwarded(w, r, id)
}

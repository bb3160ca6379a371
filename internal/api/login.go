package api

import (
	"container/list"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// AuthLimits bound what a client can make the server do by guessing
// passwords. xapi answers every failed login after a fixed sleep; here a
// client address earns a delay, then a refusal, and the work of checking
// passwords is capped so that a flood from one client cannot starve the
// others.
//
// Failures are counted per client address (IPv4 address, or IPv6 /64
// prefix); the local socket is exempt. Once a client has
// FailuresBeforeDelay failures within FailureWindow, each further failure
// is answered after FailureDelay; at FailuresBeforeRefusal failures the
// client is refused, before any password is checked, for RefusalPeriod,
// doubled for each further failure after a refusal ends, up to
// MaxRefusalPeriod. Refusals are SESSION_AUTHENTICATION_FAILED with
// [username, reason] (the form xapi uses for its own login failures).
type AuthLimits struct {
	FailuresBeforeDelay   int
	FailureDelay          time.Duration
	FailuresBeforeRefusal int
	RefusalPeriod         time.Duration
	MaxRefusalPeriod      time.Duration
	// FailureWindow: a client's count starts again after this long
	// without a failure.
	FailureWindow time.Duration
	// MaxClients bounds the client addresses remembered (least recently
	// seen forgotten first).
	MaxClients int
	// ConcurrentChecks bounds the password hashes computed at once
	// (default GOMAXPROCS); one client computes at most one at a time.
	ConcurrentChecks int
	// MaxSessionsPerUser caps one user's sessions over all originators;
	// the user's oldest is logged out to make room.
	MaxSessionsPerUser int
}

// DefaultAuthLimits returns the limits a server starts with.
func DefaultAuthLimits() AuthLimits {
	return AuthLimits{
		FailuresBeforeDelay:   3,
		FailureDelay:          time.Second,
		FailuresBeforeRefusal: 10,
		RefusalPeriod:         30 * time.Second,
		MaxRefusalPeriod:      15 * time.Minute,
		FailureWindow:         15 * time.Minute,
		MaxClients:            16384,
		ConcurrentChecks:      runtime.GOMAXPROCS(0),
		MaxSessionsPerUser:    5000,
	}
}

// SetAuthLimits replaces the login limits (before serving; tests use it).
func (s *Server) SetAuthLimits(l AuthLimits) {
	s.sessions.guard.setLimits(l)
	s.sessions.mu.Lock()
	s.sessions.maxPerUser = l.MaxSessionsPerUser
	s.sessions.mu.Unlock()
}

// authGuard holds the per-client failure counts and the bound on
// concurrent password checks.
type authGuard struct {
	mu      sync.Mutex
	limits  AuthLimits
	clients map[string]*list.Element // of *clientState
	lru     *list.List               // most recently seen first
	sem     chan struct{}
	// suspect is the share of sem that clients with recent failures
	// may hold (half of it, at least one): a flood from many addresses
	// leaves the rest to clients that have not failed.
	suspect chan struct{}

	dummyMu   sync.Mutex
	dummy     string
	dummyIter int
}

type clientState struct {
	key          string
	failures     int
	lastFailure  time.Time
	blockedUntil time.Time
	period       time.Duration // the last refusal period given
	turn         chan struct{} // one password check at a time per client
}

func newAuthGuard(l AuthLimits) *authGuard {
	g := &authGuard{clients: map[string]*list.Element{}, lru: list.New()}
	g.setLimits(l)
	return g
}

func (g *authGuard) setLimits(l AuthLimits) {
	if l.ConcurrentChecks < 1 {
		l.ConcurrentChecks = 1
	}
	if l.MaxClients < 1 {
		l.MaxClients = 1
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.limits = l
	g.sem = make(chan struct{}, l.ConcurrentChecks)
	g.suspect = make(chan struct{}, max(1, l.ConcurrentChecks/2))
}

// clientKey is the address failures are counted against: the IP of the
// peer, or for IPv6 its /64, which one host usually owns whole.
func clientKey(remote string) string {
	host := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		host = h
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return "?" + host // unknown origin (in-process callers): one shared bucket
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// client returns the state of a client address, creating it and
// forgetting the least recently seen one when the table is full. The
// caller holds g.mu.
func (g *authGuard) client(key string) *clientState {
	if e, ok := g.clients[key]; ok {
		g.lru.MoveToFront(e)
		return e.Value.(*clientState)
	}
	for g.lru.Len() >= g.limits.MaxClients {
		old := g.lru.Back()
		g.lru.Remove(old)
		delete(g.clients, old.Value.(*clientState).key)
	}
	st := &clientState{key: key, turn: make(chan struct{}, 1)}
	g.clients[key] = g.lru.PushFront(st)
	return st
}

// refusal reports whether a client is refused now, with the error.
func (g *authGuard) refusal(st *clientState, user string, now time.Time) error {
	if now.Before(st.blockedUntil) {
		wait := st.blockedUntil.Sub(now).Round(time.Second)
		if wait < time.Second {
			wait = time.Second
		}
		return xerr.New(xerr.SessionAuthenticationFailed, user,
			fmt.Sprintf("too many failed logins from this client; try again in %s", wait))
	}
	return nil
}

// failed records a failed check and returns how long to hold the reply.
func (g *authGuard) failed(st *clientState, now time.Time) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	l := g.limits
	if now.Sub(st.lastFailure) > l.FailureWindow {
		st.failures, st.period = 0, 0
	}
	st.failures++
	st.lastFailure = now
	if l.FailuresBeforeRefusal > 0 && st.failures >= l.FailuresBeforeRefusal {
		switch st.period {
		case 0:
			st.period = l.RefusalPeriod
		default:
			st.period *= 2
		}
		if l.MaxRefusalPeriod > 0 && st.period > l.MaxRefusalPeriod {
			st.period = l.MaxRefusalPeriod
		}
		st.blockedUntil = now.Add(st.period)
	}
	if l.FailuresBeforeDelay > 0 && st.failures >= l.FailuresBeforeDelay {
		return l.FailureDelay
	}
	return 0
}

// dummyHash is a stored hash of a random password with the server's work
// factor: unknown users are checked against it so that they cost what a
// known user costs.
func (g *authGuard) dummyHash(iterations int) string {
	g.dummyMu.Lock()
	defer g.dummyMu.Unlock()
	if g.dummy == "" || g.dummyIter != iterations {
		b := make([]byte, 16)
		rand.Read(b)
		h, err := HashPassword(hex.EncodeToString(b), iterations)
		if err != nil {
			h = "pbkdf2-sha256$1$AAAAAAAAAAAAAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
		}
		g.dummy, g.dummyIter = h, iterations
	}
	return g.dummy
}

// check verifies a password for a client: stored is the account's hash,
// or "" when there is no such account (then a dummy hash of the same cost
// is checked and the answer is no). Calls from the local socket are not
// limited. A wrong password is SESSION_AUTHENTICATION_FAILED, answered
// after the client's delay; a client that is backing off is refused
// before any hashing, the refusal also held for FailureDelay so that a
// flood slows to one attempt per connection per delay. Waiting holds no
// lock and no hashing slot.
func (g *authGuard) check(ctx context.Context, origin Origin, user, stored, pw string, iterations int) error {
	if stored == "" || !wellFormedHash(stored) {
		stored = g.dummyHash(iterations)
		pw = "\x00" + pw // never matches, whatever the dummy's secret
	}
	if origin.Local {
		if !CheckPassword(stored, pw) {
			return authFailed(user)
		}
		return nil
	}
	key := clientKey(origin.Remote)
	g.mu.Lock()
	st := g.client(key)
	err := g.refusal(st, user, time.Now())
	sem, delay := g.sem, g.limits.FailureDelay
	g.mu.Unlock()
	if err != nil {
		hold(ctx, delay)
		return err
	}
	// One check at a time per client: a flood from one address queues
	// behind its own failures and is refused once they add up.
	select {
	case st.turn <- struct{}{}:
	case <-ctx.Done():
		return authFailed(user)
	}
	g.mu.Lock()
	err = g.refusal(st, user, time.Now())
	suspect := g.suspect
	if st.failures == 0 || time.Since(st.lastFailure) > g.limits.FailureWindow {
		suspect = nil
	}
	g.mu.Unlock()
	if err != nil {
		<-st.turn
		hold(ctx, delay)
		return err
	}
	// release gives back what this check holds, in reverse order.
	release := func(held ...chan struct{}) {
		for _, c := range held {
			if c != nil {
				<-c
			}
		}
	}
	if suspect != nil {
		select {
		case suspect <- struct{}{}:
		case <-ctx.Done():
			release(st.turn)
			return authFailed(user)
		}
	}
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		release(suspect, st.turn)
		return authFailed(user)
	}
	ok := CheckPassword(stored, pw)
	release(sem, suspect)
	if ok {
		<-st.turn
		return nil
	}
	// The client's next check waits until this failure's delay is over.
	hold(ctx, g.failed(st, time.Now()))
	<-st.turn
	return authFailed(user)
}

// authFailed is xapi's refusal of a password: SESSION_AUTHENTICATION_FAILED
// [user name, PAM's text for a failed authentication]. Every refusal of
// a password or an account says the same, so that it tells nothing of
// which accounts exist.
func authFailed(user string) error {
	return xerr.New(xerr.SessionAuthenticationFailed, user, "Authentication failure")
}

// hold waits for d or until ctx ends.
func hold(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// wellFormedHash reports whether a stored hash can be checked at all (a
// malformed one is answered as fast as no account would be otherwise).
func wellFormedHash(stored string) bool {
	_, _, _, ok := parseHash(stored)
	return ok
}

// CheckLogin checks a local account's password as
// session.login_with_password does, under the same limits and at the
// same cost for a known and an unknown name; the client is the origin
// attached to ctx (WithOrigin). Other ways in that take a password (HTTP
// basic authentication) should use it. It returns the account's row.
func (s *Server) CheckLogin(ctx context.Context, user, pw string) (*db.Row, error) {
	u := findUser(s.DB.Snapshot(), user)
	hash := ""
	if u != nil {
		hash = u.String(dm.User.PasswordHash)
	}
	if err := s.sessions.guard.check(ctx, originOf(ctx), user, hash, pw, s.Cfg.PasswordIterations); err != nil {
		return nil, err
	}
	return u, nil
}

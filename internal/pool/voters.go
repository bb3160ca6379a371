package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/pool/dbraft"
)

// Voters (issue 29, finding 4): a seat in the pool's raft quorum goes only
// to a member that has shown it is a live toolstackd. Pool-admin
// credentials are enough to be admitted; they are not enough to vote. A
// program that joined and then never answers would otherwise hold a seat,
// and two such seats in a pool of five take its quorum away as soon as
// one real host dies.
//
// A member is added to raft as a non-voter (admit, readd), and the
// coordinator promotes it only once it has shown, in one exchange
// (proveLive), that
//
//   - it answers a signed request at its own raft address (alivePath),
//     with the proof that it holds the pool secret (auth.go), naming
//     itself by the uuid raft knows it by;
//   - where the pool speaks TLS, the certificate it presented on that
//     connection is the one pinned for its host (pin.go), not merely one
//     of the pool's;
//   - its raft has caught up: it follows the coordinator's term, its
//     configuration lists it (it has received the change that added it),
//     and its log reaches to within maxTrailing entries of what the
//     coordinator had committed before asking.
//
// Seats are filled as before — the largest odd number of voters up to
// MaxVoters — but with such members only, and never to an even number
// (planVoters).
//
// A joiner tells the coordinator once it holds the pool's database
// (joinedPath), and the coordinator checks it at once, so that
// pool.join returns with the host a voter when the pool has a seat for
// it. Otherwise the coordinator looks for itself (keepVoters): every
// voterSweep, at once for a member added back (readd), and sooner for a
// member that failed only recently, backing off per member up to
// maxProveBackoff. A member that
// never shows itself stays a non-voter, and the coordinator logs it (once
// per reason, as a warning once it has failed for proveGrace) as
// "stays a non-voter".

const (
	// alivePath is a member's answer to the coordinator's check.
	alivePath = "/pool/alive"
	// joinedPath is a joiner's word that it holds the pool's database.
	joinedPath = "/pool/joined"
	// maxTrailing is how far a member's raft log may end behind the
	// coordinator's commit index and count as caught up (a member
	// appends what a quorum of voters already has a moment later).
	maxTrailing = 256
	// voterSweep is how often the coordinator rebalances its voters
	// with nothing else to prompt it.
	voterSweep = liveSweep
	// firstProveRetry and maxProveBackoff bound the wait before a
	// member that failed a check is checked again: the first retry,
	// doubling up to the most.
	firstProveRetry = 200 * time.Millisecond
	maxProveBackoff = 30 * time.Second
	// joinedWait bounds how long the coordinator tries to make a joiner
	// that said it holds the database a voter.
	joinedWait = 30 * time.Second
	// proveGrace is how long a member may fail its checks before the
	// coordinator warns of it.
	proveGrace = 10 * time.Second
	// proveParallel bounds the checks run at once.
	proveParallel = 8
)

// aliveReport is a member's answer at alivePath.
type aliveReport struct {
	UUID      string `json:"uuid"`       // its host uuid: its raft ID
	Term      uint64 `json:"term"`       // its raft's current term
	LastIndex uint64 `json:"last_index"` // the last index in its raft log
	Listed    bool   `json:"listed"`     // its raft configuration lists it
}

// serveAlive answers the coordinator's check with this host's raft state.
func (p *Pool) serveAlive(w http.ResponseWriter, _ *http.Request) {
	rep := aliveReport{UUID: p.cfg.HostUUID}
	if rf := p.cfg.Repl.Raft(); rf != nil {
		rep.Term, rep.LastIndex = rf.CurrentTerm(), rf.LastIndex()
		rep.Listed = slices.ContainsFunc(p.raftServers(), func(s raft.Server) bool { return string(s.ID) == p.cfg.HostUUID })
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(rep)
}

// aliveWant is what the coordinator expects of a member's answer.
type aliveWant struct {
	id     string   // its raft ID
	term   uint64   // the coordinator's term
	commit uint64   // the coordinator's commit index before it asked
	tls    bool     // whether the pool speaks TLS
	pins   []string // the fingerprints pinned for its host (with tls)
}

// check judges a member's answer, and the fingerprint of the certificate
// it answered over ("" without TLS): nil when it has shown it is a live
// toolstackd of this pool, caught up.
func (w aliveWant) check(rep aliveReport, fp string) error {
	switch {
	case rep.UUID != w.id:
		return fmt.Errorf("it answers as host %q", rep.UUID)
	case w.tls && (fp == "" || !slices.Contains(w.pins, fp)):
		return fmt.Errorf("its certificate (%s) is not the one pinned for it", fp)
	case !rep.Listed:
		return errors.New("its raft has not received the configuration that adds it")
	case rep.Term != w.term:
		return fmt.Errorf("its raft is at term %d, the coordinator's at %d", rep.Term, w.term)
	case rep.LastIndex+maxTrailing < w.commit:
		return fmt.Errorf("its raft log ends at %d, the coordinator has committed %d", rep.LastIndex, w.commit)
	}
	return nil
}

// proveLive checks, on the coordinator, that the raft server s is a live
// toolstackd of this pool that has caught up (see above).
func (p *Pool) proveLive(ctx context.Context, s raft.Server) error {
	rf := p.cfg.Repl.Raft()
	if rf == nil {
		return errors.New("this host runs no raft")
	}
	want := aliveWant{id: string(s.ID), term: rf.CurrentTerm(), commit: rf.CommitIndex(), tls: p.cfg.TLS != nil}
	if want.tls {
		want.pins = hostPins(p.cfg.Server.DB.Snapshot(), want.id)
	}
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	resp, err := p.post(ctx, string(s.Address), alivePath, "application/json", nil)
	if err != nil {
		return fmt.Errorf("no host of the pool answers at %s: %w", s.Address, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("it answers %s", resp.Status)
	}
	var rep aliveReport
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxMessage)).Decode(&rep); err != nil {
		return fmt.Errorf("its answer is not one: %w", err)
	}
	fp := ""
	if resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
		fp = Fingerprint(resp.TLS.PeerCertificates[0].Raw)
	}
	return want.check(rep, fp)
}

// hostPins are the fingerprints of the host_internal certificates pinned
// for the host with uuid.
func hostPins(r db.Reader, uuid string) []string {
	host, ok := r.ByUUID(dm.Host.Class, uuid)
	if !ok {
		return nil
	}
	var pins []string
	refs, _ := r.Value(host, dm.Host.Certificates).([]string)
	for _, ref := range refs {
		if c, ok := r.Get(dm.Certificate.Class, ref); ok && c.String(dm.Certificate.Type) == string(dm.CertificateTypeHostInternal) {
			pins = append(pins, c.String(dm.Certificate.FingerprintSha256))
		}
	}
	return pins
}

// wantVoters is the number of voters a pool of n members has: the
// largest odd number up to MaxVoters (an even number of voters tolerates
// no more failures than one fewer, and needs one more answer for every
// write).
func wantVoters(n int) int {
	want := min(n, MaxVoters)
	if want%2 == 0 {
		want--
	}
	return want
}

// planVoters is the rule balanceVoters follows. It promotes non-voters
// that have shown they are live (proven), in raft's order, up to the
// largest odd number of voters (wantVoters) that the voters and those
// can make; it demotes voters other than self, in raft's order, while
// the pool has more than its size wants. A non-voter not proven is never
// promoted, whatever seats are open; and proven ones are not promoted to
// an even number of voters, which would need one more answer for every
// write and tolerate no more failures.
func planVoters(servers []raft.Server, self raft.ServerID, proven func(raft.ServerID) bool) (promote, demote []raft.Server) {
	voters := countVoters(servers)
	eligible := voters
	for _, s := range servers {
		if s.Suffrage == raft.Nonvoter && proven(s.ID) {
			eligible++
		}
	}
	up, down := wantVoters(eligible), wantVoters(len(servers))
	for _, s := range servers {
		switch {
		case voters < up && s.Suffrage == raft.Nonvoter && proven(s.ID):
			promote = append(promote, s)
			voters++
		case voters > down && s.Suffrage == raft.Voter && s.ID != self:
			demote = append(demote, s)
			voters--
		}
	}
	return promote, demote
}

// proveState is what the coordinator remembers of a member that has not
// shown it is live: why, since when, how many checks in a row failed,
// when to check again, and whether it warned of it.
type proveState struct {
	why    string
	since  time.Time
	fails  int
	next   time.Time
	warned bool
}

// voters is the coordinator's bookkeeping of promotions.
type voters struct {
	mu       sync.Mutex // one rebalance at a time
	unproven map[raft.ServerID]*proveState
	kick     chan struct{} // a member was added: rebalance now
}

// balanceVoters promotes members that have shown they are live, or
// demotes members, until the pool has the voters it wants (planVoters).
// The coordinator itself stays a voter.
func (p *Pool) balanceVoters() error {
	_, err := p.rebalance(context.Background(), "")
	return err
}

// rebalance is balanceVoters. It checks the non-voters due for a check
// while a seat is open, and force (a raft ID, or "") whether due or not.
// It returns how long until the next check of a member that failed one
// while a seat is still open (0: none is waiting).
func (p *Pool) rebalance(ctx context.Context, force raft.ServerID) (time.Duration, error) {
	rf := p.cfg.Repl.Raft()
	if rf == nil {
		return 0, nil
	}
	p.votes.mu.Lock()
	defer p.votes.mu.Unlock()
	f := rf.GetConfiguration()
	if err := f.Error(); err != nil {
		return 0, err
	}
	servers := f.Configuration().Servers
	proven := p.proveNonvoters(ctx, servers, force)
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	promote, demote := planVoters(servers, raft.ServerID(p.cfg.HostUUID), func(id raft.ServerID) bool { return proven[id] })
	for _, s := range promote {
		if err := rf.AddVoter(s.ID, s.Address, 0, 30*time.Second).Error(); err != nil {
			return 0, err
		}
		p.log.Info("a member showed it is a live toolstackd: it is a voter now", "host", s.ID, "address", s.Address)
	}
	for _, s := range demote {
		if err := rf.DemoteVoter(s.ID, 0, 30*time.Second).Error(); err != nil {
			return 0, err
		}
	}
	if countVoters(servers)+len(promote) >= wantVoters(len(servers)) {
		return 0, nil
	}
	// A seat is still open: how long until a member waiting for it is
	// due for another check.
	var wake time.Duration
	now := time.Now()
	for _, s := range servers {
		if st := p.votes.unproven[s.ID]; st != nil && s.Suffrage == raft.Nonvoter {
			if d := max(st.next.Sub(now), time.Millisecond); wake == 0 || d < wake {
				wake = d
			}
		}
	}
	return wake, nil
}

// countVoters counts the voters among servers.
func countVoters(servers []raft.Server) int {
	n := 0
	for _, s := range servers {
		if s.Suffrage == raft.Voter {
			n++
		}
	}
	return n
}

// proveNonvoters checks, while the pool has a seat open, each non-voter
// due for a check (and force), proveParallel at a time, and returns
// those that passed. Those that failed are logged, once per reason, and
// their next check is put off. Called with votes.mu held.
func (p *Pool) proveNonvoters(ctx context.Context, servers []raft.Server, force raft.ServerID) map[raft.ServerID]bool {
	if p.votes.unproven == nil {
		p.votes.unproven = map[raft.ServerID]*proveState{}
	}
	present := map[raft.ServerID]bool{}
	for _, s := range servers {
		present[s.ID] = true
	}
	for id := range p.votes.unproven {
		if !present[id] {
			delete(p.votes.unproven, id)
		}
	}
	proven := map[raft.ServerID]bool{}
	if countVoters(servers) >= wantVoters(len(servers)) {
		return proven
	}
	now := time.Now()
	var due []raft.Server
	for _, s := range servers {
		if s.Suffrage != raft.Nonvoter {
			continue
		}
		if st := p.votes.unproven[s.ID]; st == nil || s.ID == force || !now.Before(st.next) {
			due = append(due, s)
		}
	}
	errs := make([]error, len(due))
	sem := make(chan struct{}, proveParallel)
	var wg sync.WaitGroup
	for i, s := range due {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = p.proveLive(ctx, s)
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return map[raft.ServerID]bool{} // cut short: nothing learnt
	}
	for i, s := range due {
		st := p.votes.unproven[s.ID]
		if errs[i] == nil {
			proven[s.ID] = true
			delete(p.votes.unproven, s.ID)
			continue
		}
		if st == nil {
			st = &proveState{since: now}
			p.votes.unproven[s.ID] = st
		}
		// Said once per reason; a warning once it has lasted proveGrace
		// (a member restarting, or still catching up, fails a moment).
		why, late := errs[i].Error(), now.Sub(st.since) >= proveGrace
		switch {
		case late && (!st.warned || why != st.why):
			p.log.Warn("a member has not shown it is a live toolstackd: it stays a non-voter",
				"host", s.ID, "address", s.Address, "why", why, "since", st.since.Format(time.RFC3339))
			st.warned = true
		case why != st.why && !late:
			p.log.Info("a member has not shown it is a live toolstackd yet: it stays a non-voter for now",
				"host", s.ID, "address", s.Address, "why", why)
		}
		st.why = why
		st.next = now.Add(min(firstProveRetry<<min(st.fails, 16), maxProveBackoff))
		st.fails++
	}
	return proven
}

// passed reports whether the member id passed its last check (a member
// checked by rebalance is remembered only while it fails).
func (p *Pool) passed(id raft.ServerID) bool {
	p.votes.mu.Lock()
	defer p.votes.mu.Unlock()
	return p.votes.unproven[id] == nil
}

// kickVoters has the coordinator's keepVoters rebalance now.
func (p *Pool) kickVoters() {
	select {
	case p.votes.kick <- struct{}{}:
	default:
	}
}

// keepVoters rebalances the pool's voters while this host coordinates:
// every voterSweep, when kicked, and when a member waiting for a seat is
// due for another check; until stop closes.
func (p *Pool) keepVoters(stop <-chan struct{}) {
	// Checks in flight end when watching stops.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	t := time.NewTimer(voterSweep)
	defer t.Stop()
	last := ""
	for {
		select {
		case <-stop:
			return
		case <-p.votes.kick:
		case <-t.C:
		}
		next := voterSweep
		if p.cfg.Repl.Mode() == dbraft.Leader {
			wake, err := p.rebalance(ctx, "")
			switch {
			case ctx.Err() != nil:
				return
			case err != nil && err.Error() != last:
				p.log.Warn("could not rebalance the pool's voters", "err", err)
				last = err.Error()
			case err == nil:
				last = ""
			}
			if wake > 0 && wake < next {
				next = wake
			}
		}
		t.Reset(next)
	}
}

// joinedAnswer is the coordinator's answer at joinedPath.
type joinedAnswer struct {
	Voter bool `json:"voter"` // the joiner is a voter now
}

// serveJoined: a joiner holds the pool's database. The coordinator checks
// it at once, and again until it is a voter, the pool has no seat for
// it, or joinedWait has passed.
func (p *Pool) serveJoined(w http.ResponseWriter, r *http.Request) {
	m, ok := p.readMember(w, r)
	if !ok {
		return
	}
	if p.cfg.Repl.Mode() != dbraft.Leader {
		http.Error(w, "this host is not the coordinator", http.StatusConflict)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), joinedWait)
	defer cancel()
	voter, err := p.awaitVoter(ctx, raft.ServerID(m.UUID))
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(joinedAnswer{Voter: voter})
}

// awaitVoter checks the member id, on the coordinator, until it is a
// voter (true), or the pool has no seat for it, or it passed its check
// and stays a non-voter by the rule of odd numbers, or ctx ends (false).
func (p *Pool) awaitVoter(ctx context.Context, id raft.ServerID) (bool, error) {
	for {
		if _, err := p.rebalance(ctx, id); err != nil && ctx.Err() == nil {
			p.log.Warn("could not rebalance the pool's voters", "err", err)
		}
		servers := p.raftServers()
		i := slices.IndexFunc(servers, func(s raft.Server) bool { return s.ID == id })
		switch {
		case i < 0:
			return false, errNotInRaft
		case servers[i].Suffrage == raft.Voter:
			return true, nil
		case countVoters(servers) >= wantVoters(len(servers)), p.passed(id):
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, nil
		case <-time.After(firstProveRetry):
		}
	}
}

// announceJoined tells the coordinator, at the end of a join, that this
// host holds the pool's database (serveJoined), and logs whether it is a
// voter now. A coordinator that cannot be told finds out by itself.
func (p *Pool) announceJoined(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, joinedWait+2*pingTimeout)
	defer cancel()
	leader, err := p.cfg.Repl.WaitLeader(ctx)
	if err != nil {
		p.log.Info("pool.join: no coordinator to tell this host has joined; it will find out", "err", err)
		return
	}
	body, err := json.Marshal(member{UUID: p.cfg.HostUUID, Address: p.Advertised()})
	if err != nil {
		return
	}
	resp, err := p.post(ctx, leader, joinedPath, "application/json", body)
	if err != nil {
		p.log.Info("pool.join: the coordinator was not told this host has joined; it will find out", "coordinator", leader, "err", err)
		return
	}
	defer func() { _ = resp.Body.Close() }()
	var ans joinedAnswer
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, maxMessage)).Decode(&ans) != nil {
		p.log.Info("pool.join: the coordinator did not take this host's word that it has joined", "coordinator", leader, "status", resp.Status)
		return
	}
	p.log.Info("pool.join: the coordinator checked this host", "voter", ans.Voter)
}

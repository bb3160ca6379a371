package pool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/raft"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/pool/dbraft"
	"toolstackd/internal/pool/replica"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// MaxVoters is the most raft voters a pool has; other members replicate
// without voting.
const MaxVoters = 5

// joinTimeout bounds a whole join, both sides.
const joinTimeout = 60 * time.Second

// JoinRequest is what a joining host sends the coordinator, with the
// coordinator's credentials in the request's basic authorization (checked
// before the body is read).
type JoinRequest struct {
	UUID    string `json:"uuid"`    // the joiner's host uuid: its raft ID
	Address string `json:"address"` // where the pool reaches it: its raft address
	Rows    []byte `json:"rows"`    // its own rows (replica.EncodeRows)
	// Cert is its certificate (PEM) when it speaks TLS: the pool pins it.
	Cert string `json:"cert,omitempty"`
	// APIVersion and DBSchema are its XenAPI and database schema
	// versions: the coordinator admits its own only (joincheck.go).
	APIVersion *Version `json:"api_version,omitempty"`
	DBSchema   *Version `json:"db_schema,omitempty"`
}

// JoinReply is the coordinator's answer: the secret and the raft index
// the joiner must reach, or a XenAPI error (code, then parameters). To a
// GET it is the coordinator's versions (or an error): what the joiner
// checks before it sends its own request.
type JoinReply struct {
	Secret     string   `json:"secret,omitempty"`
	Index      uint64   `json:"index,omitempty"`
	Error      []string `json:"error,omitempty"`
	APIVersion *Version `json:"api_version,omitempty"`
	DBSchema   *Version `json:"db_schema,omitempty"`
}

// join is pool.join, on the joining host.
func (p *Pool) join(c *api.Call, a dm.PoolJoinArgs) (dm.Void, error) {
	if !p.joinMu.TryLock() {
		poolRef := ""
		for _, r := range c.Snapshot().All(dm.Pool.Class) {
			poolRef = r.Ref
		}
		return dm.Void{}, xerr.New(xerr.OtherOperationInProgress, "pool", poolRef, "join", "")
	}
	defer p.joinMu.Unlock()
	if p.cfg.Repl.Mode() != dbraft.Standalone {
		return dm.Void{}, xerr.New(xerr.JoiningHostCannotBeMasterOfOtherHosts)
	}
	snap := c.Snapshot()
	if err := joinable(snap, p.cfg.Server.Cfg.HostRef); err != nil {
		return dm.Void{}, err
	}
	master, err := p.masterAddress(a.MasterAddress)
	if err != nil {
		return dm.Void{}, err
	}
	ctx, cancel := context.WithTimeout(c.Ctx, joinTimeout)
	defer cancel()
	// Nothing is pinned yet: the coordinator's certificate is taken on
	// this first contact and trusted alone until the pool's database,
	// with the pool's certificates, arrives.
	first, seen := p.firstContact()
	// The coordinator's versions first: a pool this host cannot be part
	// of gets nothing of this host's.
	if err := p.checkMasterVersions(ctx, first, master, a.MasterUsername, a.MasterPassword); err != nil {
		return dm.Void{}, err
	}
	req := JoinRequest{UUID: p.cfg.HostUUID, Address: p.Advertised(),
		Rows:       replica.EncodeRows(OwnRows(snap, p.cfg.Server.Cfg.HostRef)),
		APIVersion: APIVersion(), DBSchema: SchemaVersion(p.cfg.Server.Model)}
	if own := p.ownCert(); own != nil {
		req.Cert = certPEM(own)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return dm.Void{}, err
	}
	reply, err := p.askMaster(ctx, first, master, http.MethodPost, body, a.MasterUsername, a.MasterPassword)
	if errors.Is(err, errNoAnswer) {
		return dm.Void{}, xerr.New(xerr.JoiningHostServiceFailed)
	}
	if err != nil {
		return dm.Void{}, err
	}
	if err := p.secrets.Set(reply.Secret); err != nil {
		return dm.Void{}, err
	}
	if fp := seen(); fp != "" {
		p.joinPin.Store(&fp)
		defer p.joinPin.Store(nil)
	}
	if err := p.startRaft(false); err != nil {
		return dm.Void{}, err
	}
	// Raft replaces this host's database with the pool's; the join is
	// done when it holds what the coordinator had after adding this host.
	if err := p.cfg.Repl.WaitApplied(ctx, reply.Index); err != nil {
		p.log.Error("pool.join: the pool's database did not arrive", "err", err)
		return dm.Void{}, xerr.New(xerr.JoiningHostServiceFailed)
	}
	if fp := seen(); fp != "" && !pinned(p.cfg.Server.DB.Snapshot(), fp) {
		p.log.Warn("pool.join: the coordinator's certificate is not pinned in the pool's database: this host will not accept it",
			"coordinator", master, "fingerprint", fp)
	}
	// This host holds the pool's database: the coordinator may now check
	// that it is live and make it a voter (voters.go). The join is done
	// either way; a member that is not a voter yet is made one later.
	p.announceJoined(ctx)
	p.log.Info("joined the pool", "coordinator", master)
	return dm.Void{}, nil
}

// askMaster sends a join's request (method with body) to the coordinator
// at master over the first-contact client, with the coordinator's
// credentials, and returns its answer; an error it answers is returned
// as that error.
func (p *Pool) askMaster(ctx context.Context, first *http.Client, master, method string, body []byte, user, pw string) (JoinReply, error) {
	var reply JoinReply
	hreq, err := http.NewRequestWithContext(ctx, method, JoinPath, bytes.NewReader(body))
	if err != nil {
		return reply, err
	}
	if body != nil {
		hreq.Header.Set("Content-Type", "application/json")
	}
	p.toPeer(hreq, master)
	// The coordinator checks its own credentials, as xapi's join logs in
	// to the master with them (over TLS where the hosts serve HTTPS).
	hreq.SetBasicAuth(user, pw)
	resp, err := first.Do(hreq)
	if err != nil {
		p.log.Warn("pool.join: cannot reach the master", "master", master, "err", err)
		return reply, xerr.New(xerr.JoiningHostConnectionFailed)
	}
	defer func() { _ = resp.Body.Close() }()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&reply); err != nil {
		p.log.Warn("pool.join: the master's answer is not one", "master", master, "method", method, "status", resp.Status, "err", err)
		return reply, errNoAnswer
	}
	if len(reply.Error) > 0 {
		return reply, xerr.New(reply.Error[0], reply.Error[1:]...)
	}
	return reply, nil
}

// errNoAnswer: the master's answer to a join's request is not one.
var errNoAnswer = errors.New("pool: the master's answer is not a join's answer")

// checkMasterVersions asks the coordinator at master for its versions
// and refuses to join a pool whose API or schema version is not this
// host's. A coordinator that does not say (a toolstackd from before
// versions were checked, or no toolstackd) is left to the join request
// itself, which carries this host's versions; a coordinator that refuses
// the credentials or is a member is refused here, before this host sends
// its own request.
func (p *Pool) checkMasterVersions(ctx context.Context, first *http.Client, master, user, pw string) error {
	reply, err := p.askMaster(ctx, first, master, http.MethodGet, nil, user, pw)
	switch {
	case errors.Is(err, errNoAnswer):
		return nil
	case err != nil:
		return err
	case reply.APIVersion == nil && reply.DBSchema == nil:
		return nil
	}
	if err := checkVersions(APIVersion(), SchemaVersion(p.cfg.Server.Model), reply.APIVersion, reply.DBSchema); err != nil {
		p.log.Warn("pool.join: the master runs other versions than this host", "master", master, "err", err)
		return err
	}
	return nil
}

// masterAddress is "ip:port" for pool.join's master_address, which may
// omit the port (this host's own is meant).
func (p *Pool) masterAddress(s string) (string, error) {
	if _, _, err := net.SplitHostPort(s); err == nil {
		return s, nil
	}
	if s == "" || len(s) > 255 {
		return "", xerr.New(xerr.InvalidValue, "master_address", s)
	}
	return net.JoinHostPort(s, p.cfg.Port), nil
}

// joinable checks what xapi checks of a joining host that toolstackd can
// see: it coordinates no other hosts, runs no VMs and has no shared SRs.
func joinable(snap db.Reader, self string) error {
	if snap.Count(dm.Host.Class) > 1 {
		return xerr.New(xerr.JoiningHostCannotBeMasterOfOtherHosts)
	}
	var err error
	snap.Ascend(dm.VM.Class, func(r *db.Row) bool {
		if ctrl, _ := r.Get(dm.VM.IsControlDomain).(bool); ctrl {
			return true
		}
		if ps, _ := r.Get(dm.VM.PowerState).(string); ps == string(dm.VMPowerStateRunning) || ps == string(dm.VMPowerStatePaused) {
			err = xerr.New(xerr.JoiningHostCannotHaveRunningVMs)
			return false
		}
		return true
	})
	if err != nil {
		return err
	}
	snap.Ascend(dm.SR.Class, func(r *db.Row) bool {
		if shared, _ := r.Get(dm.SR.Shared).(bool); shared {
			err = xerr.New(xerr.JoiningHostCannotContainSharedSRs)
			return false
		}
		return true
	})
	return err
}

// OwnRows are the rows a joining host brings into the pool: its host
// record and metrics, its CPUs, its storage (PBDs, their SRs, their VDIs)
// and its control domain (hostRecords without what only leaving needs).
func OwnRows(snap db.Reader, self string) []*db.Row {
	host, ok := snap.Get(dm.Host.Class, self)
	if !ok {
		return nil
	}
	return hostRecords(snap, host, false)
}

// hostRecords are the records that belong to a host: the host, its
// metrics and CPUs, its PBDs with the SRs only it sees and their VDIs,
// and its control domain with its metrics. leaving adds what goes with a
// host that leaves the pool: its PIFs, every VM resident on it, and the
// VBDs and VIFs of those VMs and disks. Relations are read through their
// derived sets, so nothing else in the pool is scanned. Its certificates
// go too, so that a host that left is no longer accepted as a peer.
func hostRecords(r db.Reader, host *db.Row, leaving bool) []*db.Row {
	var out []*db.Row
	seen := map[string]bool{}
	keep := func(row *db.Row) {
		if !seen[row.Ref] {
			seen[row.Ref] = true
			out = append(out, row)
		}
	}
	keep(host)
	add := func(c *schema.Class, refs ...string) {
		for _, ref := range refs {
			if row, ok := r.Get(c, ref); ok {
				keep(row)
			}
		}
	}
	refs := func(row *db.Row, f *schema.Field) []string { s, _ := r.Value(row, f).([]string); return s }
	add(dm.HostMetrics.Class, host.String(dm.Host.Metrics))
	add(dm.HostCPU.Class, refs(host, dm.Host.HostCPUs)...)
	for _, ref := range refs(host, dm.Host.PIFs) {
		pif, ok := r.Get(dm.PIF.Class, ref)
		if !ok {
			continue
		}
		keep(pif)
		add(dm.PIFMetrics.Class, pif.String(dm.PIF.Metrics))
		if !leaving {
			// Joining, the network comes too: the coordinator puts the
			// PIF on the pool's network with the same bridge, or adds it.
			add(dm.Network.Class, pif.String(dm.PIF.Network))
		}
	}
	if leaving {
		add(dm.Certificate.Class, refs(host, dm.Host.Certificates)...) // its pins: it is refused from now on
	}
	var vdis []*db.Row
	for _, pbd := range refs(host, dm.Host.PBDs) {
		add(dm.PBD.Class, pbd)
		row, ok := r.Get(dm.PBD.Class, pbd)
		if !ok {
			continue
		}
		sr, ok := r.Get(dm.SR.Class, row.String(dm.PBD.SR))
		if !ok || sr.Get(dm.SR.Shared) == true {
			continue
		}
		keep(sr)
		for _, ref := range refs(sr, dm.SR.VDIs) {
			if vdi, ok := r.Get(dm.VDI.Class, ref); ok {
				vdis = append(vdis, vdi)
			}
		}
	}
	for _, vdi := range vdis {
		keep(vdi)
	}
	for _, ref := range refs(host, dm.Host.ResidentVMs) {
		vm, ok := r.Get(dm.VM.Class, ref)
		if !ok {
			continue
		}
		if ctrl, _ := vm.Get(dm.VM.IsControlDomain).(bool); !ctrl && !leaving {
			continue
		}
		keep(vm)
		add(dm.VMMetrics.Class, vm.String(dm.VM.Metrics))
		add(dm.VMGuestMetrics.Class, vm.String(dm.VM.GuestMetrics))
		if leaving {
			add(dm.VBD.Class, refs(vm, dm.VM.VBDs)...)
			add(dm.VIF.Class, refs(vm, dm.VM.VIFs)...)
		}
	}
	if leaving {
		for _, vdi := range vdis {
			add(dm.VBD.Class, refs(vdi, dm.VDI.VBDs)...)
		}
	}
	return out
}

// joinClasses are the classes a joining host may bring rows of.
var joinClasses = map[*schema.Class]bool{
	dm.Host.Class: true, dm.HostMetrics.Class: true, dm.HostCPU.Class: true, dm.PBD.Class: true, dm.SR.Class: true,
	dm.VDI.Class: true, dm.VM.Class: true, dm.VMMetrics.Class: true, dm.VMGuestMetrics.Class: true,
	dm.PIF.Class: true, dm.PIFMetrics.Class: true, dm.Network.Class: true,
}

// mergeNetworks puts a joining host's PIFs on the pool's networks: a
// network of the joiner whose bridge a pool network has already is
// dropped and its PIFs moved to the pool's (the management network of
// every host is "xenbr0", so each host's PIF on it lands on one pool-wide
// network, as xapi's join does); any other network joins the pool.
func mergeNetworks(snap db.Reader, rows []replica.Row) []replica.Row {
	byBridge := map[string]string{}
	snap.Ascend(dm.Network.Class, func(n *db.Row) bool {
		if b := n.String(dm.Network.Bridge); b != "" {
			byBridge[b] = n.Ref
		}
		return true
	})
	moved := map[string]string{}
	out := rows[:0]
	for _, row := range rows {
		if row.Class == dm.Network.Class {
			if b, _ := row.Values[dm.Network.Bridge.Index].(string); b != "" && byBridge[b] != "" && byBridge[b] != row.Ref {
				moved[row.Ref] = byBridge[b]
				continue
			}
		}
		out = append(out, row)
	}
	for _, row := range out {
		if row.Class != dm.PIF.Class {
			continue
		}
		if n, _ := row.Values[dm.PIF.Network.Index].(string); moved[n] != "" {
			row.Values[dm.PIF.Network.Index] = moved[n]
		}
	}
	return out
}

// serveJoin is the coordinator's side of pool.join: to a GET, its
// versions; to a POST, the join itself.
func (p *Pool) serveJoin(w http.ResponseWriter, r *http.Request) {
	reply := func(rep JoinReply) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(rep) //nolint:gosec // the pool secret goes to a host that proved pool-admin credentials

	}
	fail := func(err error) {
		xe := xerr.From(err)
		reply(JoinReply{Error: append([]string{xe.Code}, xe.Params...)})
	}
	if p.Member() {
		fail(xerr.New(xerr.HostIsSlave, p.Coordinator()))
		return
	}
	ctx, cancel := context.WithTimeout(api.WithOrigin(r.Context(), api.Origin{Remote: r.RemoteAddr}), joinTimeout)
	defer cancel()
	// Credentials first: nobody else gets a byte of the body read, nor
	// the versions.
	user, pw, _ := r.BasicAuth()
	if err := p.cfg.Server.CheckPoolAdmin(ctx, user, pw); err != nil {
		fail(err)
		return
	}
	if r.Method == http.MethodGet {
		reply(JoinReply{APIVersion: APIVersion(), DBSchema: SchemaVersion(p.cfg.Server.Model)})
		return
	}
	var req JoinRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxDelta)).Decode(&req); err != nil {
		http.Error(w, "a join request is JSON", http.StatusBadRequest)
		return
	}
	index, err := p.admit(ctx, req)
	if err != nil {
		p.log.Warn("a host could not join", "host", req.UUID, "address", req.Address, "err", err)
		fail(err)
		return
	}
	p.log.Info("a host joined the pool", "host", req.UUID, "address", req.Address)
	reply(JoinReply{Secret: p.secrets.Current(), Index: index})
}

// admit brings a joining host into the pool: its rows into the database,
// itself into raft. It returns the raft index the joiner must reach.
func (p *Pool) admit(ctx context.Context, req JoinRequest) (uint64, error) {
	// Versions first: rows of another schema are not read at all.
	if err := checkVersions(req.APIVersion, req.DBSchema, APIVersion(), SchemaVersion(p.cfg.Server.Model)); err != nil {
		return 0, err
	}
	if _, err := uuid.Parse(req.UUID); err != nil || len(req.UUID) != 36 || req.UUID == p.cfg.HostUUID {
		return 0, xerr.New(xerr.InvalidValue, "uuid", req.UUID)
	}
	if _, _, err := net.SplitHostPort(req.Address); err != nil {
		return 0, xerr.New(xerr.InvalidValue, "address", req.Address)
	}
	// Who it claims to be first (again below, under the join lock).
	if err := p.checkJoiner(p.cfg.Server.DB.Snapshot(), req.UUID, req.Address); err != nil {
		return 0, err
	}
	cert, err := p.joinCert(req.Cert)
	if err != nil {
		return 0, err
	}
	rows, err := replica.Decode(p.cfg.Server.Model, req.Rows)
	if err != nil {
		return 0, xerr.New(xerr.InvalidValue, "rows", err.Error())
	}
	for _, row := range rows {
		if row.Op != replica.OpPut || !joinClasses[row.Class] {
			return 0, xerr.New(xerr.InvalidValue, "rows", row.Class.Name)
		}
	}
	p.joinMu.Lock()
	defer p.joinMu.Unlock()
	if err := p.becomePool(ctx); err != nil {
		return 0, err
	}
	snap := p.cfg.Server.DB.Snapshot()
	if err := p.checkJoiner(snap, req.UUID, req.Address); err != nil {
		return 0, err
	}
	if err := checkJoinRows(snap, req.UUID, rows); err != nil {
		return 0, err
	}
	rows = mergeNetworks(snap, rows)
	_, err = p.cfg.Server.DB.Update(func(tx *db.Tx) error {
		if err := replica.ApplyTx(tx, rows); err != nil {
			return err
		}
		if cert == nil {
			return nil
		}
		// Pinned before the joiner's raft starts: the pool reaches it
		// only through this certificate.
		host, ok := tx.ByUUID(dm.Host.Class, req.UUID)
		if !ok {
			return xerr.New(xerr.InvalidValue, "rows", "no host row with the joining host's uuid")
		}
		return putHostCert(tx, host.Ref, cert)
	})
	if err != nil {
		return 0, err
	}
	rf := p.cfg.Repl.Raft()
	// A non-voter until it has shown it is a live toolstackd (voters.go):
	// the joiner says when it holds the pool's database (it cannot
	// before it has this answer), and the coordinator looks for itself
	// at its next sweep.
	if err := rf.AddNonvoter(raft.ServerID(req.UUID), raft.ServerAddress(req.Address), 0, 30*time.Second).Error(); err != nil {
		return 0, fmt.Errorf("adding the host to raft: %w", err)
	}
	if err := rf.Barrier(30 * time.Second).Error(); err != nil {
		return 0, err
	}
	return p.cfg.Repl.AppliedIndex(), nil
}

// becomePool makes a host alone the first host of a pool: raft with this
// host as its one voter, and a snapshot of the database as it is, which
// every joining host starts from.
func (p *Pool) becomePool(ctx context.Context) error {
	switch p.cfg.Repl.Mode() {
	case dbraft.Leader:
		return nil
	case dbraft.Follower:
		return xerr.New(xerr.HostIsSlave, p.Coordinator())
	}
	if err := p.startRaft(true); err != nil {
		return err
	}
	if err := p.cfg.Repl.WaitLeading(ctx); err != nil {
		return err
	}
	if own := p.ownCert(); own != nil {
		// The coordinator's own pin, in the snapshot every joiner starts from.
		if _, err := p.cfg.Server.DB.Update(func(tx *db.Tx) error {
			return putHostCert(tx, p.cfg.Server.Cfg.HostRef, own)
		}); err != nil {
			return fmt.Errorf("pool: pinning this host's certificate: %w", err)
		}
	}
	if err := p.cfg.Repl.Compact(); err != nil {
		return fmt.Errorf("pool: the first snapshot: %w", err)
	}
	p.log.Info("this host is now the coordinator of a pool")
	return nil
}

// designateNewMaster is pool.designate_new_master. xapi runs it on the
// host to be master (the route sends it there); that host asks the
// coordinator to hand raft's leadership to it.
func (p *Pool) designateNewMaster(c *api.Call, a dm.PoolDesignateNewMasterArgs) (dm.Void, error) {
	host, ok := c.Snapshot().Get(dm.Host.Class, string(a.Host))
	if !ok {
		return dm.Void{}, xerr.New(xerr.HandleInvalid, "host", string(a.Host))
	}
	switch mode := p.cfg.Repl.Mode(); {
	case mode == dbraft.Standalone || mode == dbraft.Leader && host.UUID() == p.cfg.HostUUID:
		return dm.Void{}, nil // already the master
	case mode == dbraft.Leader:
		return dm.Void{}, p.transferTo(host.UUID())
	}
	leader := p.cfg.Repl.LeaderAddr()
	if leader == "" {
		return dm.Void{}, xerr.New(xerr.CannotContactHost, "the coordinator")
	}
	ctx, cancel := context.WithTimeout(c.Ctx, 60*time.Second)
	defer cancel()
	return dm.Void{}, p.notifyXen(ctx, leader, transferPath, member{UUID: host.UUID()})
}

// transferPath asks the coordinator to hand leadership to a host.
const transferPath = "/pool/transfer"

// serveTransfer hands raft's leadership to the host named in the body.
func (p *Pool) serveTransfer(w http.ResponseWriter, r *http.Request) {
	var m member
	if readJSON(w, r, &m) {
		answer(w, p.transferTo(m.UUID), http.StatusConflict)
	}
}

// transferTo hands raft's leadership, on the coordinator, to the host
// with uuid id (made a voter first if it is not one), and returns once
// this host has stepped down.
func (p *Pool) transferTo(id string) error {
	rf := p.cfg.Repl.Raft()
	if rf == nil || p.cfg.Repl.Mode() != dbraft.Leader {
		return xerr.New(xerr.HostIsSlave, p.Coordinator())
	}
	f := rf.GetConfiguration()
	if err := f.Error(); err != nil {
		return err
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) != id {
			continue
		}
		if s.Suffrage != raft.Voter {
			// Only a host that shows it is live gets a vote: a host
			// that does not could not take the pool over anyway.
			if err := p.proveLive(context.Background(), s); err != nil {
				p.log.Warn("pool.designate_new_master: the host has not shown it is a live toolstackd", "host", id, "err", err)
				return xerr.New(xerr.HostOffline, id)
			}
			if err := rf.AddVoter(s.ID, s.Address, 0, 30*time.Second).Error(); err != nil {
				return err
			}
		}
		if err := rf.LeadershipTransferToServer(s.ID, s.Address).Error(); err != nil {
			return fmt.Errorf("handing over to %s: %w", id, err)
		}
		return nil
	}
	return xerr.New(xerr.HostOffline, id)
}

// syncDatabase is pool.sync_database: every member has everything
// committed once raft's barrier returns on the coordinator.
func (p *Pool) syncDatabase(c *api.Call, _ dm.PoolSyncDatabaseArgs) (dm.Void, error) {
	rf := p.cfg.Repl.Raft()
	if rf == nil {
		return dm.Void{}, nil // a host alone: its file is its database
	}
	if err := rf.Barrier(30 * time.Second).Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) {
			return dm.Void{}, xerr.New(xerr.HostIsSlave, p.Coordinator())
		}
		return dm.Void{}, err
	}
	return dm.Void{}, nil
}

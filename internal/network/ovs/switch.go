package ovs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/ovn-kubernetes/libovsdb/client"
	"github.com/ovn-kubernetes/libovsdb/model"
	"github.com/ovn-kubernetes/libovsdb/ovsdb"

	"toolstackd/internal/network"
	"toolstackd/internal/network/locking"
)

// DefaultDB is where Debian's openvswitch-switch serves the database.
const DefaultDB = "unix:/run/openvswitch/db.sock"

// Config is what Open needs.
type Config struct {
	// DB is the Open vSwitch database: "unix:/path" or "tcp:host:port"
	// (DefaultDB when empty).
	DB string
	// Kernel is the network namespace's links (netlinkx), for what is
	// not a bridge or port of Open vSwitch: NICs, bonds, VLANs, tunnels,
	// addresses, routes, and the VIFs' taps.
	Kernel network.Links
	// Datapath forces the datapath type of new bridges ("system" or
	// "netdev"); "" or "auto" probes (ChooseDatapath).
	Datapath string
	// OVN is the OVN northbound database ("unix:/path", "tcp:host:port");
	// empty: no OVN mode.
	OVN string
	// Timeout bounds the wait for ovs-vswitchd to apply a change and for
	// a connection (10 s when 0).
	Timeout time.Duration
	// RunDir is where ovs-vswitchd keeps the bridges' management sockets
	// (<bridge>.mgmt), for VIF locking without OVN; "" for the
	// directory of DB's unix socket, or DefaultRunDir.
	RunDir string
	// Ofctl is the ovs-ofctl to run for VIF locking without OVN: "" for
	// the one on PATH, "none" for none (locked and disabled VIFs are then
	// refused).
	Ofctl string
	Log   *slog.Logger
}

// Switch is the Open vSwitch backend: a network.Links whose bridges and
// bridge ports are Open vSwitch's, the rest the kernel's, and a
// network.VIFPorts.
type Switch struct {
	network.Links // the kernel, for what is not Open vSwitch's

	cfg Config
	c   client.Client
	nb  *Northbound // nil without OVN
	dp  string
	log *slog.Logger
	of  ofctl // VIF locking without OVN (locking_ofctl.go)

	mu   sync.Mutex          // one change of the database (or of OpenFlow rules) at a time
	vifs map[string]*vifLock // by VIF uuid: the rules written for it
}

var (
	_ network.Links    = (*Switch)(nil)
	_ network.VIFPorts = (*Switch)(nil)
)

// Missing says what stands between this host and an Open vSwitch
// database at endpoint, naming the socket and the package ("" when the
// socket is there or the endpoint is not a unix socket).
func Missing(endpoint string) string {
	path, ok := strings.CutPrefix(endpoint, "unix:")
	if !ok {
		return ""
	}
	if _, err := os.Stat(path); err == nil {
		return ""
	}
	_, errSrv := exec.LookPath("ovsdb-server")
	_, errVS := exec.LookPath("ovs-vswitchd")
	if errSrv != nil || errVS != nil {
		return fmt.Sprintf("Open vSwitch is not installed (no ovsdb-server or ovs-vswitchd on PATH): install Debian's openvswitch-switch package, or use --network-backend linux; the database socket %s does not exist", path)
	}
	return fmt.Sprintf("no Open vSwitch database socket at %s: start ovsdb-server and ovs-vswitchd (Debian's openvswitch-switch service), or name the socket with --ovs-db", path)
}

// Open connects to the Open vSwitch database (and to OVN's northbound
// one in OVN mode), reads which datapath types ovs-vswitchd offers and
// chooses one. Without Open vSwitch it fails saying what is missing.
func Open(ctx context.Context, cfg Config) (*Switch, error) {
	if cfg.DB == "" {
		cfg.DB = DefaultDB
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Kernel == nil {
		return nil, errors.New("ovs: Config.Kernel is required")
	}
	if why := Missing(cfg.DB); why != "" {
		return nil, errors.New("ovs: " + why)
	}
	dbm, err := vswitchModel()
	if err != nil {
		return nil, fmt.Errorf("ovs: %w", err)
	}
	c, err := connect(ctx, dbm, vswitchTables, cfg.DB, cfg.Timeout)
	if err != nil {
		return nil, fmt.Errorf("ovs: Open vSwitch database %s: %w (is ovsdb-server running? Debian package openvswitch-switch)", cfg.DB, err)
	}
	s := &Switch{Links: cfg.Kernel, cfg: cfg, c: c, log: cfg.Log, vifs: map[string]*vifLock{},
		of: ofctl{path: findOfctl(cfg), rundir: runDir(cfg), timeout: cfg.Timeout}}
	root, err := s.waitRoot(ctx, func(r ovsRoot) bool { return len(r.DatapathTypes) > 0 })
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("ovs: ovs-vswitchd has not registered with %s within %v (is ovs-vswitchd running?): %w", cfg.DB, cfg.Timeout, err)
	}
	_, modErr := os.Stat(KernelModulePath)
	if s.dp, err = ChooseDatapath(root.DatapathTypes, modErr == nil, cfg.Datapath); err != nil {
		c.Close()
		return nil, err
	}
	if cfg.OVN != "" {
		if s.nb, err = OpenNorthbound(ctx, cfg.OVN, cfg.Timeout); err != nil {
			c.Close()
			return nil, err
		}
	}
	s.log.Info("ovs: connected", "db", cfg.DB, "datapath_type", s.dp, "ovn", cfg.OVN, "ovs-ofctl", s.of.path)
	if s.dp == "netdev" && root.OtherConfig[KeyUserspaceTSO] != "true" {
		s.log.Warn("ovs: the userspace datapath without userspace TSO forwards the segments of QEMU guests with virtio " +
			"offloads unfinished, so their TCP does not get through: set Open_vSwitch other_config:" + KeyUserspaceTSO +
			"=true and restart ovs-vswitchd")
	}
	if cfg.OVN == "" && s.of.path == "" {
		s.log.Warn("ovs: VIFs that must be locked or disabled will be refused: " + OfctlMissing)
	}
	// The VIFs' rules follow their ports across a restart of the daemon;
	// a failure is logged, not fatal (the API must come up to fix it).
	if err := s.reapplyLocking(ctx); err != nil {
		s.log.Warn("ovs: writing the VIFs' locking rules again", "err", err)
	}
	return s, nil
}

// connect opens a libovsdb client on endpoint and monitors the model's
// tables into its cache, only the model's columns: an update of a column
// the model lacks would fail the cache's whole update (and with it the
// cur_cfg this package waits for).
func connect(ctx context.Context, dbm model.ClientDBModel, tables map[string]model.Model, endpoint string, timeout time.Duration) (client.Client, error) {
	// Reconnect (and monitor again) when the server restarts: an
	// operation meanwhile fails, and the module's Watch tries again.
	c, err := client.NewOVSDBClient(dbm, client.WithEndpoint(endpoint), client.WithReconnect(timeout, backoff.NewExponentialBackOff()))
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.Connect(cctx); err != nil {
		return nil, err
	}
	mon := c.NewMonitor()
	for table, m := range tables {
		mon.Tables = append(mon.Tables, client.TableMonitor{Table: table, Fields: columnsOf(m)})
	}
	if _, err := c.Monitor(cctx, mon); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Close disconnects from the databases (what was made stays).
func (s *Switch) Close() error {
	if s.nb != nil {
		s.nb.Close()
	}
	s.c.Close()
	return nil
}

// Datapath is the datapath type new bridges get.
func (s *Switch) Datapath() string { return s.dp }

// root is the Open_vSwitch row from the cache.
func (s *Switch) root() (ovsRoot, bool) {
	var rs []ovsRoot
	if err := s.c.List(context.Background(), &rs); err != nil || len(rs) == 0 {
		return ovsRoot{}, false
	}
	return rs[0], true
}

// waitRoot waits until the cache's Open_vSwitch row satisfies cond.
func (s *Switch) waitRoot(ctx context.Context, cond func(ovsRoot) bool) (ovsRoot, error) {
	deadline := time.Now().Add(s.cfg.Timeout)
	for {
		if r, ok := s.root(); ok && cond(r) {
			return r, nil
		}
		if time.Now().After(deadline) {
			return ovsRoot{}, errors.New("timed out")
		}
		select {
		case <-ctx.Done():
			return ovsRoot{}, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// state is the bridges, ports and interfaces in the cache.
type state struct {
	bridges    map[string]bridgeRow // by name
	ports      map[string]portRow   // by name
	ifaces     map[string]ifaceRow  // by uuid
	portBridge map[string]string    // port name -> bridge name
}

func (s *Switch) state() (state, error) {
	var bs []bridgeRow
	var ps []portRow
	var is []ifaceRow
	ctx := context.Background()
	if err := s.c.List(ctx, &bs); err != nil {
		return state{}, err
	}
	if err := s.c.List(ctx, &ps); err != nil {
		return state{}, err
	}
	if err := s.c.List(ctx, &is); err != nil {
		return state{}, err
	}
	st := state{bridges: map[string]bridgeRow{}, ports: map[string]portRow{}, ifaces: map[string]ifaceRow{}, portBridge: map[string]string{}}
	portByUUID := map[string]portRow{}
	for _, p := range ps {
		st.ports[p.Name] = p
		portByUUID[p.UUID] = p
	}
	for _, i := range is {
		st.ifaces[i.UUID] = i
	}
	for _, b := range bs {
		st.bridges[b.Name] = b
		for _, pu := range b.Ports {
			if p, ok := portByUUID[pu]; ok && p.Name != b.Name {
				st.portBridge[p.Name] = b.Name
			}
		}
	}
	return st, nil
}

func ours(ids map[string]string, what string) bool { return ids[OwnerKey] == what }

// transact runs ops with next_cfg incremented and waits until
// ovs-vswitchd has applied them (cur_cfg caught up), as ovs-vsctl does;
// by then the cache holds the result too.
func (s *Switch) transact(ctx context.Context, ops []ovsdb.Operation) error {
	root, ok := s.root()
	if !ok {
		return errors.New("ovs: no Open_vSwitch row in the database")
	}
	where := []ovsdb.Condition{{Column: "_uuid", Function: ovsdb.ConditionEqual, Value: ovsdb.UUID{GoUUID: root.UUID}}}
	ops = append(ops,
		ovsdb.Operation{Op: ovsdb.OperationMutate, Table: "Open_vSwitch", Where: where,
			Mutations: []ovsdb.Mutation{{Column: "next_cfg", Mutator: ovsdb.MutateOperationAdd, Value: 1}}},
		ovsdb.Operation{Op: ovsdb.OperationSelect, Table: "Open_vSwitch", Where: where, Columns: []string{"next_cfg"}})
	tctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	res, err := s.c.Transact(tctx, ops...)
	if err != nil {
		return fmt.Errorf("ovs: transaction: %w", err)
	}
	if errs, err := ovsdb.CheckOperationResults(res, ops); err != nil {
		return fmt.Errorf("ovs: transaction: %w %v", err, errs)
	}
	sel := res[len(ops)-1]
	if len(sel.Rows) != 1 {
		return errors.New("ovs: transaction: no next_cfg read back")
	}
	next, err := intOf(sel.Rows[0]["next_cfg"])
	if err != nil {
		return err
	}
	if err := s.waitCfg(ctx, next); err != nil {
		return fmt.Errorf("ovs: ovs-vswitchd did not apply the change within %v (is ovs-vswitchd running?): %w", s.cfg.Timeout, err)
	}
	return nil
}

// waitCfg waits until ovs-vswitchd has applied configuration next
// (cur_cfg), watching the cache and, every 100 ms, asking the server
// itself, so that a cache running behind cannot stall a change.
func (s *Switch) waitCfg(ctx context.Context, next int) error {
	deadline := time.Now().Add(s.cfg.Timeout)
	lastAsked := time.Now()
	for {
		if r, ok := s.root(); ok && r.CurCfg >= next {
			return nil
		}
		if time.Since(lastAsked) >= 100*time.Millisecond {
			lastAsked = time.Now()
			if cur, err := s.readCurCfg(ctx); err == nil && cur >= next {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// readCurCfg reads cur_cfg from the server (a read-only transaction).
func (s *Switch) readCurCfg(ctx context.Context) (int, error) {
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	op := ovsdb.Operation{Op: ovsdb.OperationSelect, Table: "Open_vSwitch", Columns: []string{"cur_cfg"}}
	res, err := s.c.Transact(tctx, op)
	if err != nil {
		return 0, err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		return 0, errors.New("ovs: no Open_vSwitch row")
	}
	return intOf(res[0].Rows[0]["cur_cfg"])
}

func intOf(v any) (int, error) {
	switch v := v.(type) {
	case float64:
		return int(v), nil
	case int:
		return v, nil
	}
	return 0, fmt.Errorf("ovs: %T where a number was expected", v)
}

// mutateSet is a mutate of one set column of uuids of one row.
func mutateSet(table, rowUUID, column string, mutator ovsdb.Mutator, uuids ...string) ovsdb.Operation {
	set := make([]any, 0, len(uuids))
	for _, u := range uuids {
		set = append(set, ovsdb.UUID{GoUUID: u}) // a named uuid marshals as one
	}
	return ovsdb.Operation{Op: ovsdb.OperationMutate, Table: table,
		Where:     []ovsdb.Condition{{Column: "_uuid", Function: ovsdb.ConditionEqual, Value: ovsdb.UUID{GoUUID: rowUUID}}},
		Mutations: []ovsdb.Mutation{{Column: column, Mutator: mutator, Value: ovsdb.OvsSet{GoSet: set}}}}
}

// newPort is the insert of an Interface and its Port named name, added to
// bridge br, with the external_ids given.
func newPort(br bridgeRow, name, typ string, mtu int, portIDs, ifaceIDs map[string]string) []ovsdb.Operation {
	irow := ovsdb.Row{"name": name}
	if typ != "" {
		irow["type"] = typ
	}
	if mtu > 0 {
		irow["mtu_request"] = ovsdb.OvsSet{GoSet: []any{mtu}}
	}
	if len(ifaceIDs) > 0 {
		irow["external_ids"] = ovsMap(ifaceIDs)
	}
	prow := ovsdb.Row{"name": name, "interfaces": ovsdb.UUID{GoUUID: "newiface"}}
	if len(portIDs) > 0 {
		prow["external_ids"] = ovsMap(portIDs)
	}
	return []ovsdb.Operation{
		{Op: ovsdb.OperationInsert, Table: "Interface", Row: irow, UUIDName: "newiface"},
		{Op: ovsdb.OperationInsert, Table: "Port", Row: prow, UUIDName: "newport"},
		mutateSet("Bridge", br.UUID, "ports", ovsdb.MutateOperationInsert, "newport"),
	}
}

func ovsMap(m map[string]string) ovsdb.OvsMap {
	om := ovsdb.OvsMap{GoMap: map[any]any{}}
	for k, v := range m {
		om.GoMap[k] = v
	}
	return om
}

// List is the kernel's links with Open vSwitch's view laid over: a bridge
// of Open vSwitch is a "bridge" (ours when toolstackd made it, even
// before its device exists) and a port of one has it as its master.
func (s *Switch) List() ([]network.Link, error) {
	ls, err := s.Links.List()
	if err != nil {
		return nil, err
	}
	st, err := s.state()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for i := range ls {
		l := &ls[i]
		seen[l.Name] = true
		if b, ok := st.bridges[l.Name]; ok {
			l.Kind, l.Ours, l.Master, l.Physical = "bridge", ours(b.ExternalIDs, ownBridge), "", false
		} else if b := st.portBridge[l.Name]; b != "" {
			l.Master = b
		}
	}
	for name, b := range st.bridges {
		if !seen[name] {
			ls = append(ls, network.Link{Name: name, Kind: "bridge", Ours: ours(b.ExternalIDs, ownBridge)})
		}
	}
	return ls, nil
}

// Get is one link as List says it.
func (s *Switch) Get(name string) (network.Link, error) {
	ls, err := s.List()
	if err != nil {
		return network.Link{}, err
	}
	for _, l := range ls {
		if l.Name == name {
			return l, nil
		}
	}
	return network.Link{}, fmt.Errorf("%w: %s", network.ErrNotFound, name)
}

// AddBridge makes an Open vSwitch bridge of the chosen datapath type,
// marked as ours, with its internal interface at mtu; an existing one of
// ours gets the MTU.
func (s *Switch) AddBridge(name string, mtu int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx := context.Background()
	st, err := s.state()
	if err != nil {
		return err
	}
	if b, ok := st.bridges[name]; ok {
		if !ours(b.ExternalIDs, ownBridge) {
			return fmt.Errorf("%w: Open vSwitch bridge %s", network.ErrNotOurs, name)
		}
		return s.setMTULocked(ctx, st, name, mtu)
	}
	if _, err := s.Links.Get(name); err == nil {
		return fmt.Errorf("ovs: a link %s exists already and is not an Open vSwitch bridge: %w", name, network.ErrNotOurs)
	}
	root, ok := s.root()
	if !ok {
		return errors.New("ovs: no Open_vSwitch row in the database")
	}
	irow := ovsdb.Row{"name": name, "type": "internal"}
	if mtu > 0 {
		irow["mtu_request"] = ovsdb.OvsSet{GoSet: []any{mtu}}
	}
	ops := []ovsdb.Operation{
		{Op: ovsdb.OperationInsert, Table: "Interface", Row: irow, UUIDName: "newiface"},
		{Op: ovsdb.OperationInsert, Table: "Port", UUIDName: "newport",
			Row: ovsdb.Row{"name": name, "interfaces": ovsdb.UUID{GoUUID: "newiface"}, "external_ids": ovsMap(map[string]string{OwnerKey: ownBridge})}},
		{Op: ovsdb.OperationInsert, Table: "Bridge", UUIDName: "newbridge",
			Row: ovsdb.Row{"name": name, "ports": ovsdb.UUID{GoUUID: "newport"}, "datapath_type": s.dp,
				"external_ids": ovsMap(map[string]string{OwnerKey: ownBridge})}},
		mutateSet("Open_vSwitch", root.UUID, "bridges", ovsdb.MutateOperationInsert, "newbridge"),
	}
	if err := s.transact(ctx, ops); err != nil {
		return err
	}
	// The bridge's device is ovs-vswitchd's; marking it ours lets the
	// kernel side bring it up and give it addresses. No device means
	// ovs-vswitchd could not make the bridge: it is removed again.
	if err := s.Links.Adopt(name); err != nil {
		if st, serr := s.state(); serr == nil {
			if b, ok := st.bridges[name]; ok {
				_ = s.transact(ctx, []ovsdb.Operation{mutateSet("Open_vSwitch", root.UUID, "bridges", ovsdb.MutateOperationDelete, b.UUID)})
			}
		}
		return fmt.Errorf("ovs: ovs-vswitchd did not make the device of bridge %s (datapath type %s; see its log): %w", name, s.dp, err)
	}
	return nil
}

// kernelOwn marks the device of an Open vSwitch bridge of ours as the
// module's in the kernel (ovs-vswitchd may have made it again since).
func (s *Switch) kernelOwn(name string) error {
	st, err := s.state()
	if err != nil {
		return err
	}
	if b, ok := st.bridges[name]; ok && ours(b.ExternalIDs, ownBridge) {
		if l, err := s.Links.Get(name); err == nil && !l.Ours {
			return s.Links.Adopt(name)
		}
	}
	return nil
}

// SetUp brings a link up (an Open vSwitch bridge's device included).
func (s *Switch) SetUp(name string) error {
	if err := s.kernelOwn(name); err != nil {
		return err
	}
	return s.Links.SetUp(name)
}

// SetDown brings a link down.
func (s *Switch) SetDown(name string) error {
	if err := s.kernelOwn(name); err != nil {
		return err
	}
	return s.Links.SetDown(name)
}

// ReplaceAddrs sets a link's addresses (an Open vSwitch bridge's device
// included).
func (s *Switch) ReplaceAddrs(name string, family int, addrs []net.IPNet) error {
	if err := s.kernelOwn(name); err != nil {
		return err
	}
	return s.Links.ReplaceAddrs(name, family, addrs)
}

// SetMTU sets the MTU of a link; an Open vSwitch bridge's through its
// internal interface's mtu_request, which ovs-vswitchd keeps.
func (s *Switch) SetMTU(name string, mtu int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.state()
	if err != nil {
		return err
	}
	if _, ok := st.bridges[name]; ok {
		return s.setMTULocked(context.Background(), st, name, mtu)
	}
	return s.Links.SetMTU(name, mtu)
}

func (s *Switch) setMTULocked(ctx context.Context, st state, name string, mtu int) error {
	b := st.bridges[name]
	if !ours(b.ExternalIDs, ownBridge) {
		return fmt.Errorf("%w: Open vSwitch bridge %s", network.ErrNotOurs, name)
	}
	p, ok := st.ports[name]
	if !ok || len(p.Interfaces) != 1 || mtu <= 0 {
		return nil
	}
	if i := st.ifaces[p.Interfaces[0]]; i.MTURequest != nil && *i.MTURequest == mtu {
		return nil
	}
	return s.transact(ctx, []ovsdb.Operation{{Op: ovsdb.OperationUpdate, Table: "Interface",
		Where: []ovsdb.Condition{{Column: "_uuid", Function: ovsdb.ConditionEqual, Value: ovsdb.UUID{GoUUID: p.Interfaces[0]}}},
		Row:   ovsdb.Row{"mtu_request": ovsdb.OvsSet{GoSet: []any{mtu}}}}})
}

// Delete removes an Open vSwitch bridge of ours (its ports go with it)
// or a kernel link of ours.
func (s *Switch) Delete(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.state()
	if err != nil {
		return err
	}
	b, ok := st.bridges[name]
	if !ok {
		// A link that is a port of ours (a VM's tap) leaves its bridge
		// first, so that no port is left naming a device that is gone.
		if st.portBridge[name] != "" && st.ports[name].ExternalIDs[OwnerKey] != "" {
			if err := s.dropFlowsLocked(context.Background(), name); err != nil {
				return err
			}
			ops, err := removePortOps(st, name)
			if err != nil {
				return err
			}
			if err := s.transact(context.Background(), ops); err != nil {
				return err
			}
		}
		return s.Links.Delete(name)
	}
	if !ours(b.ExternalIDs, ownBridge) {
		return fmt.Errorf("%w: Open vSwitch bridge %s", network.ErrNotOurs, name)
	}
	root, ok := s.root()
	if !ok {
		return errors.New("ovs: no Open_vSwitch row in the database")
	}
	// The bridge's rules go with it.
	for _, l := range s.vifs {
		if l.bridge == name {
			l.bridge, l.flows = "", nil
		}
	}
	return s.transact(context.Background(), []ovsdb.Operation{
		mutateSet("Open_vSwitch", root.UUID, "bridges", ovsdb.MutateOperationDelete, b.UUID)})
}

// removePortOps removes port name from the bridge it is on; a port
// toolstackd did not make is refused.
func removePortOps(st state, name string) ([]ovsdb.Operation, error) {
	br := st.portBridge[name]
	if br == "" {
		return nil, nil
	}
	p := st.ports[name]
	if p.ExternalIDs[OwnerKey] == "" {
		return nil, fmt.Errorf("%w: port %s of Open vSwitch bridge %s", network.ErrNotOurs, name, br)
	}
	return []ovsdb.Operation{mutateSet("Bridge", st.bridges[br].UUID, "ports", ovsdb.MutateOperationDelete, p.UUID)}, nil
}

// placePortOps puts name on bridge b as a port with the external_ids
// given: a new Port and Interface, or, when name is a port of ours on
// another bridge, that very Port moved (a Port and an Interface of the
// same name deleted and inserted in one transaction would trip the
// index of names in libovsdb's cache).
func placePortOps(st state, b bridgeRow, name string, portIDs, ifaceIDs map[string]string) ([]ovsdb.Operation, error) {
	cur := st.portBridge[name]
	if cur == "" {
		return newPort(b, name, "", 0, portIDs, ifaceIDs), nil
	}
	p := st.ports[name]
	if p.ExternalIDs[OwnerKey] == "" {
		return nil, fmt.Errorf("%w: port %s of Open vSwitch bridge %s", network.ErrNotOurs, name, cur)
	}
	ops := []ovsdb.Operation{
		mutateSet("Bridge", st.bridges[cur].UUID, "ports", ovsdb.MutateOperationDelete, p.UUID),
		mutateSet("Bridge", b.UUID, "ports", ovsdb.MutateOperationInsert, p.UUID),
		{Op: ovsdb.OperationUpdate, Table: "Port", Where: whereUUID(p.UUID), Row: ovsdb.Row{"external_ids": ovsMap(portIDs)}},
	}
	if ifaceIDs != nil {
		ops = append(ops, ovsdb.Operation{Op: ovsdb.OperationUpdate, Table: "Interface", Row: ovsdb.Row{"external_ids": ovsMap(ifaceIDs)},
			Where: []ovsdb.Condition{{Column: "name", Function: ovsdb.ConditionEqual, Value: name}}})
	}
	return ops, nil
}

// SetMaster puts dev on master: a port of an Open vSwitch bridge when
// master is one, else the kernel's enslaving (after taking dev off an
// Open vSwitch bridge it was on); "" frees it from either.
func (s *Switch) SetMaster(dev, master string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx := context.Background()
	st, err := s.state()
	if err != nil {
		return err
	}
	cur := st.portBridge[dev]
	if cur != "" && cur != master {
		// A VIF's port leaving its bridge leaves its rules behind.
		if err := s.dropFlowsLocked(ctx, dev); err != nil {
			return err
		}
	}
	if b, ok := st.bridges[master]; ok {
		if cur == master {
			return nil
		}
		if l, err := s.Links.Get(dev); err == nil && l.Master != "" {
			if err := s.Links.SetMaster(dev, ""); err != nil {
				return err
			}
		}
		ops, err := placePortOps(st, b, dev, map[string]string{OwnerKey: ownPort}, nil)
		if err != nil {
			return err
		}
		return s.transact(ctx, ops)
	}
	if cur != "" {
		ops, err := removePortOps(st, dev)
		if err != nil {
			return err
		}
		if err := s.transact(ctx, ops); err != nil {
			return err
		}
		if master == "" {
			return nil
		}
	}
	return s.Links.SetMaster(dev, master)
}

// PlugVIF makes the VIF's port on p.Bridge with the VIF's external_ids;
// in OVN mode its logical switch port first, else the OpenFlow rules of
// its locking after (locking_ofctl.go). The port's interface is p.Tap
// when the VM's backend made the VIF's tap (it is on the bridge already:
// the port gets the VIF's identity, and the switch's own tap for the
// VIF, if it made one, goes), or else a persistent tap the switch makes,
// named by TapName. A port on another bridge moves; an existing one gets
// p's external_ids. Without OVN and without ovs-ofctl, a VIF that must
// be locked or disabled is refused before anything is made.
func (s *Switch) PlugVIF(ctx context.Context, p network.VIFPort) error {
	own, err := TapName(p.VIF)
	if err != nil {
		return err
	}
	if s.nb != nil {
		if err := s.nb.EnsurePort(ctx, p); err != nil {
			return err
		}
	} else if p.Mode != "" && p.Mode != locking.ModeUnlocked && s.of.path == "" {
		return errNoOfctl("VIF "+p.VIF, p.Mode)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	tap, err := s.placeVIFLocked(ctx, p, own)
	if err != nil {
		return err
	}
	return s.lockLocked(ctx, p, tap)
}

// placeVIFLocked makes the VIF's port (PlugVIF) and returns the tap
// carrying it. Called with s.mu held.
func (s *Switch) placeVIFLocked(ctx context.Context, p network.VIFPort, own string) (string, error) {
	tap := own
	if p.Tap != "" && p.Tap != own {
		tap = p.Tap
		if _, err := s.Links.Get(tap); err != nil {
			return "", fmt.Errorf("ovs: the tap %s of VIF %s: %w", tap, p.VIF, err)
		}
		if err := s.dropOwnTap(ctx, own); err != nil {
			return "", err
		}
	} else {
		if _, err := s.Links.Get(tap); err != nil {
			if !errors.Is(err, network.ErrNotFound) {
				return "", err
			}
			if err := s.Links.AddTap(tap, p.MTU); err != nil {
				return "", err
			}
		}
		// Without OVN a disabled VIF's tap stays down (lockLocked).
		if p.Mode != locking.ModeDisabled || s.nb != nil {
			if err := s.Links.SetUp(tap); err != nil {
				return "", err
			}
		}
	}
	st, err := s.state()
	if err != nil {
		return "", err
	}
	b, ok := st.bridges[p.Bridge]
	if !ok {
		return "", fmt.Errorf("ovs: no Open vSwitch bridge %s for VIF %s", p.Bridge, p.VIF)
	}
	ids, portIDs := InterfaceExternalIDs(p), PortExternalIDs(p)
	if st.portBridge[tap] == p.Bridge {
		port := st.ports[tap]
		if len(port.Interfaces) == 1 && mapsEqual(st.ifaces[port.Interfaces[0]].ExternalIDs, ids) && mapsEqual(port.ExternalIDs, portIDs) {
			return tap, nil
		}
		if port.ExternalIDs[OwnerKey] == "" {
			return "", fmt.Errorf("%w: port %s of Open vSwitch bridge %s", network.ErrNotOurs, tap, p.Bridge)
		}
		return tap, s.transact(ctx, []ovsdb.Operation{
			{Op: ovsdb.OperationUpdate, Table: "Interface", Row: ovsdb.Row{"external_ids": ovsMap(ids)},
				Where: []ovsdb.Condition{{Column: "name", Function: ovsdb.ConditionEqual, Value: tap}}},
			{Op: ovsdb.OperationUpdate, Table: "Port", Row: ovsdb.Row{"external_ids": ovsMap(portIDs)},
				Where: whereUUID(port.UUID)},
		})
	}
	ops, err := placePortOps(st, b, tap, portIDs, ids)
	if err != nil {
		return "", err
	}
	return tap, s.transact(ctx, ops)
}

// dropOwnTap removes the tap the switch made for a VIF, and its port.
func (s *Switch) dropOwnTap(ctx context.Context, own string) error {
	st, err := s.state()
	if err != nil {
		return err
	}
	if st.portBridge[own] != "" {
		ops, err := removePortOps(st, own)
		if err != nil {
			return err
		}
		if err := s.transact(ctx, ops); err != nil {
			return err
		}
	}
	if _, err := s.Links.Get(own); err == nil {
		return s.Links.Delete(own)
	}
	return nil
}

// UnplugVIF removes the VIF's ports (found by the xs-vif-uuid of their
// interface, on ports of ours) and the switch's own tap for it, then its
// logical switch port in OVN mode. A backend's tap is left to the
// backend (it deletes it through the module: Delete).
func (s *Switch) UnplugVIF(ctx context.Context, vifUUID string) error {
	own, err := TapName(vifUUID)
	if err != nil {
		return err
	}
	s.mu.Lock()
	err = func() error {
		st, err := s.state()
		if err != nil {
			return err
		}
		// The VIF's rules go before its ports (a port's number may be
		// given to another port later).
		if l := s.vifs[vifUUID]; l != nil && l.bridge != "" {
			if err := s.dropFlowsLocked(ctx, l.port.Tap); err != nil {
				return err
			}
		}
		delete(s.vifs, vifUUID)
		var ops []ovsdb.Operation
		for name, port := range st.ports {
			br := st.portBridge[name]
			if br == "" || !ours(port.ExternalIDs, ownVIF) {
				continue
			}
			for _, iu := range port.Interfaces {
				if st.ifaces[iu].ExternalIDs[KeyXSVIF] == vifUUID {
					ops = append(ops, mutateSet("Bridge", st.bridges[br].UUID, "ports", ovsdb.MutateOperationDelete, port.UUID))
					break
				}
			}
		}
		if len(ops) > 0 {
			if err := s.transact(ctx, ops); err != nil {
				return err
			}
		}
		if _, err := s.Links.Get(own); err == nil {
			return s.Links.Delete(own)
		}
		return nil
	}()
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if s.nb != nil {
		return s.nb.DeletePort(ctx, vifUUID)
	}
	return nil
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

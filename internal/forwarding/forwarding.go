// Package forwarding decides where a XenAPI call runs in a pool and which
// objects it marks while it runs.
//
// # The rules
//
// Every message has a route (schema.Route), written as data in
// internal/datamodel/routes.json and generated into the message table
// (datamodel.RouteOf). The rules follow xapi's message forwarding: most
// calls run on the pool coordinator; calls about a host run on that host;
// calls about a running VM run where the VM is resident; storage calls run
// on a host that has the SR plugged; a few never leave the host that
// received them. The kinds are listed with schema.RouteKind.
//
// # Resolving
//
// Resolve turns a route into a Target for one call, reading a database
// snapshot:
//
//	t, err := forwarding.Resolve(msg, args, snap, self)
//	// t.Hosts[0] is where to run the call (all of t.Hosts for
//	// RouteSRAllPBDs); t.Marks are the current_operations entries to take.
//
// args are the call's decoded arguments without the session, in parameter
// order (as api.Call.Args holds them); self is the ref of the host doing
// the resolving. Target.Hosts is never empty.
//
// On a pool of one host (no host rows, or one) every route resolves to
// self and Resolve never fails: the marks are still worked out, so a
// single host takes the same operation locks a pool would.
//
// # What Resolve does not do
//
// It does not check that the chosen host is reachable: xapi raises
// HOST_OFFLINE or CANNOT_CONTACT_HOST when it tries to forward, and so
// should the caller. Where it has to choose among hosts (placement, SR
// access) it only considers hosts it believes live: this host, and hosts
// whose host_metrics say live. Placement checks that a host is enabled,
// sees the VM's SRs and networks and has room for its memory (see room),
// then takes the VM's affinity host or the one with the most room; HA's
// plan is the HA module's business.
// Nothing is written: taking the marks and forwarding are the caller's.
//
// # Errors
//
// In a pool, an argument naming no object gives HANDLE_INVALID [class,
// ref]; an SR without a usable PBD gives SR_HAS_NO_PBDS [sr]; no host able
// to run the call gives NO_HOSTS_AVAILABLE.
package forwarding

import (
	"slices"
	"sort"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

const nullRef = "OpaqueRef:NULL"

// Mark paths that name no argument: the pool, and the host the call is
// routed to (see schema.Mark).
const (
	poolPath   = "$pool"
	targetPath = "$target"
)

// Target is where one call runs and what it marks.
type Target struct {
	// Kind is the rule that decided: the route's kind, or the one it fell
	// back to (RouteVMResident's Else, RouteCoordinator for
	// CoordinatorIf). On a pool of one host it is the route's kind.
	Kind schema.RouteKind
	// Hosts are the host refs to run the call on, in order. One host,
	// except for RouteSRAllPBDs, which runs on each.
	Hosts []string
	// Marks are the current_operations entries the call holds while it
	// runs, in the route's order, without duplicates.
	Marks []Mark
	// Placed is the VM a RoutePlacement call starts or resumes on
	// Hosts[0] (the caller records it in scheduled_to_be_resident_on
	// while the call runs); empty otherwise.
	Placed string
}

// Host is the (first) host to run on.
func (t Target) Host() string { return t.Hosts[0] }

// Mark is one current_operations entry: object Ref of Class gets Op.
type Mark struct {
	Class *schema.Class
	Ref   string
	Op    string
}

// Resolve works out where msg runs, with its route from the generated
// message table. See the package documentation.
func Resolve(msg *schema.Message, args []any, snap db.Reader, self string) (Target, error) {
	r := dm.RouteOf(msg)
	if r == nil {
		return Target{}, xerr.New(xerr.InternalError, "no route for "+msg.Wire)
	}
	return ResolveRoute(r, msg, args, snap, self)
}

// ResolveRoute is Resolve with the route given.
func ResolveRoute(r *schema.Route, msg *schema.Message, args []any, snap db.Reader, self string) (Target, error) {
	t := Target{Kind: r.Kind}
	if snap.Count(dm.Host.Class) <= 1 {
		t.Hosts = []string{self}
		if len(r.Marks) > 0 {
			res := resolver{msg: msg, args: args, snap: snap, self: self}
			t.Marks = res.marks(r.Marks, self)
		}
		return t, nil
	}
	res := resolver{msg: msg, args: args, snap: snap, self: self}
	res.coord = res.coordinator()
	kind := r.Kind
	if r.CoordinatorIf != "" {
		if b, _ := res.arg(r.CoordinatorIf).(bool); b {
			kind = schema.RouteCoordinator
		}
	}
	t.Kind = kind
	var err error
	switch kind {
	case schema.RouteCoordinator:
		t.Hosts = []string{res.coord}
	case schema.RouteLocal:
		t.Hosts = []string{self}
	case schema.RouteHostArg, schema.RouteObjectHost:
		var h *db.Row
		if h, err = res.one(r.Targets[0]); err == nil {
			t.Hosts = []string{h.Ref}
		}
	case schema.RouteVMResident:
		t.Kind, t.Hosts, err = res.vmResident(r)
	case schema.RoutePlacement:
		t.Placed, t.Hosts, err = res.placement(r.Targets[0])
	case schema.RouteSRAccess:
		t.Hosts, err = res.srAccess(r.Targets, nil)
	case schema.RouteSRPlugged:
		t.Hosts, err = res.srPlugged(r.Targets[0])
	case schema.RouteSRAllPBDs:
		t.Hosts, err = res.srAllPBDs(r.Targets[0])
	case schema.RouteTaskForwarded:
		t.Hosts, err = res.taskForwarded(r.Targets[0])
	default:
		err = xerr.New(xerr.InternalError, "unknown route kind "+kind.String())
	}
	if err != nil {
		return Target{}, err
	}
	t.Marks = res.marks(r.Marks, t.Hosts[0])
	return t, nil
}

type resolver struct {
	msg   *schema.Message
	args  []any
	snap  db.Reader
	self  string
	coord string
}

// arg is the value passed for parameter name, or nil.
func (res *resolver) arg(name string) any {
	first := 0
	if res.msg.TakesSession {
		first = 1
	}
	for i := first; i < len(res.msg.Params); i++ {
		if res.msg.Params[i].Name == name {
			if j := i - first; j < len(res.args) {
				return res.args[j]
			}
			return nil
		}
	}
	return nil
}

func (res *resolver) param(name string) *schema.Param {
	for i := range res.msg.Params {
		if res.msg.Params[i].Name == name {
			return &res.msg.Params[i]
		}
	}
	return nil
}

// follow walks a path and returns the rows it reaches, in order, without
// duplicates. Null refs and refs to missing rows are dropped; bad is the
// first such ref met, with its class, for error messages.
func (res *resolver) follow(p schema.Path) (rows []*db.Row, bad missing) {
	prm := res.param(p.Param())
	if prm == nil {
		return nil, bad
	}
	fields := p.Fields()
	var c *schema.Class
	var refs []string
	v := res.arg(prm.Name)
	t := prm.Type
	if t.Kind == schema.KRecord && len(fields) > 0 {
		rec, _ := v.(map[string]any)
		f := t.Class.Field(fields[0])
		if f == nil {
			return nil, bad
		}
		v, t, fields = rec[f.Name], f.Type, fields[1:]
	}
	c, refs = refsOf(t, v)
	for i := 0; ; i++ {
		rows = rows[:0]
		seen := map[string]bool{}
		for _, ref := range refs {
			if seen[ref] {
				continue
			}
			seen[ref] = true
			row, ok := res.get(c, ref)
			if !ok {
				if bad.ref == "" {
					bad = missing{c, ref}
				}
				continue
			}
			rows = append(rows, row)
		}
		if i == len(fields) || c == nil {
			return rows, bad
		}
		f := c.Field(fields[i])
		if f == nil {
			return nil, bad
		}
		refs = refs[:0:0]
		var next *schema.Class
		for _, row := range rows {
			var rs []string
			next, rs = refsOf(f.Type, res.snap.Value(row, f))
			refs = append(refs, rs...)
		}
		if next == nil {
			next, _ = refsOf(f.Type, nil)
		}
		c = next
	}
}

// missing is a ref that names no row.
type missing struct {
	class *schema.Class
	ref   string
}

func (m missing) err() error {
	name := ""
	if m.class != nil {
		name = m.class.Name
	}
	return xerr.New(xerr.HandleInvalid, name, m.ref)
}

// refsOf reads a ref or ref set value; c is the class referred to.
func refsOf(t *schema.Type, v any) (c *schema.Class, refs []string) {
	switch t.Kind {
	case schema.KRef:
		c = t.Class
		if s, ok := v.(string); ok {
			refs = []string{s}
		}
	case schema.KSet:
		if t.Elem.Kind == schema.KRef {
			c = t.Elem.Class
			refs, _ = v.([]string)
		}
	}
	return c, refs
}

func (res *resolver) get(c *schema.Class, ref string) (*db.Row, bool) {
	if c == nil || ref == "" || ref == nullRef {
		return nil, false
	}
	return res.snap.Get(c, ref)
}

// one is the first row a route target reaches.
func (res *resolver) one(p schema.Path) (*db.Row, error) {
	rows, bad := res.follow(p)
	if len(rows) == 0 {
		if bad.ref == "" {
			bad.ref = nullRef
			if prm := res.param(p.Param()); prm != nil {
				bad.class, _ = refsOf(prm.Type, nil)
			}
		}
		return nil, bad.err()
	}
	return rows[0], nil
}

func (res *resolver) marks(ms []schema.Mark, target string) []Mark {
	var out []Mark
	seen := map[Mark]bool{}
	add := func(m Mark) {
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	for _, m := range ms {
		switch m.On {
		case poolPath:
			if p := res.pool(); p != nil {
				add(Mark{dm.Pool.Class, p.Ref, m.Op})
			}
			continue
		case targetPath:
			if res.validHost(target) {
				add(Mark{dm.Host.Class, target, m.Op})
			}
			continue
		}
		rows, _ := res.follow(m.On)
		for _, row := range rows {
			add(Mark{row.Class, row.Ref, m.Op})
		}
	}
	return out
}

func (res *resolver) pool() *db.Row {
	var p *db.Row
	res.snap.Ascend(dm.Pool.Class, func(r *db.Row) bool { p = r; return false })
	return p
}

// coordinator is the pool's master, or self when the database does not
// name one.
func (res *resolver) coordinator() string {
	if p := res.pool(); p != nil {
		if m := p.String(dm.Pool.Master); m != "" {
			if _, ok := res.get(dm.Host.Class, m); ok {
				return m
			}
		}
	}
	return res.self
}

// validHost reports whether ref names a host row.
func (res *resolver) validHost(ref string) bool {
	_, ok := res.get(dm.Host.Class, ref)
	return ok
}

// live reports whether a host is believed live: this host always, others
// when their host_metrics say so.
func (res *resolver) live(h *db.Row) bool {
	if h.Ref == res.self {
		return true
	}
	live, known := MetricsLive(res.snap, h)
	return live && known
}

// MetricsLive is what a host's metrics say of its liveness; known is
// false when it has none.
func MetricsLive(snap db.Reader, host *db.Row) (live, known bool) {
	m, ok := snap.Get(dm.HostMetrics.Class, host.String(dm.Host.Metrics))
	if !ok {
		return false, false
	}
	live, _ = m.Get(dm.HostMetrics.Live).(bool)
	return live, true
}

func (res *resolver) vmResident(r *schema.Route) (schema.RouteKind, []string, error) {
	vm, err := res.one(r.Targets[0])
	if err != nil {
		return 0, nil, err
	}
	if h, ok := res.residentHost(vm); ok {
		return schema.RouteVMResident, []string{h}, nil
	}
	if r.Else == schema.RouteSRAccess {
		hosts, err := res.srAccess(nil, vm)
		return schema.RouteSRAccess, hosts, err
	}
	return schema.RouteCoordinator, []string{res.coord}, nil
}

// residentHost is the host a running or paused VM's domain is on.
func (res *resolver) residentHost(vm *db.Row) (string, bool) {
	switch vm.String(dm.VM.PowerState) {
	case "Running", "Paused":
		if h := vm.String(dm.VM.ResidentOn); res.validHost(h) {
			return h, true
		}
	}
	return "", false
}

// placement chooses a host to start or resume a VM on: the host it is
// scheduled on, else among the live enabled hosts that see its SRs and
// networks and have room for its memory, its affinity host, else the one
// with the most room.
func (res *resolver) placement(p schema.Path) (string, []string, error) {
	vm, err := res.one(p)
	if err != nil {
		return "", nil, err
	}
	if h := vm.String(dm.VM.ScheduledToBeResidentOn); res.validHost(h) {
		return vm.Ref, []string{h}, nil
	}
	need, _ := vm.Get(dm.VM.MemoryStaticMax).(int64)
	nets := res.vmNetworks(vm)
	var cands []string
	room := map[string]int64{}
	for _, h := range res.seeing(res.vmSRs(vm), true) {
		free, known := res.room(h)
		if (known && free < need) || !res.onNetworks(h, nets) {
			continue
		}
		cands = append(cands, h)
		room[h] = free
	}
	if len(cands) == 0 {
		return "", nil, xerr.New(xerr.NoHostsAvailable)
	}
	if a := vm.String(dm.VM.Affinity); slices.Contains(cands, a) {
		return vm.Ref, []string{a}, nil
	}
	best := cands[:0:0]
	for _, h := range cands {
		switch {
		case len(best) == 0 || room[h] > room[best[0]]:
			best = append(best[:0], h)
		case room[h] == room[best[0]]:
			best = append(best, h)
		}
	}
	return vm.Ref, []string{res.prefer(best)}, nil
}

// room is the memory a host has for another VM: what its metrics say is
// free (the host keeps it current as domains start and stop; see
// xenops). known is false for a host without metrics.
func (res *resolver) room(host string) (free int64, known bool) {
	h, ok := res.get(dm.Host.Class, host)
	if !ok {
		return 0, false
	}
	m, ok := res.get(dm.HostMetrics.Class, h.String(dm.Host.Metrics))
	if !ok {
		return 0, false
	}
	free, _ = m.Get(dm.HostMetrics.MemoryFree).(int64)
	return free, true
}

// vmNetworks are the networks of a VM's VIFs.
func (res *resolver) vmNetworks(vm *db.Row) []string {
	var nets []string
	vifs, _ := res.snap.Value(vm, dm.VM.VIFs).([]string)
	for _, ref := range vifs {
		if vif, ok := res.get(dm.VIF.Class, ref); ok {
			if n := vif.String(dm.VIF.Network); !slices.Contains(nets, n) {
				nets = append(nets, n)
			}
		}
	}
	return nets
}

// onNetworks reports whether a host reaches every network in nets: it
// has a PIF on each, or the network has no PIF at all (a network inside
// the host, which every host can make).
func (res *resolver) onNetworks(host string, nets []string) bool {
	for _, ref := range nets {
		n, ok := res.get(dm.Network.Class, ref)
		if !ok {
			continue
		}
		pifs, _ := res.snap.Value(n, dm.Network.PIFs).([]string)
		if len(pifs) == 0 {
			continue
		}
		if !slices.ContainsFunc(pifs, func(p string) bool {
			pif, ok := res.get(dm.PIF.Class, p)
			return ok && pif.String(dm.PIF.Host) == host
		}) {
			return false
		}
	}
	return true
}

// srAccess chooses a host that can see every SR the targets name (and
// those of vm, when given).
func (res *resolver) srAccess(targets []schema.Path, vm *db.Row) ([]string, error) {
	var srs []string
	if vm != nil {
		srs = res.vmSRs(vm)
	}
	for _, p := range targets {
		rows, bad := res.follow(p)
		if len(rows) == 0 && bad.ref != "" {
			return nil, bad.err()
		}
		for _, row := range rows {
			switch row.Class {
			case dm.VM.Class:
				srs = append(srs, res.vmSRs(row)...)
			case dm.VDI.Class:
				srs = res.addSR(srs, row.String(dm.VDI.SR))
			case dm.SR.Class:
				srs = res.addSR(srs, row.Ref)
			}
		}
	}
	cands := res.seeing(srs, false)
	if len(cands) == 0 {
		return nil, xerr.New(xerr.NoHostsAvailable)
	}
	return []string{res.prefer(cands)}, nil
}

// vmSRs are the SRs of a VM's disks and its suspend image.
func (res *resolver) vmSRs(vm *db.Row) []string {
	var srs []string
	vbds, _ := res.snap.Value(vm, dm.VM.VBDs).([]string)
	vdis := []string{vm.String(dm.VM.SuspendVDI)}
	for _, ref := range vbds {
		if vbd, ok := res.get(dm.VBD.Class, ref); ok {
			vdis = append(vdis, vbd.String(dm.VBD.VDI))
		}
	}
	for _, ref := range vdis {
		if vdi, ok := res.get(dm.VDI.Class, ref); ok {
			srs = res.addSR(srs, vdi.String(dm.VDI.SR))
		}
	}
	return srs
}

// addSR adds sr to srs if it names an SR and is not there yet.
func (res *resolver) addSR(srs []string, sr string) []string {
	if _, ok := res.get(dm.SR.Class, sr); !ok || slices.Contains(srs, sr) {
		return srs
	}
	return append(srs, sr)
}

// seeing lists the live hosts with a plugged PBD for every SR in srs (and
// enabled, when enabled is set), in ref order.
func (res *resolver) seeing(srs []string, enabled bool) []string {
	var out []string
	plugged := make([][]string, len(srs))
	for i, sr := range srs {
		plugged[i] = res.pbdHosts(sr, true)
	}
	res.snap.Ascend(dm.Host.Class, func(h *db.Row) bool {
		if !res.live(h) {
			return true
		}
		if on, _ := h.Get(dm.Host.Enabled).(bool); enabled && !on {
			return true
		}
		for _, hosts := range plugged {
			if !slices.Contains(hosts, h.Ref) {
				return true
			}
		}
		out = append(out, h.Ref)
		return true
	})
	return out
}

// prefer picks the coordinator, else this host, else the first candidate.
func (res *resolver) prefer(cands []string) string {
	for _, h := range []string{res.coord, res.self} {
		if slices.Contains(cands, h) {
			return h
		}
	}
	return cands[0]
}

// pbdHosts lists the hosts with a PBD of sr (plugged ones only when
// plugged is set), in PBD ref order, the coordinator first when the SR is
// shared. Like xapi, a shared SR the coordinator has no such PBD for
// gives none.
func (res *resolver) pbdHosts(sr string, plugged bool) []string {
	row, ok := res.get(dm.SR.Class, sr)
	if !ok {
		return nil
	}
	pbds, _ := res.snap.Value(row, dm.SR.PBDs).([]string)
	pbds = slices.Clone(pbds)
	sort.Strings(pbds)
	var hosts []string
	for _, ref := range pbds {
		pbd, ok := res.get(dm.PBD.Class, ref)
		if !ok {
			continue
		}
		if on, _ := pbd.Get(dm.PBD.CurrentlyAttached).(bool); plugged && !on {
			continue
		}
		if h := pbd.String(dm.PBD.Host); res.validHost(h) && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	if shared, _ := row.Get(dm.SR.Shared).(bool); shared {
		i := slices.Index(hosts, res.coord)
		if i < 0 {
			return nil
		}
		hosts = append([]string{res.coord}, slices.Delete(hosts, i, i+1)...)
	}
	return hosts
}

func (res *resolver) srPlugged(p schema.Path) ([]string, error) {
	sr, err := res.one(p)
	if err != nil {
		return nil, err
	}
	hosts := res.pbdHosts(sr.Ref, true)
	if len(hosts) == 0 {
		return nil, xerr.New(xerr.SRHasNoPBDs, sr.Ref)
	}
	return hosts[:1], nil
}

// srAllPBDs lists every host with a PBD of the SR. With none, the call
// has only the database left to change and runs on the coordinator.
func (res *resolver) srAllPBDs(p schema.Path) ([]string, error) {
	sr, err := res.one(p)
	if err != nil {
		return nil, err
	}
	hosts := res.pbdHosts(sr.Ref, false)
	if len(hosts) == 0 {
		return []string{res.coord}, nil
	}
	return hosts, nil
}

// taskForwarded is the host a task was forwarded to. The datamodel has no
// forwarded_to field unless the overlay adds one; xapi sets resident_on
// to the same host when it forwards, so that is read otherwise.
func (res *resolver) taskForwarded(p schema.Path) ([]string, error) {
	task, err := res.one(p)
	if err != nil {
		return nil, err
	}
	for _, name := range []string{"forwarded_to", "resident_on"} {
		if f := task.Class.Field(name); f != nil {
			if h := task.String(f); res.validHost(h) {
				return []string{h}, nil
			}
		}
	}
	return []string{res.coord}, nil
}

package schema

import (
	"fmt"
	"strings"
)

// RouteKind says on which host of a pool a call runs. Every message has
// one (see Route); the rules follow xapi's message forwarding.
type RouteKind uint8

// The route kinds.
const (
	// RouteCoordinator runs the call on the pool coordinator. It is the
	// rule for every message nothing else is said about: the implicit
	// getters, setters, constructors and destructors, and calls that only
	// touch the database.
	RouteCoordinator RouteKind = iota
	// RouteLocal runs the call on whichever host received it, never
	// forwarding: sessions, events, emergency calls and the HA calls a
	// member must answer for itself.
	RouteLocal
	// RouteHostArg runs the call on the host a parameter names
	// (host.reboot(host), SR.create(host, ...)).
	RouteHostArg
	// RouteObjectHost runs the call on the host an object belongs to,
	// reached from a parameter through ref fields (PBD.plug: self.host).
	RouteObjectHost
	// RouteVMResident runs the call on the host a VM is resident on when
	// the VM is Running or Paused, and otherwise where Else says
	// (the coordinator, or a host that can see the VM's SRs).
	RouteVMResident
	// RoutePlacement runs the call on a host chosen for a VM that is not
	// running: its reservation (scheduled_to_be_resident_on) if it has
	// one, otherwise an enabled, live host that can see all of the VM's
	// SRs (VM.start, VM.resume).
	RoutePlacement
	// RouteSRAccess runs the call on a host that can see every SR the
	// targets name: for a VM, the SRs of its disks (VM.clone, VDI.copy).
	RouteSRAccess
	// RouteSRPlugged runs the call on a host with a plugged PBD of an SR,
	// the coordinator's first when the SR is shared (SR.scan, VDI ops).
	RouteSRPlugged
	// RouteSRAllPBDs runs the call on every host with a PBD of the SR,
	// plugged or not, the coordinator first when the SR is shared
	// (SR.destroy, SR.forget).
	RouteSRAllPBDs
	// RouteTaskForwarded runs the call on the host a task was forwarded
	// to, or on the coordinator when it was not forwarded (task.cancel).
	RouteTaskForwarded
	numRouteKinds
)

var routeKindNames = [numRouteKinds]string{"coordinator", "local", "host_arg", "object_host",
	"vm_resident", "placement", "sr_access", "sr_plugged", "sr_all_pbds", "task_forwarded"}

func (k RouteKind) String() string {
	if k < numRouteKinds {
		return routeKindNames[k]
	}
	return fmt.Sprintf("RouteKind(%d)", k)
}

// ParseRouteKind reads a kind's name as routes.json spells it.
func ParseRouteKind(s string) (RouteKind, bool) {
	for i, n := range routeKindNames {
		if n == s {
			return RouteKind(i), true
		}
	}
	return 0, false
}

// RouteKinds lists every kind in order.
func RouteKinds() []RouteKind {
	out := make([]RouteKind, numRouteKinds)
	for i := range out {
		out[i] = RouteKind(i)
	}
	return out
}

// Path names objects starting from a call's arguments: a parameter name,
// then field names followed one after another, each a ref or a set of
// refs ("self.VM", "vm.VBDs.VDI.SR"). A set fans out, so a path can name
// several objects; null refs are dropped along the way.
type Path string

// Param is the parameter the path starts from.
func (p Path) Param() string { s, _, _ := strings.Cut(string(p), "."); return s }

// Fields are the fields followed after the parameter.
func (p Path) Fields() []string {
	_, rest, ok := strings.Cut(string(p), ".")
	if !ok {
		return nil
	}
	return strings.Split(rest, ".")
}

// Mark is an entry a call adds to an object's current_operations while it
// runs: the objects On names get Op, keyed by the call's task. Besides
// paths from arguments, On may be "$pool" (the pool object) or "$target"
// (the host the call is routed to).
type Mark struct {
	On Path
	Op string
}

// Route is where a message runs in a pool and which objects it marks.
type Route struct {
	Kind RouteKind
	// Targets are the paths the kind reads: the host parameter
	// (RouteHostArg), the path to a host (RouteObjectHost), to a VM
	// (RouteVMResident, RoutePlacement), to SRs, VDIs or VMs whose SRs
	// must be visible (RouteSRAccess), to an SR (RouteSRPlugged,
	// RouteSRAllPBDs) or to a task (RouteTaskForwarded). Empty for
	// RouteCoordinator and RouteLocal.
	Targets []Path
	// Else is where a RouteVMResident call goes when the VM is neither
	// Running nor Paused: RouteCoordinator or RouteSRAccess (the VM's
	// SRs).
	Else RouteKind
	// CoordinatorIf names a bool parameter: when the call passes true the
	// call runs on the coordinator instead (SR.create with shared=true).
	CoordinatorIf string
	// Marks are the current_operations entries the call holds.
	Marks []Mark
}

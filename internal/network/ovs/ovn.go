package ovs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ovn-kubernetes/libovsdb/client"
	"github.com/ovn-kubernetes/libovsdb/ovsdb"

	"toolstackd/internal/network"
)

// OVN mode: every VIF plugged on this host has a logical switch port in
// OVN's northbound database, named by the VIF's uuid (the iface-id the
// VIF's Interface carries, by which ovn-controller binds it), on a
// logical switch per network named by the network's uuid (made when the
// first VIF of the network is plugged anywhere in the pool, and left for
// the others; toolstackd never removes a logical switch). The port's
// addresses are the VIF's MAC and allowed addresses, its port security
// and enabled state follow the VIF's locking mode (LSPPortSecurity,
// LSPEnabled).

// Northbound is a connection to OVN's northbound database.
type Northbound struct {
	c       client.Client
	timeout time.Duration
	mu      sync.Mutex
}

// OpenNorthbound connects to the northbound database at endpoint
// ("unix:/path" or "tcp:host:port").
func OpenNorthbound(ctx context.Context, endpoint string, timeout time.Duration) (*Northbound, error) {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	if why := missingNB(endpoint); why != "" {
		return nil, errors.New("ovs: " + why)
	}
	dbm, err := nbModel()
	if err != nil {
		return nil, fmt.Errorf("ovs: %w", err)
	}
	c, err := connect(ctx, dbm, nbTables, endpoint, timeout)
	if err != nil {
		return nil, fmt.Errorf("ovs: OVN northbound database %s: %w (is ovn-northd's database running? Debian package ovn-central)", endpoint, err)
	}
	return &Northbound{c: c, timeout: timeout}, nil
}

func missingNB(endpoint string) string {
	if m := Missing(endpoint); m != "" {
		return "OVN mode (--ovn-nb): no northbound database: " + m + " (the northbound database comes with Debian's ovn-central package)"
	}
	return ""
}

// Close disconnects.
func (n *Northbound) Close() { n.c.Close() }

func (n *Northbound) lsps() []logicalSwitchPort {
	var out []logicalSwitchPort
	_ = n.c.List(context.Background(), &out)
	return out
}

func (n *Northbound) switches() []logicalSwitch {
	var out []logicalSwitch
	_ = n.c.List(context.Background(), &out)
	return out
}

// port is the logical switch port named name and the switch holding it.
func (n *Northbound) port(name string) (lsp logicalSwitchPort, ls logicalSwitch, ok bool) {
	for _, p := range n.lsps() {
		if p.Name == name {
			lsp, ok = p, true
			break
		}
	}
	if !ok {
		return lsp, ls, false
	}
	for _, s := range n.switches() {
		for _, u := range s.Ports {
			if u == lsp.UUID {
				return lsp, s, true
			}
		}
	}
	return lsp, ls, true
}

func (n *Northbound) switchNamed(name string) (logicalSwitch, bool) {
	for _, s := range n.switches() {
		if s.Name == name {
			return s, true
		}
	}
	return logicalSwitch{}, false
}

// waitCache waits until the cache satisfies cond (the monitor's update
// for a transaction may follow its reply).
func (n *Northbound) waitCache(ctx context.Context, cond func() bool) error {
	deadline := time.Now().Add(n.timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("ovs: the OVN northbound database did not show the change in time")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

func (n *Northbound) transact(ctx context.Context, ops []ovsdb.Operation) error {
	tctx, cancel := context.WithTimeout(ctx, n.timeout)
	defer cancel()
	res, err := n.c.Transact(tctx, ops...)
	if err != nil {
		return fmt.Errorf("ovs: OVN northbound transaction: %w", err)
	}
	if errs, err := ovsdb.CheckOperationResults(res, ops); err != nil {
		return fmt.Errorf("ovs: OVN northbound transaction: %w %v", err, errs)
	}
	return nil
}

func whereUUID(u string) []ovsdb.Condition {
	return []ovsdb.Condition{{Column: "_uuid", Function: ovsdb.ConditionEqual, Value: ovsdb.UUID{GoUUID: u}}}
}

// lspRow is the columns of a VIF's logical switch port.
func lspRow(p network.VIFPort) ovsdb.Row {
	set := func(ss []string) ovsdb.OvsSet {
		out := make([]any, len(ss))
		for i, s := range ss {
			out[i] = s
		}
		return ovsdb.OvsSet{GoSet: out}
	}
	return ovsdb.Row{
		"addresses": set(LSPAddresses(p)), "port_security": set(LSPPortSecurity(p)),
		"enabled":      ovsdb.OvsSet{GoSet: []any{LSPEnabled(p)}},
		"external_ids": ovsMap(map[string]string{OwnerKey: ownVIF, KeyVMID: p.VM, KeyXSNetwork: p.Network}),
	}
}

// EnsurePort makes the VIF's logical switch port on its network's
// logical switch (made if missing), or brings an existing one of ours up
// to date (moved, when the VIF moved to another network).
func (n *Northbound) EnsurePort(ctx context.Context, p network.VIFPort) error {
	if p.Network == "" || p.VIF == "" {
		return errors.New("ovs: OVN: a VIF port needs the VIF's and the network's uuids")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	lsp, cur, exists := n.port(p.VIF)
	if exists && !ours(lsp.ExternalIDs, ownVIF) {
		return fmt.Errorf("%w: OVN logical switch port %s", network.ErrNotOurs, p.VIF)
	}
	var ops []ovsdb.Operation
	target := "newswitch"
	if ls, ok := n.switchNamed(p.Network); ok {
		target = ls.UUID
	} else {
		// Made only if still missing when the transaction runs (another
		// host of the pool may be making it now): the wait fails the
		// transaction if a switch of that name appeared.
		zero := 0
		ops = append(ops,
			ovsdb.Operation{Op: ovsdb.OperationWait, Table: "Logical_Switch", Timeout: &zero,
				Where:   []ovsdb.Condition{{Column: "name", Function: ovsdb.ConditionEqual, Value: p.Network}},
				Columns: []string{"name"}, Until: "!=", Rows: []ovsdb.Row{{"name": p.Network}}},
			ovsdb.Operation{Op: ovsdb.OperationInsert, Table: "Logical_Switch", UUIDName: target,
				Row: ovsdb.Row{"name": p.Network, "external_ids": ovsMap(map[string]string{OwnerKey: ownSwitch})}})
	}
	row := lspRow(p)
	switch {
	case !exists:
		row["name"] = p.VIF
		ops = append(ops, ovsdb.Operation{Op: ovsdb.OperationInsert, Table: "Logical_Switch_Port", Row: row, UUIDName: "newport"},
			mutateSet("Logical_Switch", target, "ports", ovsdb.MutateOperationInsert, "newport"))
	default:
		if cur.UUID == target && sameStrings(lsp.Addresses, LSPAddresses(p)) && sameStrings(lsp.PortSecurity, LSPPortSecurity(p)) &&
			(lsp.Enabled == nil || *lsp.Enabled) == LSPEnabled(p) && mapsEqual(lsp.ExternalIDs, mapOf(row["external_ids"])) {
			return nil
		}
		ops = append(ops, ovsdb.Operation{Op: ovsdb.OperationUpdate, Table: "Logical_Switch_Port", Where: whereUUID(lsp.UUID), Row: row})
		if cur.UUID != target {
			if cur.UUID != "" {
				ops = append(ops, mutateSet("Logical_Switch", cur.UUID, "ports", ovsdb.MutateOperationDelete, lsp.UUID))
			}
			ops = append(ops, mutateSet("Logical_Switch", target, "ports", ovsdb.MutateOperationInsert, lsp.UUID))
		}
	}
	if err := n.transact(ctx, ops); err != nil {
		return err
	}
	want := LSPAddresses(p)
	return n.waitCache(ctx, func() bool {
		l, s, ok := n.port(p.VIF)
		return ok && s.Name == p.Network && sameStrings(l.Addresses, want)
	})
}

func mapOf(v any) map[string]string {
	out := map[string]string{}
	if m, ok := v.(ovsdb.OvsMap); ok {
		for k, x := range m.GoMap {
			out[fmt.Sprint(k)] = fmt.Sprint(x)
		}
	}
	return out
}

// DeletePort removes the VIF's logical switch port, if it is there and
// ours.
func (n *Northbound) DeletePort(ctx context.Context, vifUUID string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	lsp, ls, ok := n.port(vifUUID)
	if !ok {
		return nil
	}
	if !ours(lsp.ExternalIDs, ownVIF) {
		return fmt.Errorf("%w: OVN logical switch port %s", network.ErrNotOurs, vifUUID)
	}
	ops := []ovsdb.Operation{{Op: ovsdb.OperationDelete, Table: "Logical_Switch_Port", Where: whereUUID(lsp.UUID)}}
	if ls.UUID != "" {
		ops = append([]ovsdb.Operation{mutateSet("Logical_Switch", ls.UUID, "ports", ovsdb.MutateOperationDelete, lsp.UUID)}, ops...)
	}
	if err := n.transact(ctx, ops); err != nil {
		return err
	}
	return n.waitCache(ctx, func() bool { _, _, ok := n.port(vifUUID); return !ok })
}

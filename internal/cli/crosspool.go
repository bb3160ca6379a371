package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// xe vm-migrate remote-master=<address> remote-username= remote-password=
// [host=<remote host>] [remote-network=] vdi:<vdi-uuid>=<remote sr-uuid>
// vif:<vif-uuid>=<remote network-uuid>: a migration to another pool, as
// xapi's xe does it. The command logs in to the other pool's coordinator,
// finds the host (by hostname, name or uuid; the first host without
// host=) and the network to receive on (remote-network=, else the host's
// management network), asks host.migrate_receive there and calls
// VM.migrate_send here with that dest map. Disks not named in vdi: go to
// the other pool's preferred SR as xapi's xe picks it (a shared SR the
// host has plugged, else a local one, the most free space first); VIFs
// not named in vif: go to the receiving network. remote-master is
// address[:port] or a URL (http unless it says https); without a port,
// 80.

// remoteTimeout bounds one call to the other pool.
const remoteTimeout = 30 * time.Second

// remoteXE is the other pool, logged in.
type remoteXE struct {
	ctx     context.Context
	u       *url.URL
	hc      *http.Client
	session string
}

func (r *remoteXE) call(method string, params ...any) (json.RawMessage, error) {
	if r.session != "" {
		params = append([]any{r.session}, params...)
	}
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(r.ctx, remoteTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.hc.Do(req)
	if err != nil {
		return nil, failf("Cannot contact the remote pool at %s: %v", r.u.Host, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, failf("Cannot read the remote pool's answer: %v", err)
	}
	var reply struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Message string   `json:"message"`
			Data    []string `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &reply); err != nil {
		return nil, failf("The remote pool at %s did not answer in JSON-RPC", r.u.Host)
	}
	if reply.Error != nil {
		return nil, xerr.New(reply.Error.Message, reply.Error.Data...)
	}
	return reply.Result, nil
}

func (r *remoteXE) str(method string, params ...any) (string, error) {
	raw, err := r.call(method, params...)
	if err != nil {
		return "", err
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", failf("Unexpected answer from the remote pool to %s", method)
	}
	return s, nil
}

func (r *remoteXE) records(class string) (map[string]map[string]any, error) {
	raw, err := r.call(class + ".get_all_records")
	if err != nil {
		return nil, err
	}
	var out map[string]map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, failf("Unexpected answer from the remote pool to %s.get_all_records", class)
	}
	return out, nil
}

// remoteURL reads remote-master.
func remoteURL(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return nil, failf("remote-master: not an address: %s", s)
	}
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		u.Host = net.JoinHostPort(u.Hostname(), port)
	}
	u.Path, u.RawQuery = "/jsonrpc", ""
	return u, nil
}

// pick is the first ref (in ref order) whose record matches one of the
// fields with want.
func pick(recs map[string]map[string]any, want string, fields ...string) string {
	refs := make([]string, 0, len(recs))
	for ref := range recs {
		refs = append(refs, ref)
	}
	slices.Sort(refs)
	for _, ref := range refs {
		for _, f := range fields {
			if v, _ := recs[ref][f].(string); v == want {
				return ref
			}
		}
	}
	return ""
}

// migrateToPool is vm-migrate with remote-master=.
func (c *Ctx) migrateToPool() error {
	master, _ := c.param("remote-master")
	user, okU := c.param("remote-username")
	pw, okP := c.param("remote-password")
	if !okU || !okP {
		return failf("Storage live migration requires remote-master, remote-username, and remote-password to be specified. Please see 'xe help vm-migrate' for help.")
	}
	u, err := remoteURL(master)
	if err != nil {
		return err
	}
	options, err := c.migrateOptions()
	if err != nil {
		return err
	}
	c.out.msg("Performing a storage live migration. Your VM's VDIs will be migrated with the VM.")
	r := c.newRemoteXE(u)
	defer r.hc.CloseIdleConnections()
	s, err := r.str("session.login_with_password", user, pw, "1.3", "xe")
	if err != nil {
		return err
	}
	r.session = s
	defer func() {
		bg := *r
		bg.ctx = context.WithoutCancel(c.ctx)
		_, _ = bg.call("session.logout")
	}()
	hosts, err := r.records("host")
	if err != nil {
		return err
	}
	host, err := c.remoteHost(hosts)
	if err != nil {
		return err
	}
	network, err := c.remoteNetwork(r, hosts, host)
	if err != nil {
		return err
	}
	vifMap, err := c.remoteMap(r, "vif", dm.VIF.Class, "network.get_by_uuid")
	if err != nil {
		return err
	}
	vdiMap, err := c.remoteMap(r, "vdi", dm.VDI.Class, "SR.get_by_uuid")
	if err != nil {
		return err
	}
	preferred := r.preferredSR(host)
	raw, err := r.call("host.migrate_receive", host, network, map[string]string{})
	if err != nil {
		return err
	}
	var dest map[string]string
	if err := json.Unmarshal(raw, &dest); err != nil {
		return failf("Unexpected answer from the remote pool to host.migrate_receive")
	}
	return c.eachSelected(vmSelector, selectOpts{controlDomains: true}, true, func(vm *db.Row, _ formatter) error {
		vdis, vifs := c.sendMaps(vm, vdiMap, vifMap, preferred, network)
		_, err := c.call("VM.migrate_send", vm.Ref, dest, true, vdis, vifs, options, map[string]string{}, map[string]string{})
		return err
	})
}

// newRemoteXE is the other pool at u, not logged in yet.
func (c *Ctx) newRemoteXE(u *url.URL) *remoteXE {
	d := &net.Dialer{Timeout: 10 * time.Second}
	var tlsConfig *tls.Config
	if c.s.opts.ClientTLS != nil {
		tlsConfig = c.s.opts.ClientTLS()
	}
	return &remoteXE{ctx: c.ctx, u: u, hc: &http.Client{Timeout: remoteTimeout,
		Transport: &http.Transport{DialContext: d.DialContext, TLSHandshakeTimeout: 10 * time.Second, MaxIdleConnsPerHost: 2,
			TLSClientConfig: tlsConfig}}}
}

// remoteHost is the other pool's host (of hosts) to receive the VMs: the
// one host= names, by hostname, name or uuid, else the first.
func (c *Ctx) remoteHost(hosts map[string]map[string]any) (string, error) {
	host := ""
	if h, ok := c.param("host"); ok {
		if host = pick(hosts, h, "hostname", "name_label", "uuid"); host == "" {
			return "", failf("Failed to find host: %s", h)
		}
		return host, nil
	}
	for ref := range hosts {
		if host == "" || ref < host {
			host = ref
		}
	}
	if host == "" {
		return "", failf("Failed to find a suitable host")
	}
	return host, nil
}

// remoteNetwork is the other pool's network to receive on: the one
// remote-network= names, by bridge, name or uuid, else the management
// network of host (hosts the other pool's).
func (c *Ctx) remoteNetwork(r *remoteXE, hosts map[string]map[string]any, host string) (string, error) {
	network := ""
	if n, ok := c.param("remote-network"); ok {
		nets, err := r.records("network")
		if err != nil {
			return "", err
		}
		if network = pick(nets, n, "bridge", "name_label", "uuid"); network == "" {
			return "", failf("Failed to find network: %s", n)
		}
		return network, nil
	}
	pifs, err := r.records("PIF")
	if err != nil {
		return "", err
	}
	for _, p := range pifs {
		if p["host"] == host && p["management"] == true {
			network, _ = p["network"].(string)
		}
	}
	if network == "" {
		uuid, _ := hosts[host]["uuid"].(string)
		return "", failf("Could not find management PIF on host %s", uuid)
	}
	return network, nil
}

// remoteMap reads the map parameter prefix:<uuid>=<remote uuid> as refs:
// the object of class cls here to the other pool's object that
// getByUUID finds there.
func (c *Ctx) remoteMap(r *remoteXE, prefix string, cls *schema.Class, getByUUID string) (map[string]string, error) {
	refs := map[string]string{}
	for local, remote := range c.mapParams(prefix) {
		lref, err := c.objectRef(cls, local)
		if err != nil {
			return nil, err
		}
		rref, err := r.str(getByUUID, remote)
		if err != nil {
			return nil, err
		}
		refs[lref] = rref
	}
	return refs, nil
}

// sendMaps are VM.migrate_send's VDI and VIF maps for vm: vdiMap and
// vifMap, with the disks they do not name going to the preferred SR
// (when there is one) and the VIFs to network.
func (c *Ctx) sendMaps(vm *db.Row, vdiMap, vifMap map[string]string, preferred, network string) (vdis, vifs map[string]string) {
	snap := c.s.api.DB.Snapshot()
	vdis, vifs = maps.Clone(vdiMap), maps.Clone(vifMap)
	vbds, _ := snap.Value(vm, dm.VM.VBDs).([]string)
	for _, vbd := range vbds {
		row, ok := snap.Get(dm.VBD.Class, vbd)
		if !ok || row.Get(dm.VBD.Empty) == true {
			continue
		}
		if _, named := vdis[row.String(dm.VBD.VDI)]; !named && preferred != "" {
			vdis[row.String(dm.VBD.VDI)] = preferred
		}
	}
	vifRefs, _ := snap.Value(vm, dm.VM.VIFs).([]string)
	for _, vif := range vifRefs {
		if _, named := vifs[vif]; !named {
			vifs[vif] = network
		}
	}
	return vdis, vifs
}

// preferredSR is where xapi's xe sends disks vdi: does not name: of the
// SRs plugged on host that are not ISO libraries, a shared one if any,
// the most free space first; "" when it cannot tell.
func (r *remoteXE) preferredSR(host string) string {
	pbds, err := r.records("PBD")
	if err != nil {
		return ""
	}
	srs, err := r.records("SR")
	if err != nil {
		return ""
	}
	num := func(v any) int64 {
		s, _ := v.(string)
		n, _ := strconv.ParseInt(s, 10, 64)
		if f, ok := v.(float64); ok {
			n = int64(f)
		}
		return n
	}
	best, bestShared, bestFree := "", false, int64(-1)
	for _, p := range pbds {
		if p["host"] != host || p["currently_attached"] != true {
			continue
		}
		ref, _ := p["SR"].(string)
		sr, ok := srs[ref]
		if !ok || sr["content_type"] == "iso" {
			continue
		}
		shared := sr["shared"] == true
		free := num(sr["physical_size"]) - num(sr["physical_utilisation"])
		if best == "" || (shared && !bestShared) || (shared == bestShared && free > bestFree) {
			best, bestShared, bestFree = ref, shared, free
		}
	}
	return best
}

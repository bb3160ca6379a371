package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"toolstackd/internal/atomicfile"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/network"
	"toolstackd/internal/network/nsrun"
	"toolstackd/internal/pool"
	"toolstackd/internal/xerr"
)

// The management interface's sockets (host.management_reconfigure and
// siblings, internal/network/management.go): the API's TCP listeners
// (--listen, --listen-https, or systemd's) move to the address of the new
// management PIF. A listener on a specific address gets a sibling on the
// new address with the same port, both serve until the database says
// where management is, then the old one stops taking connections and
// closes once its calls are answered (the one that asked for the move
// included); a wildcard listener needs no change. The host's intra-pool
// address becomes the new address with its pool port (pool.Readdress).
// management_disable stops every TCP listener; the local socket stays.
//
// A move is remembered in DATA_DIR/management-address (as xapi keeps
// its management interface in the inventory): after a restart the daemon
// serves on its configured listeners as always and, once the network
// module has put the host's addresses back, on the remembered address
// too, which stays the host's intra-pool address and host.address.
// management_disable forgets it (and is itself not remembered: a
// restarted daemon serves on its configured listeners).
//
// With --network-namespace (the tests' simulated hosts) the PIFs'
// addresses live in that namespace, so the new listener is opened there,
// and the pool's connections to a peer at an address other than a
// loopback one are made from there too.

// apiListener is one TCP listener serving the API.
type apiListener struct {
	srv     *http.Server
	addr    net.Addr
	handler http.Handler
	tls     *tls.Config // nil: plain HTTP
}

// serveAPI serves the API on a TCP listener the management interface may
// move.
func (ls *listeners) serveAPI(l net.Listener, h http.Handler, tlsCfg *tls.Config) *apiListener {
	addr := l.Addr()
	if tlsCfg != nil {
		ls.serve(l, h, tlsCfg)
	} else {
		ls.serve(l, h)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	a := &apiListener{srv: ls.servers[len(ls.servers)-1], addr: addr, handler: h, tls: tlsCfg}
	ls.api = append(ls.api, a)
	return a
}

// apiListeners are the API's TCP listeners now.
func (ls *listeners) apiListeners() []*apiListener {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return slices.Clone(ls.api)
}

// retireGrace is how long a listener that management left keeps its
// calls in progress before its connections are closed.
const retireGrace = 10 * time.Second

// retire stops a listener taking connections and closes it once its
// calls are answered (at most retireGrace later), in the background so
// that the call that retired it can answer.
func (ls *listeners) retire(a *apiListener) {
	ls.mu.Lock()
	ls.api = slices.DeleteFunc(ls.api, func(x *apiListener) bool { return x == a })
	ls.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), retireGrace)
		defer cancel()
		if err := a.srv.Shutdown(ctx); err != nil {
			_ = a.srv.Close()
		}
		ls.log.Info("no longer serving XenAPI", "addr", a.addr.String())
	}()
}

// management is the daemon's network.Management.
type management struct {
	o   options
	log *slog.Logger

	mu sync.Mutex
	ls *listeners
	// pool is the current host's pool layer (the host is rebuilt in
	// place by pool.eject).
	pool func() *pool.Pool
	// off are the listeners management_disable stopped, for
	// management_reconfigure to bring back at the new address.
	off []*apiListener
}

var _ network.Management = (*management)(nil)

func (mg *management) attach(ls *listeners, current func() *pool.Pool) {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	mg.ls, mg.pool = ls, current
}

func (mg *management) currentPool() *pool.Pool {
	if mg.pool == nil {
		return nil
	}
	return mg.pool()
}

// MoveTo implements network.Management.
func (mg *management) MoveTo(ctx context.Context, ip string, alone bool) (done, undo func(), err error) {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	nip := net.ParseIP(ip)
	if mg.ls == nil || nip == nil {
		return nil, nil, xerr.New(xerr.InternalError, "the management interface cannot move to "+ip+" now")
	}
	ls := mg.ls
	disabled := len(mg.off) > 0
	from := ls.apiListeners()
	if disabled {
		from = mg.off
	}
	var added, replaced []*apiListener
	opened := map[string]bool{} // two old listeners on one port get one new one
	fail := func(err error) (func(), func(), error) {
		for _, a := range added {
			ls.retire(a)
		}
		return nil, nil, err
	}
	for _, l := range from {
		host, port, err := net.SplitHostPort(l.addr.String())
		if err != nil {
			continue
		}
		at := net.JoinHostPort(ip, port)
		open := mg.listenOn
		if hip := net.ParseIP(host); hip == nil || hip.IsUnspecified() {
			if !disabled {
				continue // every address, the new one included
			}
			at, open = l.addr.String(), listenHere
		} else if hip.Equal(nip) && !disabled {
			continue
		}
		if opened[at] {
			replaced = append(replaced, l)
			continue
		}
		nl, err := open(at)
		if err != nil {
			return fail(xerr.New(xerr.InternalError, fmt.Sprintf("the API cannot listen on %s: %v", at, err)))
		}
		opened[at] = true
		added = append(added, ls.serveAPI(nl, l.handler, l.tls))
		replaced = append(replaced, l)
		mg.log.Info("serving XenAPI on the new management address", "addr", nl.Addr().String())
	}
	p := mg.currentPool()
	oldAdv := ""
	if p != nil {
		oldAdv = p.Advertised()
		_, port, err := net.SplitHostPort(oldAdv)
		if err == nil {
			if err := p.Readdress(ctx, net.JoinHostPort(ip, port)); err != nil {
				if !alone {
					return fail(err)
				}
				mg.log.Warn("the pool could not be told this host's new address", "address", ip, "err", err)
			}
		}
	}
	done = func() {
		mg.mu.Lock()
		defer mg.mu.Unlock()
		mg.remember(ip)
		if disabled {
			mg.off = nil
			return
		}
		for _, r := range replaced {
			ls.retire(r)
		}
	}
	undo = func() {
		if p != nil && oldAdv != "" {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := p.Readdress(ctx, oldAdv); err != nil {
				mg.log.Warn("putting back this host's intra-pool address", "address", oldAdv, "err", err)
			}
		}
		for _, a := range added {
			ls.retire(a)
		}
	}
	return done, undo, nil
}

// Disable implements network.Management.
func (mg *management) Disable(context.Context) error {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	if mg.ls == nil {
		return xerr.New(xerr.InternalError, "the API is not serving yet")
	}
	for _, a := range mg.ls.apiListeners() {
		mg.off = append(mg.off, a)
		mg.ls.retire(a)
	}
	mg.remember("")
	return nil
}

// addressFile remembers where management_reconfigure moved the API.
const addressFile = "management-address"

// remember writes (or, for "", removes) the management address file.
func (mg *management) remember(ip string) {
	path := filepath.Join(mg.o.dataDir, addressFile)
	var err error
	if ip == "" {
		err = os.Remove(path)
		if errors.Is(err, fs.ErrNotExist) {
			err = nil
		}
	} else {
		err = atomicfile.WriteFile(path, []byte(ip+"\n"), 0o600) // ip parsed by MoveTo
	}
	if err != nil {
		mg.log.Warn("cannot remember the management address", "err", err)
	}
}

// resumeTimeout bounds the move back to the remembered address at start
// (a member waits for its coordinator).
const resumeTimeout = time.Minute

// resume serves the API at the remembered management address again, in
// the background, keeping the configured listeners, and makes it
// host.address on a host that is not a member (start-up reset it to the
// configured one; a member's record is the pool's, unchanged).
func (mg *management) resume(h *host) {
	b, err := os.ReadFile(filepath.Join(mg.o.dataDir, addressFile)) //nolint:gosec // the operator's data dir and a fixed name
	if err != nil {
		return
	}
	ip := strings.TrimSpace(string(b))
	if net.ParseIP(ip) == nil {
		mg.log.Warn("ignoring a management address file that holds no address", "file", addressFile)
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), resumeTimeout)
		defer cancel()
		// The pool has this address already (it is remembered only once
		// the pool took it): telling it again is a courtesy, and a pool
		// that cannot be told now (its coordinator moving at that very
		// moment) must not cost the host its listener there.
		if _, _, err := mg.MoveTo(ctx, ip, true); err != nil {
			mg.log.Warn("could not serve on the remembered management address", "address", ip, "err", err)
			return
		}
		if h.pool != nil && h.pool.Member() {
			return
		}
		if _, err := h.db.Update(func(tx *db.Tx) error {
			if row, ok := tx.Get(dm.Host.Class, h.srv.Cfg.HostRef); ok && row.String(dm.Host.Address) != ip {
				return tx.Set(dm.Host.Address, h.srv.Cfg.HostRef, ip)
			}
			return nil
		}); err != nil {
			mg.log.Warn("could not record the remembered management address", "address", ip, "err", err)
		}
	}()
}

// Member implements network.Management.
func (mg *management) Member() bool {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	p := mg.currentPool()
	return p != nil && p.Member()
}

// CutOff implements network.Management.
func (mg *management) CutOff() bool {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	p := mg.currentPool()
	return p != nil && p.CutOff()
}

// listenOn listens on addr where the host's PIFs are: the network
// namespace when one is set.
func (mg *management) listenOn(addr string) (net.Listener, error) {
	var l net.Listener
	err := nsrun.Run(mg.o.networkNamespace, func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

func listenHere(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

// poolDial is the pool's dialer when the host's PIFs live in a network
// namespace: a peer at a loopback address is reached from the daemon's
// own namespace (bound to the --listen address, as hosts sharing
// 127.0.0.N do), any other from the network namespace. Without one, nil:
// the pool's own dialer.
func (o options) poolDial() func(ctx context.Context, network, addr string) (net.Conn, error) {
	if o.networkNamespace == "" {
		return nil
	}
	ns, local := o.networkNamespace, o.localIP()
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: 10 * time.Second}
		host, _, err := net.SplitHostPort(addr)
		if ip := net.ParseIP(host); err != nil || ip == nil || ip.IsLoopback() {
			if local != nil {
				d.LocalAddr = &net.TCPAddr{IP: local}
			}
			return d.DialContext(ctx, network, addr)
		}
		var c net.Conn
		err = nsrun.Run(ns, func() (err error) {
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

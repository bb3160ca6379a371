// Command toolstackd is the XenAPI daemon: one per host.
package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/spf13/cobra"

	"toolstackd/internal/api"
	"toolstackd/internal/certs"
	"toolstackd/internal/gctune"
	"toolstackd/internal/netguard"
	"toolstackd/internal/pool"
	"toolstackd/internal/storage"
	"toolstackd/internal/version"
	"toolstackd/internal/xenops/qemu"
)

type options struct {
	qemu        qemu.Config // the QEMU backend's settings from flags
	dataDir     string
	listen      string
	advertise   string
	witness     bool
	listenHTTPS string
	// httpsOnly refuses every request on the plain listeners (--https-only).
	httpsOnly bool
	// networkBackend and networkNamespace: the network module (network.go).
	networkBackend, networkNamespace string
	// ovsDB, ovsDatapath and ovnNB: the openvswitch backend (network_ovs.go).
	ovsDB, ovsDatapath, ovnNB string
	// settings are the effective values of every setting, for bug reports.
	settings map[string]string
	// certStore is the host's certificates (certs.go), opened by run.
	certStore   *certs.Store
	socket      string
	backend     string
	hostMemory  memSize
	haTiming    string
	watchdog    string
	journal     string
	logLevel    string
	logTarget   logTarget
	redoLog     string
	debugListen string
	// gcHeapFloor is the heap a small host may grow to between garbage
	// collections (internal/gctune); 0: Go's default collector pacing.
	gcHeapFloor memSize
	metricsOpen bool
	// metricsPlugins is the directory of rrdd plugin files (--metrics-plugin-dir).
	metricsPlugins string
	conns          netguard.Config
	// guard is the listeners' connection guard, set by run (its counters
	// are on /metrics).
	guard *netguard.Guard
	// The service's files (issue 16): the configuration file, where
	// runtime files, hook scripts and storage plugins live.
	config     string
	runDir     string
	hooksDir   string
	pluginDirs string
	// systemd's watchdog: how long a part may have work waiting and
	// finish none of it before the pings stop (internal/sdwatch).
	dbStall, queueStall, metricsStall time.Duration
	// debugHooks serves debug-only endpoints on --debug-listen (tests).
	debugHooks bool
	// onEject, set by run, starts the host afresh as a pool of its own
	// (pool.eject), with root's password hash kept.
	onEject func(rootHash string)
	// mgmt, set by run, moves the API's listeners with the management
	// interface (mgmt.go).
	mgmt *management
}

func main() {
	if err := rootCmd().Execute(); err != nil {
		os.Exit(1)
	}
}

func defaultDataDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "toolstackd")
	}
	if os.Geteuid() == 0 {
		return "/var/lib/toolstackd"
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "state", "toolstackd")
	}
	return ".toolstackd"
}

func rootCmd() *cobra.Command {
	var o options
	cmd := &cobra.Command{
		Use:           "toolstackd",
		Short:         "XenAPI-compatible toolstack daemon for KVM/QEMU hosts",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: false,
		Version:       version.Version,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.config != "" {
				if err := applyConfigFile(cmd.Flags(), o.config); err != nil {
					return err
				}
			}
			if o.socket == "" {
				o.socket = filepath.Join(o.dataDir, "xapi.sock")
			}
			if o.metricsPlugins == "" {
				o.metricsPlugins = filepath.Join(o.dataDir, "metrics-plugins")
			}
			if o.runDir == "" {
				o.runDir = filepath.Join(o.dataDir, "run")
			}
			o.settings = settingsOf(cmd.Flags())
			return run(cmd.Context(), o)
		},
	}
	cmd.SetVersionTemplate("toolstackd {{.Version}}\n")
	f := cmd.Flags()
	f.StringVar(&o.config, "config", "", "read settings from this file (name = value lines, see toolstackd(8)); flags given on the command line win")
	f.StringVar(&o.dataDir, "data-dir", defaultDataDir(), "where the host's state lives")
	_ = f.SetAnnotation("data-dir", docDefault, []string{"/var/lib/toolstackd as root, else $XDG_STATE_HOME/toolstackd or ~/.local/state/toolstackd"})
	f.StringVar(&o.runDir, "run-dir", "", "where runtime files live (the NBD sockets of disk transfers); empty: DATA_DIR/run")
	f.StringVar(&o.hooksDir, "hooks-dir", "", "the VM lifecycle hook scripts, in a directory per hook (xapi's /etc/xapi.d); empty: DATA_DIR/hooks")
	f.StringVar(&o.pluginDirs, "storage-plugin-dirs", "", "comma-separated directories searched for storage plugin drivers; empty: DATA_DIR/storage-plugins and /usr/libexec/toolstackd/storage")
	f.StringVar(&o.listen, "listen", "127.0.0.1:8080", "HTTP address for XML-RPC, JSON-RPC and the other endpoints")
	f.StringVar(&o.advertise, "advertise", "", "the address (ip:port) other hosts of a pool reach this one at, e.g. a proxy in front of it; empty: the --listen-https address if set, else the --listen address (host.address is its IP)")
	f.BoolVar(&o.witness, "witness", false, "run as a pool's witness: a raft voter that never runs VMs (host.enabled is false), so that a pool of two hosts fails over on its own")
	f.StringVar(&o.listenHTTPS, "listen-https", "", "HTTPS address (self-signed certificate made on first boot); empty: none. When set, the host's pool traffic goes over it, each peer checked by its pinned certificate")
	f.BoolVar(&o.httpsOnly, "https-only", false, "answer every request on the plain HTTP listeners 403 Forbidden, as xapi's host.https_only closes port 80 (the local socket is not restricted); needs --listen-https")
	f.StringVar(&o.socket, "socket", "", "local Unix socket whose callers are the local superuser (default DATA_DIR/xapi.sock)")
	f.StringVar(&o.backend, "backend", "simulator", "VM backend: simulator, qemu, or qemu+simulator (QEMU, and the simulator for VMs whose platform has toolstackd-simulated=true)")
	f.Var(&o.hostMemory, "host-memory", "the memory VMs may use on this host, e.g. 16GiB (a simulated host's size); 0: the simulator's is unbounded, QEMU's is the host's available memory")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.Var(&o.logTarget, "log-target", logTargetHelp)
	f.StringVar(&o.qemu.Deprivilege, "qemu-deprivilege", "auto", "run each VM's QEMU as a user of its own, under QEMU's seccomp sandbox, with only its own files: auto (when the daemon runs as root), on (refuse to start without root) or off")
	f.IntVar(&o.qemu.UserBase, "qemu-user-base", qemu.DefaultUserBase, "the first of the user ids reserved for QEMU processes (one per running VM, uid and gid alike); no other user of the host may have one")
	f.IntVar(&o.qemu.Users, "qemu-users", qemu.DefaultUsers, "how many user ids from --qemu-user-base are reserved for QEMU processes")
	f.StringVar(&o.watchdog, "watchdog", "", "HA's watchdog: a device (/dev/watchdog) it pets while this host holds its lease, or \"fake\" (tests: a process that kills this daemon's process group); empty: none")
	f.StringVar(&o.journal, "instance-journal", "", "tests: append every domain's start and stop (and a fake watchdog's reset) to this file, to check that no VM ever runs twice")
	f.StringVar(&o.haTiming, "ha-timing", "", "HA's timing values over the defaults (docs/ha.md), e.g. lease=10s,renew=2s,grace=5s,watchdog=10s,margin=2s,drift=0.01")
	f.StringVar(&o.redoLog, "redo-log", "", "mirror the database into a redo log at this file or block device (e.g. on shared storage)")
	f.BoolVar(&o.metricsOpen, "metrics-open", false, "serve GET /metrics to anyone, without a session (for scrapers that cannot log in); default: authenticated like the other handlers")
	f.StringVar(&o.metricsPlugins, "metrics-plugin-dir", "", "the directory metric plugins write their files to (xcp-rrdd's protocol v2, xapi's /dev/shm/metrics); empty: DATA_DIR/metrics-plugins")
	f.StringVar(&o.networkBackend, "network-backend", networkNone, "how networks become real on this host: none (the database only: no bridge, PIF, VLAN, bond or tunnel is made), linux (Linux bridges through netlink; never touches the NIC carrying the host's address, or links it did not make, unless asked) or openvswitch (Open vSwitch bridges through OVSDB, see --ovs-db and --ovn-nb)")
	f.StringVar(&o.networkNamespace, "network-namespace", "", "the network namespace the network module acts in, as a path (/run/netns/NAME); empty: the daemon's own")
	f.StringVar(&o.ovsDB, "ovs-db", "unix:/run/openvswitch/db.sock", "with --network-backend openvswitch: the Open vSwitch database, unix:PATH or tcp:HOST:PORT")
	f.StringVar(&o.ovsDatapath, "ovs-datapath", "auto", "with --network-backend openvswitch: the datapath type of new bridges, system (kernel module), netdev (userspace) or auto (system when the openvswitch kernel module is loaded, else netdev)")
	f.StringVar(&o.ovnNB, "ovn-nb", "", "with --network-backend openvswitch: OVN mode, a logical switch port per plugged VIF in this northbound database (unix:PATH or tcp:HOST:PORT); empty: no OVN")
	f.StringVar(&o.debugListen, "debug-listen", "", "serve Go's profiler (net/http/pprof) on this address, e.g. 127.0.0.1:6060; empty: off")
	o.gcHeapFloor = gctune.DefaultFloor
	f.Var(&o.gcHeapFloor, "gc-heap-floor", "let the heap grow to this size between garbage collections while it is small, e.g. 64MiB (fewer collections, steadier latency; a large host collects as Go's default does); 0 or a GOGC in the environment: Go's default")
	// Connection limits (issue 10): see internal/netguard.
	def := netguard.Defaults()
	f.DurationVar(&o.conns.HeaderTimeout, "header-timeout", def.HeaderTimeout, "a request's line and headers (and a TLS handshake) must arrive within this")
	f.DurationVar(&o.conns.IdleTimeout, "idle-timeout", def.IdleTimeout, "close a keep-alive connection idle for this long")
	f.DurationVar(&o.conns.WriteTimeout, "write-timeout", def.WriteTimeout, "drop a client that accepts no byte of a reply for this long (long polls may wait as asked; only writing is timed)")
	f.DurationVar(&o.conns.StallTimeout, "stall-timeout", def.StallTimeout, "drop a request body, or a taken-over transfer (length-less import, xe handshake), that moves no byte for this long")
	f.DurationVar(&o.conns.BodyGrace, "body-grace", def.BodyGrace, "how long a request body may take before --min-body-rate applies (at most --stall-timeout)")
	f.Int64Var(&o.conns.MinBodyRate, "min-body-rate", def.MinBodyRate, "bytes a second a request body must average, after a --body-grace allowance")
	f.DurationVar(&o.conns.ConsoleIdle, "console-idle-timeout", def.ConsoleIdle, "close a /console connection with no traffic either way for this long")
	f.IntVar(&o.conns.MaxConnsPerClient, "max-conns-per-client", def.MaxConnsPerClient, "connections open at once from one IP address (the local socket is exempt)")
	f.IntVar(&o.conns.MaxConns, "max-conns", 0, "connections open at once in total; 0: the file limit (raised to its hard limit at start) less a reserve")
	f.DurationVar(&o.dbStall, "sd-watchdog-db-stall", time.Minute, "systemd's watchdog (WatchdogSec): stop reassuring it once the database writer has had writes waiting and finished none for this long")
	f.DurationVar(&o.metricsStall, "sd-watchdog-metrics-stall", 2*time.Minute, "systemd's watchdog: stop reassuring it once the metrics loop has finished no 5 s tick for this long")
	f.DurationVar(&o.queueStall, "sd-watchdog-queue-stall", 30*time.Minute, "systemd's watchdog: stop reassuring it once a VM's operation queue has not moved for this long (the operation ahead has run this long)")
	f.BoolVar(&o.debugHooks, "debug-hooks", false, "tests: serve POST /debug/freeze-db?seconds=N on --debug-listen, which holds the database writer as a hung disk would")
	_ = f.MarkHidden("debug-hooks")
	cmd.AddCommand(recoverCmd())
	cmd.AddCommand(configTemplateCmd())
	cmd.AddCommand(docsCmd())
	cmd.AddCommand(fakeWatchdogCmd())
	return cmd
}

func run(ctx context.Context, o options) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := newLogger(o.logTarget, level)
	if o.gcHeapFloor > 0 {
		gcCtx, stopGC := context.WithCancel(ctx)
		defer stopGC()
		go gctune.Run(gcCtx, uint64(o.gcHeapFloor))
	}
	switch o.backend {
	case "simulator", "qemu", "qemu+simulator":
	default:
		return fmt.Errorf("--backend must be simulator, qemu or qemu+simulator, not %q", o.backend)
	}
	if o.watchdog == "fake" {
		if err := leadProcessGroup(); err != nil {
			return fmt.Errorf("--watchdog fake: %w", err)
		}
	}
	if err := os.MkdirAll(o.dataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	if err := os.MkdirAll(o.runDir, 0o700); err != nil {
		return fmt.Errorf("run dir: %w", err)
	}
	if err := o.checkHTTPSOnly(); err != nil {
		return err
	}
	store, err := openCertStore(o)
	if err != nil {
		return err
	}
	o.certStore = store
	guard := connectionGuard(o, log)
	o.guard = guard
	ejected := make(chan string, 1)
	o.onEject = func(rootHash string) {
		select {
		case ejected <- rootHash:
		default: // one at a time
		}
	}
	o.mgmt = &management{o: o, log: log}
	h, err := openHost(o, log)
	if err != nil {
		return err
	}
	// The listeners serve whichever host is current: an ejected host is
	// rebuilt in place while they keep serving.
	var current handlerSwitch
	current.set(api.TrimSlash(h.router))
	var cur atomic.Pointer[host] // for the watchdog and the debug hooks
	cur.Store(h)
	// The pool's other hosts connect within a budget of their own, which
	// no client flood can take (netguard.Guard.SetPeers).
	guard.SetPeers(func(ip netip.Addr) bool {
		h := cur.Load()
		return h != nil && h.pool != nil && h.pool.IsPeer(ip)
	})
	ls, err := listen(o, guard, &current, cur.Load, log)
	if err != nil {
		_ = h.close() // the listen error is the one to report
		return err
	}
	o.mgmt.attach(ls, func() *pool.Pool { return cur.Load().pool })
	o.mgmt.resume(h)
	// systemd (Type=notify) hears that the daemon is ready once the API
	// answers a call, not merely once the sockets are open.
	if err := ls.answering(ctx, 30*time.Second); err != nil {
		ls.shutdown(time.Second)
		_ = h.close()
		return fmt.Errorf("the API does not answer: %w", err)
	}
	_, _ = daemon.SdNotify(false, daemon.SdNotifyReady) // no systemd, or it went: nothing to tell
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	startWatchdog(watchCtx, o, cur.Load, log)

	sig, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	for {
		select {
		case hash := <-ejected:
			if h, err = rebuild(h, o, hash, log); err != nil {
				log.Error("could not start afresh after leaving the pool", "err", err)
				ls.shutdown(10 * time.Second)
				return err
			}
			current.set(api.TrimSlash(h.router))
			cur.Store(h)
			log.Info("left the pool: this host is a pool of its own")
			continue
		case <-sig.Done():
		}
		break
	}
	log.Info("stopping")
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	stopWatch()
	h.stopCalls() // ends long polls, so that shutdown does not wait for them
	ls.shutdown(10 * time.Second)
	if !ls.localFromSystemd {
		_ = os.Remove(o.socket)
	}
	return h.close()
}

// handlerSwitch serves the current host's router.
type handlerSwitch struct{ h atomic.Pointer[http.Handler] }

func (s *handlerSwitch) set(h http.Handler) { s.h.Store(&h) }

func (s *handlerSwitch) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*s.h.Load()).ServeHTTP(w, r)
}

// rebuild closes a host that left its pool and starts it afresh, as on
// first boot, in the same data dir, keeping root's password hash.
func rebuild(h *host, o options, rootHash string, log *slog.Logger) (*host, error) {
	h.stopCalls()
	if err := h.close(); err != nil {
		log.Warn("closing the host that left the pool", "err", err)
	}
	for _, name := range []string{"toolstackd.db", "raft", "inventory", "pool-secret"} {
		if err := os.RemoveAll(filepath.Join(o.dataDir, name)); err != nil {
			return nil, err
		}
	}
	// The local SR was the pool's; as on a reinstalled xapi host, the new
	// pool starts with a new one (the old files are set aside, not
	// deleted).
	local := storage.LocalSRDir(o.dataDir)
	if _, err := os.Stat(local); err == nil {
		aside := fmt.Sprintf("%s.ejected-%d", local, time.Now().Unix())
		if err := os.Rename(local, aside); err != nil {
			return nil, err
		}
		log.Warn("the local SR of the pool this host left is set aside", "path", aside)
	}
	if err := os.WriteFile(filepath.Join(o.dataDir, rootHashFile), []byte(rootHash+"\n"), 0o600); err != nil {
		return nil, err
	}
	return openHost(o, log)
}

// connectionGuard bounds connections by the file limit: it raises the
// limit to the hard limit and keeps a reserve of it for files and QEMU's
// sockets.
func connectionGuard(o options, log *slog.Logger) *netguard.Guard {
	nofile, err := netguard.RaiseFileLimit()
	if err != nil {
		log.Warn("cannot raise the open file limit", "limit", nofile, "err", err)
	}
	if auto := netguard.MaxConnsForLimit(nofile); o.conns.MaxConns <= 0 || o.conns.MaxConns > auto {
		if o.conns.MaxConns > auto {
			log.Warn("--max-conns is above what the open file limit allows; lowered", "asked", o.conns.MaxConns, "limit", nofile)
		}
		o.conns.MaxConns = auto
	}
	o.conns.Log = log
	return netguard.New(o.conns)
}

// listeners are the HTTP servers a daemon runs, one per listening socket.
type listeners struct {
	log     *slog.Logger
	guard   *netguard.Guard
	servers []*http.Server
	wg      sync.WaitGroup
	// probe is where the daemon calls itself to see that the API answers
	// (the local socket).
	probe net.Addr
	// localFromSystemd: the local socket is systemd's, which keeps it.
	localFromSystemd bool
	// mu guards servers and api: the management interface adds and
	// retires listeners while the daemon runs (mgmt.go).
	mu sync.Mutex
	// api are the API's TCP listeners, which move with the management
	// interface.
	api []*apiListener
}

// serve runs an HTTP server for h on l, through the connection guard;
// with a TLS configuration it serves HTTPS.
func (ls *listeners) serve(l net.Listener, h http.Handler, tlsCfg ...*tls.Config) {
	hs := ls.guard.Server(h)
	hs.ErrorLog = slog.NewLogLogger(ls.log.Handler(), slog.LevelDebug)
	l = ls.guard.Listener(l, l.Addr().Network() == "unix")
	ls.mu.Lock()
	ls.servers = append(ls.servers, hs)
	ls.mu.Unlock()
	ls.wg.Add(1)
	go func() {
		defer ls.wg.Done()
		var err error
		if len(tlsCfg) == 1 {
			hs.TLSConfig = tlsCfg[0]
			err = hs.ServeTLS(l, "", "")
		} else {
			err = hs.Serve(l)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			ls.log.Error("serving", "addr", l.Addr(), "err", err)
		}
	}()
}

// shutdown stops every server, waiting up to grace for calls in progress.
func (ls *listeners) shutdown(grace time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	ls.mu.Lock()
	servers := slices.Clone(ls.servers)
	ls.mu.Unlock()
	for _, hs := range servers {
		_ = hs.Shutdown(ctx) // past the deadline, the process exits anyway
	}
	ls.wg.Wait()
}

// listen opens every socket the options ask for (or takes those systemd
// hands over), the HTTPS one and the local superuser socket, and serves
// the router on them.
func listen(o options, guard *netguard.Guard, router http.Handler, current func() *host, log *slog.Logger) (ls *listeners, err error) {
	ls = &listeners{log: log, guard: guard}
	defer func() {
		if err != nil {
			ls.shutdown(time.Second)
		}
	}()
	// Sockets handed over by systemd (toolstackd.socket) come first: the
	// Unix socket named "local" (FileDescriptorName=local) is the local
	// superuser socket, every other one serves the API. Without an API
	// socket from systemd, listen on --listen.
	// The HTTPS socket is bound first: a client (or a test harness) that
	// finds the plain port answering finds the HTTPS one bound too.
	var httpsL net.Listener
	if o.listenHTTPS != "" {
		if httpsL, err = net.Listen("tcp", o.listenHTTPS); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				_ = httpsL.Close() // not served yet when the plain one failed
			}
		}()
	}
	var local net.Listener
	apiSockets := 0
	named, _ := activation.ListenersWithNames() // none: not socket-activated
	for name, list := range named {
		for _, l := range list {
			if name == "local" && l.Addr().Network() == "unix" && local == nil {
				local = l
				continue
			}
			ls.serveAPI(l, plainHandler(o, router), nil)
			apiSockets++
			log.Info("serving on socket from systemd", "addr", l.Addr())
		}
	}
	if apiSockets == 0 {
		l, err := net.Listen("tcp", o.listen)
		if err != nil {
			return nil, err
		}
		ls.serveAPI(l, plainHandler(o, router), nil)
		log.Info("serving XenAPI", "url", "http://"+l.Addr().String())
	}
	if httpsL != nil {
		ls.serveAPI(httpsL, router, o.certStore.ServerTLS()) // certificates swapped in place (certs.go)
		log.Info("serving XenAPI", "url", "https://"+httpsL.Addr().String())
	}
	if local != nil {
		// systemd made it, with the unit's SocketMode (0600).
		ls.localFromSystemd = true
	} else {
		_ = os.Remove(o.socket)
		local, err = net.Listen("unix", o.socket)
		if err != nil {
			return nil, fmt.Errorf("local socket: %w", err)
		}
		// The socket grants superuser rights: never serve it open to all.
		if err := os.Chmod(o.socket, 0o600); err != nil {
			_ = local.Close()
			return nil, fmt.Errorf("local socket: %w", err)
		}
	}
	ls.probe = local.Addr()
	ls.serve(local, api.LocalHandler(router))
	log.Info("serving local superuser socket", "path", local.Addr().String())
	if o.debugListen != "" {
		l, err := net.Listen("tcp", o.debugListen)
		if err != nil {
			return nil, fmt.Errorf("--debug-listen: %w", err)
		}
		ls.serve(l, debugHandler(o, current, log))
		log.Info("serving the profiler", "url", "http://"+l.Addr().String()+"/debug/pprof/")
	}
	return ls, nil
}

// The inventory file names this host, as xapi's INSTALLATION_UUID does.
func writeInventory(dir, hostUUID string) error {
	return os.WriteFile(filepath.Join(dir, "inventory"), []byte("INSTALLATION_UUID='"+hostUUID+"'\n"), 0o600)
}

func readInventory(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "inventory")) //nolint:gosec // the operator's data dir and a fixed name
	if err != nil {
		return "", fmt.Errorf("inventory: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "INSTALLATION_UUID="); ok {
			return strings.Trim(v, "'\" "), nil
		}
	}
	return "", fmt.Errorf("inventory: no INSTALLATION_UUID")
}

// rootPassword is TOOLSTACKD_ROOT_PASSWORD, or the one generated earlier
// and kept in DATA_DIR/root-password, or a new one written there.
func rootPassword(dir string, log *slog.Logger) (string, error) {
	if pw := os.Getenv("TOOLSTACKD_ROOT_PASSWORD"); pw != "" {
		return pw, nil
	}
	path := filepath.Join(dir, "root-password")
	if b, err := os.ReadFile(path); err == nil { //nolint:gosec // the operator's data dir and a fixed name
		return strings.TrimSpace(string(b)), nil
	}
	raw := make([]byte, 18)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	pw := base64.RawURLEncoding.EncodeToString(raw)
	if err := os.WriteFile(path, []byte(pw+"\n"), 0o600); err != nil {
		return "", err
	}
	log.Info("generated root password", "file", path) // the password itself is never logged
	return pw, nil
}

// Command toolstackd is the XenAPI daemon: one per host.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/gorilla/mux"
	"github.com/spf13/cobra"

	"toolstackd/internal/api"
	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/cli"
	"toolstackd/internal/db"
	"toolstackd/internal/db/persist"
	"toolstackd/internal/netguard"
	"toolstackd/internal/storage" // issue 6
	"toolstackd/internal/xenops"  // issue 7
)

type options struct {
	dataDir     string
	listen      string
	listenHTTPS string
	socket      string
	backend     string
	logLevel    string
	redoLog     string
	debugListen string
	conns       netguard.Config
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
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.socket == "" {
				o.socket = filepath.Join(o.dataDir, "xapi.sock")
			}
			return run(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dataDir, "data-dir", defaultDataDir(), "where the host's state lives")
	f.StringVar(&o.listen, "listen", "127.0.0.1:8080", "HTTP address for XML-RPC, JSON-RPC and the other endpoints")
	f.StringVar(&o.listenHTTPS, "listen-https", "", "HTTPS address (self-signed certificate made on first boot); empty: none")
	f.StringVar(&o.socket, "socket", "", "local Unix socket whose callers are the local superuser (default DATA_DIR/xapi.sock)")
	f.StringVar(&o.backend, "backend", "simulator", "VM backend: simulator or qemu")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.redoLog, "redo-log", "", "mirror the database into a redo log at this file or block device (e.g. on shared storage)")
	f.StringVar(&o.debugListen, "debug-listen", "", "serve Go's profiler (net/http/pprof) on this address, e.g. 127.0.0.1:6060; empty: off")
	// Connection limits (issue 10): see internal/netguard.
	def := netguard.Defaults()
	f.DurationVar(&o.conns.HeaderTimeout, "header-timeout", def.HeaderTimeout, "a request's line and headers (and a TLS handshake) must arrive within this")
	f.DurationVar(&o.conns.IdleTimeout, "idle-timeout", def.IdleTimeout, "close a keep-alive connection idle for this long")
	f.DurationVar(&o.conns.WriteTimeout, "write-timeout", def.WriteTimeout, "drop a client that accepts no byte of a reply for this long (long polls may wait as asked; only writing is timed)")
	f.DurationVar(&o.conns.StallTimeout, "stall-timeout", def.StallTimeout, "drop a request body, or a taken-over transfer (length-less import, xe handshake), that moves no byte for this long")
	f.Int64Var(&o.conns.MinBodyRate, "min-body-rate", def.MinBodyRate, "bytes a second a request body must average (after a stall-timeout allowance)")
	f.DurationVar(&o.conns.ConsoleIdle, "console-idle-timeout", def.ConsoleIdle, "close a /console connection with no traffic either way for this long")
	f.IntVar(&o.conns.MaxConnsPerClient, "max-conns-per-client", def.MaxConnsPerClient, "connections open at once from one IP address (the local socket is exempt)")
	f.IntVar(&o.conns.MaxConns, "max-conns", 0, "connections open at once in total; 0: the file limit (raised to its hard limit at start) less a reserve")
	cmd.AddCommand(recoverCmd())
	return cmd
}

func run(ctx context.Context, o options) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	switch o.backend {
	case "simulator", "qemu":
	default:
		return fmt.Errorf("--backend must be simulator or qemu, not %q", o.backend)
	}
	if err := os.MkdirAll(o.dataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	// Connections are bounded by the file limit: raise it to the hard
	// limit, and keep a reserve of it for files and QEMU's sockets.
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
	guard := netguard.New(o.conns)
	cfg := api.DefaultConfig()
	store, err := persist.Open(filepath.Join(o.dataDir, "toolstackd.db"), dm.Model, persist.Options{Log: log})
	if err != nil {
		return err
	}
	first := store.Empty()
	d := db.New(dm.Model, db.Options{Persister: store})
	if err := store.Load(d); err != nil {
		return err
	}
	facts := api.ProbeHost()
	var hostRef string
	if first {
		pw, err := rootPassword(o.dataDir, log)
		if err != nil {
			return err
		}
		hash, err := api.HashPassword(pw, cfg.PasswordIterations)
		if err != nil {
			return err
		}
		if hostRef, err = api.FirstBoot(d, facts, api.BootOptions{RootPasswordHash: hash}); err != nil {
			return fmt.Errorf("first boot: %w", err)
		}
		host, _ := d.Snapshot().Get(dm.Host.Class, hostRef)
		if err := writeInventory(o.dataDir, host.UUID()); err != nil {
			return err
		}
		log.Info("initialised a new pool", "host", host.UUID())
	} else {
		id, err := readInventory(o.dataDir)
		if err != nil {
			return err
		}
		host, ok := d.Snapshot().ByUUID(dm.Host.Class, id)
		if !ok {
			return fmt.Errorf("this host (%s in %s) is not in the database", id, filepath.Join(o.dataDir, "inventory"))
		}
		hostRef = host.Ref
		if err := api.StartupReset(d, hostRef, facts); err != nil {
			return err
		}
		log.Info("loaded database", "generation", d.Generation(), "host", id)
	}
	cfg.HostRef = hostRef
	if o.redoLog != "" {
		rl, err := persist.AttachRedoLog(store, d, o.redoLog, log)
		if err != nil {
			return fmt.Errorf("redo log: %w", err)
		}
		defer func(c func() error) { _ = c() }(rl.Close)
		log.Info("mirroring the database into a redo log", "path", o.redoLog)
	}
	srv := api.New(d, cfg, log)
	srv.OnRestore = func(host *db.Row) {
		if err := writeInventory(o.dataDir, host.UUID()); err != nil {
			log.Error("inventory after restore", "err", err)
		}
		log.Info("database restored; this host is now", "host", host.UUID())
	}
	srv.Start()

	router := mux.NewRouter()
	srv.Routes(router)
	// Storage (issue 6): SR drivers, the SR/PBD/VDI/SM calls, /import_raw_vdi and /export_raw_vdi.
	var protected []string
	if o.redoLog != "" {
		// A file SR must not be made where the redo log lives.
		protected = append(protected, filepath.Dir(o.redoLog))
	}
	stor, err := storage.Register(srv, router, storage.Config{DataDir: o.dataDir, HostRef: hostRef, FirstBoot: first, Log: log,
		ProtectedDirs: protected})
	if err != nil {
		return err
	}
	// xenops (issue 7): VM lifecycle, hotplug and /console, with disks from
	// the storage layer's datapaths.
	disks := &storageDisks{s: stor}
	xm, err := xenops.Register(srv, router, xenops.Config{Backend: o.backend, DataDir: o.dataDir, HostRef: hostRef, Log: log,
		ListenAddr: o.listen, Disks: disks})
	if err != nil {
		return fmt.Errorf("xenops: %w", err)
	}
	disks.vm.Store(xm)
	// xe CLI (issue 5): POST /cli, the thin-CLI protocol.
	cli.New(srv, cli.Options{Log: log}).Routes(router)
	var servers []*http.Server
	var wg sync.WaitGroup
	serve := func(l net.Listener, h http.Handler, tlsFiles ...string) {
		hs := guard.Server(h)
		hs.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelDebug)
		l = guard.Listener(l, l.Addr().Network() == "unix")
		servers = append(servers, hs)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if len(tlsFiles) == 2 {
				err = hs.ServeTLS(l, tlsFiles[0], tlsFiles[1])
			} else {
				err = hs.Serve(l)
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("serving", "addr", l.Addr(), "err", err)
			}
		}()
	}
	// Sockets handed over by systemd come first; otherwise listen.
	if ls, err := activation.Listeners(); err == nil && len(ls) > 0 {
		for _, l := range ls {
			serve(l, router)
			log.Info("serving on socket from systemd", "addr", l.Addr())
		}
	} else {
		l, err := net.Listen("tcp", o.listen)
		if err != nil {
			return err
		}
		serve(l, router)
		log.Info("serving XenAPI", "url", "http://"+l.Addr().String())
	}
	if o.listenHTTPS != "" {
		cert, key, err := ensureCertificate(o.dataDir)
		if err != nil {
			return fmt.Errorf("certificate: %w", err)
		}
		l, err := net.Listen("tcp", o.listenHTTPS)
		if err != nil {
			return err
		}
		serve(l, router, cert, key)
		log.Info("serving XenAPI", "url", "https://"+l.Addr().String())
	}
	_ = os.Remove(o.socket)
	ul, err := net.Listen("unix", o.socket)
	if err != nil {
		return fmt.Errorf("local socket: %w", err)
	}
	// The socket grants superuser rights: never serve it open to all.
	if err := os.Chmod(o.socket, 0o600); err != nil {
		_ = ul.Close()
		return fmt.Errorf("local socket: %w", err)
	}
	serve(ul, api.LocalHandler(router))
	log.Info("serving local superuser socket", "path", o.socket)
	if o.debugListen != "" {
		l, err := net.Listen("tcp", o.debugListen)
		if err != nil {
			return fmt.Errorf("--debug-listen: %w", err)
		}
		serve(l, profiler())
		log.Info("serving the profiler", "url", "http://"+l.Addr().String()+"/debug/pprof/")
	}
	_, _ = daemon.SdNotify(false, daemon.SdNotifyReady) // no systemd, or it went: nothing to tell

	sig, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-sig.Done()
	log.Info("stopping")
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	srv.Close() // ends long polls, so that shutdown does not wait for them
	xm.Close()  // xenops (issue 7): stops watching; VMs keep running
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, hs := range servers {
		_ = hs.Shutdown(sctx) // past the deadline, the process exits anyway
	}
	wg.Wait()
	_ = os.Remove(o.socket)
	return store.Close()
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
	log.Info("generated root password", "password", pw, "file", path)
	return pw, nil
}

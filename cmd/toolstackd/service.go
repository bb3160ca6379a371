package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"toolstackd/internal/db/persist"
	"toolstackd/internal/sdwatch"
)

// What the daemon does for systemd (packaging/toolstackd.service):
// Type=notify readiness once the API answers, and the watchdog.

// answering waits until the API answers a call over the local socket (an
// unauthenticated JSON-RPC call, refused with SESSION_INVALID: the whole
// pipeline ran), or until timeout.
func (ls *listeners) answering(ctx context.Context, timeout time.Duration) error {
	if ls.probe == nil {
		return errors.New("no local socket to call")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addr := ls.probe
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, addr.Network(), addr.String())
		},
		DisableKeepAlives: true,
	}}
	body := `{"jsonrpc":"2.0","method":"pool.get_all","params":["OpaqueRef:NULL"],"id":1}`
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://local/jsonrpc", strings.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			_ = resp.Body.Close() // read whole: nothing to lose
			if resp.StatusCode == http.StatusOK && strings.Contains(string(b), `"jsonrpc"`) {
				return nil
			}
			err = fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, b)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// startWatchdog feeds systemd's watchdog when the unit has one
// (WATCHDOG_USEC, WatchdogSec=): WATCHDOG=1 every half interval while the
// database writer, the VM queues and the metrics loop make progress.
// The checks follow the current host (a host rebuilt after pool.eject).
func startWatchdog(ctx context.Context, o options, current func() *host, log *slog.Logger) {
	// Unset, so that the processes the daemon starts (QEMU) do not see it.
	interval, err := daemon.SdWatchdogEnabled(true)
	if err != nil {
		log.Warn("systemd's watchdog setting is unusable; not pinging it", "err", err)
		return
	}
	if interval == 0 {
		return
	}
	dbStall := sdwatch.Counter(func() (bool, uint64) {
		h := current()
		if h == nil || h.store == nil {
			return false, 0
		}
		queued, handled := h.store.Progress()
		return queued > handled, handled
	})
	queues := map[*host]func() time.Duration{}
	queueStall := func() time.Duration {
		h := current()
		if h == nil || h.xm == nil {
			return 0
		}
		f := queues[h]
		if f == nil {
			clear(queues) // only the current host's
			f = h.xm.Progress().Stalled
			queues[h] = f
		}
		return f()
	}
	// The metrics loop always has work: a tick every 5 s.
	metricsStall := sdwatch.Counter(func() (bool, uint64) {
		h := current()
		if h == nil || h.rrdd == nil {
			return false, 0
		}
		return true, h.rrdd.Ticks()
	})
	log.Info("pinging systemd's watchdog while the daemon makes progress", "interval", interval)
	go sdwatch.Run(ctx, sdwatch.Config{
		Interval: interval,
		Log:      log,
		Notify: func(state string) error {
			_, err := daemon.SdNotify(false, state)
			return err
		},
		Checks: []sdwatch.Check{
			{Name: "database writer", Limit: o.dbStall, Stalled: dbStall},
			{Name: "VM operation queues", Limit: o.queueStall, Stalled: queueStall},
			{Name: "metrics loop", Limit: o.metricsStall, Stalled: metricsStall},
		},
	})
}

// debugHandler serves --debug-listen: Go's profiler, and with
// --debug-hooks the hooks of the tests (POST /debug/freeze-db?seconds=N
// holds the database writer as a hung disk would, for at most
// persist.MaxFreeze).
func debugHandler(o options, current func() *host, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/debug/pprof/", profiler())
	if !o.debugHooks {
		return mux
	}
	mux.HandleFunc("POST /debug/freeze-db", func(w http.ResponseWriter, r *http.Request) {
		secs, err := strconv.Atoi(r.URL.Query().Get("seconds"))
		if err != nil || secs <= 0 || time.Duration(secs)*time.Second > persist.MaxFreeze {
			http.Error(w, "seconds must be 1 to "+strconv.Itoa(int(persist.MaxFreeze/time.Second)), http.StatusBadRequest)
			return
		}
		h := current()
		if h == nil || h.store == nil {
			http.Error(w, "no database file", http.StatusServiceUnavailable)
			return
		}
		// Freeze takes the file's lock, which a write in progress holds:
		// do not hold up the reply for it.
		go h.store.Freeze(time.Duration(secs) * time.Second)
		log.Warn("debug hook: the database writer is frozen", "seconds", secs)
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

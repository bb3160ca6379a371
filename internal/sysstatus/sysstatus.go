// Package sysstatus collects a bug report: the daemon's recent log, a
// dump of the database with its secrets removed, the configuration and
// facts about the host and its QEMU processes, into one archive.
//
// It serves what xapi serves for the same purpose (xapi runs xen-bugtool
// for it; the facts below come from xapi's system_status.ml, xapi_host.ml
// and xen-bugtool, read for facts only):
//
//	GET /system-status?entries=a,b&output=tar|tar.gz|tar.bz2|zip[&task_id=][&host=]
//	GET /system-status?list          the capabilities document
//	host.get_system_status_capabilities(host) -> that document
//	host.bugreport_upload(host, url, options) -> PUTs a report to url
//
// A capability is one kind of content, named by its key. The document
// lists each as xen-bugtool's --capabilities does: a
// <system-status-capabilities> root holding one <capability> element per
// key with the attributes key, pii, min-size, max-size, min-time,
// max-time, content-type and default-checked.
//
// Decisions:
//
//   - The capabilities are toolstackd's own (toolstackd-logs,
//     toolstackd-db, toolstackd-config, system-info, qemu); a name a
//     request gives is only ever looked up in that fixed table, never used
//     to build a path or a command.
//   - Every capability's content is cut at its max-size (with a line
//     saying so) and its gathering at its max-time; what could not be
//     gathered (a program missing, a timeout) is said in a NOTE.txt in its
//     directory rather than failing the report.
//   - output=tar.bz2, xapi's xe default: Go's standard library has no
//     bzip2 writer, so the tar stream is piped through the host's bzip2
//     program. A host without one answers 400 (VALUE_NOT_SUPPORTED, with
//     the formats it can serve) rather than sending gzip under a bzip2
//     name, which a client would fail to unpack. output=tar.gz is offered
//     besides xapi's three.
//   - No output parameter means tar, as xapi's handler defaults to.
//   - An empty entries list means every default-checked capability.
//   - host= (toolstackd's own parameter, a host's ref or uuid) has the
//     coordinator pass the request to that host, so that xe can reach a
//     member's report through the coordinator.
//   - The roles are xapi's for the handler and bugreport_upload
//     (_R_POOL_OP: pool-admin and pool-operator); the capabilities
//     document is read-only's, as xapi's message is.
package sysstatus

import (
	"log/slog"
	"os"
	"sort"
	"time"

	"toolstackd/internal/api"
)

// Config is what the collection needs of the daemon.
type Config struct {
	// DataDir is the daemon's data dir: df reports its file system and
	// QEMU processes naming it are listed.
	DataDir string
	// ConfigFile is the configuration file given with --config ("" if
	// none). It is read when a report is made, redacted.
	ConfigFile string
	// Settings are the effective settings (flag name to value), written
	// redacted into toolstackd-config.
	Settings map[string]string
	// Unit is the systemd unit whose journal is the log (default
	// "toolstackd").
	Unit string
	// LogFile is read (its end) when journalctl is missing.
	LogFile string
	// HostRef is this host.
	HostRef string
	// UploadTimeout bounds host.bugreport_upload's whole upload (default
	// 10 minutes).
	UploadTimeout time.Duration
	// TempDir holds an upload's archive while it is sent (default the
	// system's temporary directory).
	TempDir string
	Log     *slog.Logger
}

// Service makes reports for one host.
type Service struct {
	srv  *api.Server // nil: toolstackd-db reports that there is no database
	cfg  Config
	caps []capability
	log  *slog.Logger
	// now is the clock (tests).
	now func() time.Time
	// lookPath finds programs (tests).
	lookPath func(string) (string, error)
	// procDir is /proc (tests).
	procDir string
	// busy holds a token per report being made: at most maxReports at
	// once, since each may hold its capabilities' max-sizes in memory.
	busy chan struct{}
}

// maxReports bounds the reports made at once; more wait their turn.
const maxReports = 2

// New makes a service; srv may be nil (no database capability content).
func New(srv *api.Server, cfg Config) *Service {
	if cfg.Unit == "" {
		cfg.Unit = "toolstackd"
	}
	if cfg.UploadTimeout <= 0 {
		cfg.UploadTimeout = 10 * time.Minute
	}
	if cfg.TempDir == "" {
		cfg.TempDir = os.TempDir()
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Service{srv: srv, cfg: cfg, log: log, now: time.Now, lookPath: lookPath, procDir: "/proc",
		busy: make(chan struct{}, maxReports)}
	s.caps = s.capabilities()
	return s
}

// Capabilities are the service's capabilities in key order.
func (s *Service) Capabilities() []Capability {
	out := make([]Capability, 0, len(s.caps))
	for _, c := range s.caps {
		out = append(out, c.Capability)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

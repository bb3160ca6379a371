// Package api serves the XenAPI: it decodes XML-RPC and JSON-RPC calls,
// checks sessions and roles, dispatches each call through the datamodel's
// message table (implicit messages straight to the database, explicit
// ones to registered handlers), runs Async calls as tasks, and answers
// event.from.
package api

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"toolstackd/internal/api/events"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

// Config holds the server's named settings.
type Config struct {
	// MaxBodyBytes bounds an RPC request body.
	MaxBodyBytes int64
	// SessionIdleTimeout expires sessions unused for this long.
	SessionIdleTimeout time.Duration
	// MaxSessionsPerOriginator caps the sessions one user may hold under
	// one originator (a client name, or the user name when none is
	// given); the oldest is logged out to make room, as xapi does. The
	// count is per user and originator, so that nobody can push another
	// user's sessions out by naming their originator.
	MaxSessionsPerOriginator int
	// FinishedTaskTTL is how long a finished task stays before it is
	// destroyed; MaxFinishedTasks bounds how many stay at once.
	FinishedTaskTTL  time.Duration
	MaxFinishedTasks int
	// MaxPendingTasksPerSession caps the tasks of one session not yet
	// completed (Async calls and task.create); past it both answer
	// TOO_MANY_PENDING_TASKS. 0 means no cap.
	MaxPendingTasksPerSession int
	// Limits bounds the strings in API arguments (see Limits).
	Limits Limits
	// PasswordIterations is the PBKDF2 work factor for local passwords.
	PasswordIterations int
	// HostRef is this host's ref, for session.this_host and task.resident_on.
	HostRef string
	// RowCacheBytes bounds the memory of encoded records kept for reuse
	// across replies (about 11 KB per VM for both wire formats); 0 turns
	// the cache off.
	RowCacheBytes int64
}

// DefaultConfig returns the settings used unless told otherwise.
func DefaultConfig() Config {
	return Config{
		RowCacheBytes:             rowCacheDefault,
		MaxBodyBytes:              4 << 20,
		SessionIdleTimeout:        24 * time.Hour,
		MaxSessionsPerOriginator:  500,
		FinishedTaskTTL:           time.Hour,
		MaxFinishedTasks:          10000,
		MaxPendingTasksPerSession: 200,
		Limits:                    DefaultLimits(),
		PasswordIterations:        100_000,
	}
}

// Call is one dispatched XenAPI call as a handler sees it.
type Call struct {
	Ctx     context.Context // cancelled when the call's task is cancelled or the client goes away
	Server  *Server
	Session *Session // nil for calls that take no session
	Msg     *schema.Message
	Args    []any  // canonical values, without the session; missing optional ones are nil
	Task    string // the task running this call (Async), or ""

	task  *Task
	relay *Task // progress.go: the relay to a caller following this call, or nil
}

// Handler implements an explicit message. It returns the canonical result
// (a *db.Row is written as its record) or an error, normally *xerr.Error.
type Handler func(c *Call) (any, error)

// Server is the XenAPI server.
type Server struct {
	DB    *db.DB
	Model *schema.Model
	Cfg   Config
	Log   *slog.Logger

	// OnRestore, when set, is told of this host's new record after a
	// database restore (the daemon rewrites its inventory).
	OnRestore func(host *db.Row)

	handlers  map[string]Handler
	guards    map[string][]Guard
	implicitH Handler // s.implicit, made once (a method value allocates)
	admitters map[*schema.Class]Admitter
	sessions  *sessionTable
	tasks     *taskTable
	events    *events.Registry
	rows      *rowCache // encoded records reused across replies
	role      poolRole  // who coordinates (SetPoolRole)
	forwarder atomic.Pointer[Forwarder]
	obs       observeState // call observer, event watcher count

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// New makes a server over a database.
func New(d *db.DB, cfg Config, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{DB: d, Model: d.Model(), Cfg: cfg, Log: log, handlers: map[string]Handler{},
		admitters: map[*schema.Class]Admitter{}, guards: map[string][]Guard{}, stop: make(chan struct{})}
	s.sessions = newSessionTable()
	s.tasks = newTaskTable()
	s.events = events.NewRegistry(d)
	s.rows = newRowCache(cfg.RowCacheBytes)
	s.implicitH = s.implicit
	s.registerCore()
	host := exclusive{shared: hostSharedOps}
	s.SetAdmitter(dm.Host.Class, host)
	for _, c := range []*schema.Class{dm.Pool.Class, dm.Cluster.Class, dm.ClusterHost.Class, dm.VMAppliance.Class, dm.VTPM.Class, dm.VUSB.Class} {
		s.SetAdmitter(c, exclusive{})
	}
	return s
}

// Handle replaces the database's handling of an implicit message (the
// lookups of the message class, a setter with checks of its own). It
// panics on a name the datamodel lacks or on an explicit message, which
// is bound with its typed arguments through Register.
func (s *Server) Handle(wire string, h Handler) {
	if m := s.Model.Message(wire); m != nil && !m.Implicit && !fieldAccessor(m) {
		panic("api: " + wire + " is explicit: bind it with Register")
	}
	s.handle(wire, h)
}

// Guard is a check another module makes before a call runs, wherever it
// is routed: HA refusing a start that would leave no failover plan. It
// runs where the call enters the pool (a call forwarded here was checked
// there), before the call's marks are taken.
type Guard func(c *Call) error

// AddGuard adds a check to a message.
func (s *Server) AddGuard(wire string, g Guard) {
	if s.Model.Message(wire) == nil {
		panic("api: no message " + wire)
	}
	s.guards[wire] = append(s.guards[wire], g)
}

// handle binds a handler to a message.
func (s *Server) handle(wire string, h Handler) {
	if s.Model.Message(wire) == nil {
		panic("api: no message " + wire)
	}
	s.handlers[wire] = h
}

// Implemented reports whether a call of the message (its wire name,
// without "Async.") gets past the bind stage: a handler is registered, or
// the database serves it implicitly. The xe CLI uses it to tell which
// commands could be wired. It is meant for after the modules registered.
func (s *Server) Implemented(wire string) bool {
	m := s.Model.Message(wire)
	switch {
	case m == nil:
		return false
	case s.handlers[m.Wire] != nil:
		return true
	}
	return m.Class.InDB && (m.Implicit || fieldAccessor(m))
}

// Start runs the background jobs (session expiry, task collection).
func (s *Server) Start() {
	s.wg.Add(1)
	go s.housekeeping()
}

// Close stops background jobs and ends every session's waiters.
func (s *Server) Close() {
	s.stopOnce.Do(func() { close(s.stop) })
	s.wg.Wait()
	s.sessions.closeAll()
	s.tasks.cancelAll()
}

func (s *Server) housekeeping() {
	defer s.wg.Done()
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.expireSessions(time.Now())
			s.collectTasks(time.Now())
		}
	}
}

package api

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"

	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/api/events"
	"toolstackd/internal/api/wire"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// registerCore installs the explicit messages of the session, task and
// event classes.
func (s *Server) registerCore() {
	s.Handle("session.login_with_password", s.login)
	s.Handle("session.logout", s.logout)
	s.Handle("session.local_logout", s.logout)
	s.Handle("session.change_password", s.changePassword)
	s.Handle("session.get_all_subject_identifiers", s.allSubjectIdentifiers)
	s.Handle("session.logout_subject_identifier", s.logoutSubject)

	s.Handle("task.create", s.createTask)
	s.Handle("task.cancel", s.cancelTask)
	s.Handle("task.destroy", s.destroyTask)
	for _, m := range dm.Task.Class.Messages {
		if !m.Implicit && m.Name != "create" && m.Name != "cancel" && m.Name != "destroy" {
			s.Handle(m.Wire, s.taskSetter)
		}
	}

	s.registerMessages()
	s.registerNetwork()
	s.registerRoles()

	s.Handle("event.from", s.eventFrom)
	s.Handle("event.inject", s.eventInject)
	s.Handle("event.register", s.eventRegister)
	s.Handle("event.unregister", s.eventUnregister)
	s.Handle("event.next", s.eventNext)
	s.Handle("event.get_current_id", func(c *Call) (any, error) { return int64(s.events.CurrentID()), nil })
}

func (s *Server) allSubjectIdentifiers(c *Call) (any, error) {
	seen := map[string]bool{}
	out := []string{}
	for _, sess := range s.sessions.all() {
		if sess.Subject == "" || sess.Subject == "OpaqueRef:NULL" {
			continue
		}
		if r, ok := c.Snapshot().Get(dm.Subject.Class, sess.Subject); ok {
			id := r.String(dm.Subject.SubjectIdentifier)
			if !seen[id] {
				seen[id] = true
				out = append(out, id)
			}
		}
	}
	return out, nil
}

// logoutSubject ends the sessions of a subject identifier, as xapi does:
// never the local superuser's, nor the caller's own.
func (s *Server) logoutSubject(c *Call) (any, error) {
	id := c.String(0)
	snap := c.Snapshot()
	s.revokeSessions(func(x *Session) bool {
		if x.LocalSuperuser || x == c.Session {
			return false
		}
		r, ok := snap.Get(dm.Subject.Class, x.Subject)
		return ok && r.String(dm.Subject.SubjectIdentifier) == id
	})
	return nil, nil
}

// sessionCtx is a context that ends with the request or with the session.
func sessionCtx(c *Call) (context.Context, func()) {
	ctx, cancel := context.WithCancel(c.Ctx)
	stop := context.AfterFunc(c.Session.Context(), cancel)
	return ctx, func() { stop(); cancel() }
}

func (s *Server) eventFrom(c *Call) (any, error) {
	classes, _ := c.Args[0].([]string)
	sub, err := events.ParseSubscription(s.Model, classes)
	if err != nil {
		return nil, err
	}
	timeout := 24 * time.Hour
	if f, _ := c.Args[2].(float64); f >= 0 && !math.IsNaN(f) && !math.IsInf(f, 0) {
		timeout = time.Duration(f * float64(time.Second))
	}
	ctx, done := sessionCtx(c)
	defer done()
	b, err := events.From(ctx, s.DB, sub, c.String(1), timeout)
	if err != nil {
		if c.Session.Context().Err() != nil {
			return nil, xerr.New(xerr.SessionInvalid, c.Session.Ref)
		}
		return nil, err
	}
	return eventBatch{b: b, key: batchKey{sub: sub.String(), token: c.String(1)}, rows: s.rows}, nil
}

func (s *Server) eventInject(c *Call) (any, error) {
	return events.Inject(s.DB, c.String(0), c.String(1))
}

func (s *Server) eventRegister(c *Call) (any, error) {
	classes, _ := c.Args[0].([]string)
	return nil, s.events.Register(c.Session.Ref, classes)
}

func (s *Server) eventUnregister(c *Call) (any, error) {
	classes, _ := c.Args[0].([]string)
	return nil, s.events.Unregister(c.Session.Ref, classes)
}

func (s *Server) eventNext(c *Call) (any, error) {
	ctx, done := sessionCtx(c)
	defer done()
	evs, err := s.events.Next(ctx, c.Session.Ref)
	if err != nil {
		if c.Session.Context().Err() != nil || errors.Is(err, context.Canceled) {
			return nil, xerr.New(xerr.SessionInvalid, c.Session.Ref)
		}
		return nil, err
	}
	return legacyEvents{evs, s.DB.Snapshot(), s.rows}, nil
}

// eventBatch writes event.from's result: {events, valid_ref_counts, token}.
// A batch depends only on the snapshot, the subscription and the token
// it started from, so the many watchers one commit wakes get the same
// reply: it is encoded once per transport and snapshot, then copied.
type eventBatch struct {
	b    *events.Batch
	key  batchKey
	rows *rowCache
}

type batchKey struct{ sub, token, kind string }

func (eb eventBatch) MarshalXenAPI(e wire.Encoder) {
	pe, ok := e.(wire.Preencoder)
	if !ok || eb.b.Snap == nil {
		eb.encode(e)
		return
	}
	key := eb.key
	key.kind = pe.Kind()
	enc := eb.b.Snap.Memo(key, func() any { return pe.EncodeAlone(encodeOnly{eb.encode}) }).([]byte)
	pe.Preencoded(enc)
}

// encodeOnly adapts a function to wire.Marshaler.
type encodeOnly struct{ fn func(wire.Encoder) }

func (m encodeOnly) MarshalXenAPI(e wire.Encoder) { m.fn(e) }

func (eb eventBatch) encode(e wire.Encoder) {
	b := eb.b
	e.BeginStruct()
	e.Member("events")
	e.BeginArray()
	for _, ev := range b.Events {
		e.BeginStruct()
		e.Member("id")
		e.String(strconv.FormatUint(ev.ID, 10))
		e.Member("timestamp")
		e.String("0.0")
		e.Member("class")
		e.String(ev.Class.Lower)
		e.Member("operation")
		e.String(ev.Op.String())
		e.Member("ref")
		e.String(ev.Ref)
		if ev.Row != nil {
			e.Member("snapshot")
			eb.rows.row(e, b.Snap, ev.Row)
		}
		e.EndStruct()
	}
	e.EndArray()
	e.Member("valid_ref_counts")
	e.BeginStruct()
	for _, k := range schema.SortedKeys(b.ValidRefCounts) {
		e.Member(k)
		e.Int32(b.ValidRefCounts[k])
	}
	e.EndStruct()
	e.Member("token")
	e.String(b.Token)
	e.EndStruct()
}

// legacyEvents writes event.next's result: event records with snapshots.
type legacyEvents struct {
	evs  []events.LegacyEvent
	snap *db.Snapshot
	rows *rowCache
}

func (le legacyEvents) MarshalXenAPI(e wire.Encoder) {
	e.BeginArray()
	for _, ev := range le.evs {
		e.BeginStruct()
		e.Member("id")
		e.Int(int64(ev.ID))
		e.Member("timestamp")
		e.String(strconv.FormatFloat(float64(ev.Timestamp.UnixNano())/1e9, 'f', 6, 64))
		e.Member("class")
		e.String(ev.Class.Lower)
		e.Member("operation")
		e.String(ev.Op.String())
		e.Member("ref")
		e.String(ev.Ref)
		e.Member("obj_uuid")
		uuid := ""
		if ev.Row != nil {
			uuid = ev.Row.UUID()
		}
		e.String(uuid)
		if ev.Row != nil {
			e.Member("snapshot")
			le.rows.row(e, le.snap, ev.Row)
		}
		e.EndStruct()
	}
	e.EndArray()
}

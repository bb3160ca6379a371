package api

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"

	"toolstackd/internal/api/events"
	"toolstackd/internal/api/wire"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// registerCore installs the explicit messages of the session, task and
// event classes.
func (s *Server) registerCore() {
	Register(s, s.login)
	Register(s, s.slaveLocalLogin)
	Register(s, s.logout)
	Register(s, func(c *Call, _ dm.SessionLocalLogoutArgs) (dm.Void, error) {
		return s.logout(c, dm.SessionLogoutArgs{})
	})
	Register(s, s.changePassword)
	Register(s, s.allSubjectIdentifiers)
	Register(s, s.logoutSubject)
	// The host's clock (Xen Orchestra's clock-drift check): the call is
	// routed to the host named.
	Register(s, func(c *Call, _ dm.HostGetServertimeArgs) (time.Time, error) { return time.Now().UTC(), nil })
	Register(s, func(c *Call, _ dm.HostGetServerLocaltimeArgs) (time.Time, error) {
		now := time.Now()
		_, off := now.Zone()
		return now.UTC().Add(time.Duration(off) * time.Second), nil
	})

	s.registerTasks()
	s.registerMessages()
	s.registerNetwork()
	s.registerHostOps()
	s.registerRoles()

	Register(s, s.eventFrom)
	Register(s, s.eventInject)
	Register(s, s.eventRegister)
	Register(s, s.eventUnregister)
	Register(s, s.eventNext)
	Register(s, func(c *Call, _ dm.EventGetCurrentIDArgs) (int64, error) { return int64(s.events.CurrentID()), nil })
}

func (s *Server) allSubjectIdentifiers(c *Call, _ dm.SessionGetAllSubjectIdentifiersArgs) ([]string, error) {
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
func (s *Server) logoutSubject(c *Call, a dm.SessionLogoutSubjectIdentifierArgs) (dm.Void, error) {
	id := a.SubjectIdentifier
	snap := c.Snapshot()
	s.revokeSessions(func(x *Session) bool {
		if x.LocalSuperuser || x == c.Session {
			return false
		}
		r, ok := snap.Get(dm.Subject.Class, x.Subject)
		return ok && r.String(dm.Subject.SubjectIdentifier) == id
	})
	return dm.Void{}, nil
}

// sessionCtx is a context that ends with the request or with the session.
func sessionCtx(c *Call) (context.Context, func()) {
	ctx, cancel := context.WithCancel(c.Ctx)
	stop := context.AfterFunc(c.Session.Context(), cancel)
	return ctx, func() { stop(); cancel() }
}

func (s *Server) eventFrom(c *Call, a dm.EventFromArgs) (any, error) {
	sub, err := events.ParseSubscription(s.Model, a.Classes)
	if err != nil {
		return nil, err
	}
	timeout := 24 * time.Hour
	if f := a.Timeout; f >= 0 && !math.IsNaN(f) && !math.IsInf(f, 0) {
		timeout = time.Duration(f * float64(time.Second))
	}
	ctx, done := sessionCtx(c)
	defer done()
	s.obs.watchers.Add(1)
	defer s.obs.watchers.Add(-1)
	b, err := events.From(ctx, s.DB, sub, a.Token, timeout)
	if err != nil {
		if c.Session.Context().Err() != nil {
			return nil, xerr.New(xerr.SessionInvalid, c.Session.Ref)
		}
		return nil, err
	}
	return eventBatch{b: b, key: batchKey{sub: sub.String(), token: a.Token}, rows: s.rows}, nil
}

func (s *Server) eventInject(c *Call, a dm.EventInjectArgs) (string, error) {
	return events.Inject(s.DB, a.Class, a.Ref)
}

func (s *Server) eventRegister(c *Call, a dm.EventRegisterArgs) (dm.Void, error) {
	return dm.Void{}, s.events.Register(c.Session.Ref, a.Classes)
}

func (s *Server) eventUnregister(c *Call, a dm.EventUnregisterArgs) (dm.Void, error) {
	return dm.Void{}, s.events.Unregister(c.Session.Ref, a.Classes)
}

func (s *Server) eventNext(c *Call, _ dm.EventNextArgs) (any, error) {
	ctx, done := sessionCtx(c)
	defer done()
	s.obs.watchers.Add(1)
	defer s.obs.watchers.Add(-1)
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
		encodeEventObject(e, ev.Class, ev.Op, ev.Ref)
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
		encodeEventObject(e, ev.Class, ev.Op, ev.Ref)
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

// encodeEventObject writes the members naming what an event is about.
func encodeEventObject(e wire.Encoder, c *schema.Class, op db.Op, ref string) {
	e.Member("class")
	e.String(c.Lower)
	e.Member("operation")
	e.String(op.String())
	e.Member("ref")
	e.String(ref)
}

package api

import (
	"strconv"
	"strings"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// registerMessages serves the message class (alerts). Its lookups are
// declared as explicit messages but behave as the implicit ones.
func (s *Server) registerMessages() {
	// The datamodel declares these explicit, but they are the implicit
	// lookups of the class: the generic handler serves them.
	for _, name := range []string{"get_all_records", "get_all_records_where", "get_by_uuid", "get_record", "get_all", "destroy"} {
		s.handle("message."+name, s.implicit)
	}
	Register(s, s.createMessage)
	Register(s, func(c *Call, a dm.MessageGetSinceArgs) (any, error) {
		return s.messagesWhere(c, func(r *db.Row) bool { return r.Get(dm.Message.Timestamp).(time.Time).After(a.Since) }), nil
	})
	Register(s, func(c *Call, a dm.MessageGetArgs) (any, error) {
		return s.messagesWhere(c, func(r *db.Row) bool {
			return r.String(dm.Message.Cls) == string(a.Cls) && r.String(dm.Message.ObjUUID) == a.ObjUUID && r.Get(dm.Message.Timestamp).(time.Time).After(a.Since)
		}), nil
	})
	Register(s, func(c *Call, a dm.MessageDestroyManyArgs) (dm.Void, error) {
		return dm.Void{}, c.Update(func(tx *db.Tx) error {
			for _, ref := range a.Messages {
				if err := tx.Delete(dm.Message.Class, string(ref)); err != nil {
					return err
				}
			}
			return nil
		})
	})
	Register(s, func(c *Call, a dm.MessageDestroyAllArgs) (dm.Void, error) {
		match, err := destroyAllFilter(a.Filters)
		if err != nil {
			return dm.Void{}, err
		}
		rows := s.messagesWhere(c, match)
		return dm.Void{}, c.Update(func(tx *db.Tx) error {
			for _, r := range rows {
				if err := tx.Delete(dm.Message.Class, r.Ref); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// destroyAllFilter reads message.destroy_all's filters as xapi does:
// "before" and "after" are times (messages strictly earlier, or later,
// go), "priority" a number (messages of that priority go); other keys are
// ignored, and no filter matches every message.
func destroyAllFilter(filters map[string]string) (func(*db.Row) bool, error) {
	var before, after *time.Time
	prio := int64(-1)
	for k, v := range filters {
		switch k {
		case "before", "after":
			t, err := schema.ParseTime(v)
			if err != nil {
				return nil, xerr.New(xerr.InvalidValue, k, v)
			}
			if k == "before" {
				before = &t
			} else {
				after = &t
			}
		case "priority":
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || n < 0 {
				return nil, xerr.New(xerr.InvalidValue, k, v)
			}
			prio = n
		}
	}
	return func(r *db.Row) bool {
		ts, _ := r.Get(dm.Message.Timestamp).(time.Time)
		if before != nil && !ts.Before(*before) || after != nil && !ts.After(*after) {
			return false
		}
		p, _ := r.Get(dm.Message.Priority).(int64)
		return prio < 0 || p == prio
	}, nil
}

func (s *Server) messagesWhere(c *Call, keep func(*db.Row) bool) []*db.Row {
	var out []*db.Row
	c.Snapshot().Ascend(dm.Message.Class, func(r *db.Row) bool {
		if keep(r) {
			out = append(out, r)
		}
		return true
	})
	return out
}

func (s *Server) createMessage(c *Call, a dm.MessageCreateArgs) (dm.MessageRef, error) {
	if a.Name == "" {
		return "", xerr.New(xerr.InvalidValue, "name", a.Name)
	}
	rec := &dm.MessageRecord{Name: a.Name, Priority: a.Priority, Cls: a.Cls, ObjUUID: a.ObjUUID, Timestamp: time.Now().UTC(), Body: a.Body}
	var ref string
	err := c.Update(func(tx *db.Tx) (err error) {
		ref, err = tx.Insert(dm.Message.Class, "", rec.Row())
		return err
	})
	return dm.MessageRef(ref), err
}

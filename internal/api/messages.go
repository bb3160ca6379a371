package api

import (
	"time"

	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/db"
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
		match := func(r *db.Row) bool {
			for k, v := range a.Filters {
				if f := dm.Message.Class.Field(k); f == nil || r.String(f) != v {
					return false
				}
			}
			return true
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

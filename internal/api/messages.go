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
	for _, name := range []string{"get_all_records", "get_all_records_where", "get_by_uuid", "get_record", "get_all", "destroy"} {
		s.Handle("message."+name, s.implicit)
	}
	s.Handle("message.create", s.createMessage)
	s.Handle("message.get_since", func(c *Call) (any, error) {
		since, _ := c.Args[0].(time.Time)
		return s.messagesWhere(c, func(r *db.Row) bool { return r.Get(dm.Message.Timestamp).(time.Time).After(since) }), nil
	})
	s.Handle("message.get", func(c *Call) (any, error) {
		cls, uuid := c.String(0), c.String(1)
		since, _ := c.Args[2].(time.Time)
		return s.messagesWhere(c, func(r *db.Row) bool {
			return r.String(dm.Message.Cls) == cls && r.String(dm.Message.ObjUUID) == uuid && r.Get(dm.Message.Timestamp).(time.Time).After(since)
		}), nil
	})
	s.Handle("message.destroy_many", func(c *Call) (any, error) {
		refs, _ := c.Args[0].([]string)
		return nil, c.Update(func(tx *db.Tx) error {
			for _, ref := range refs {
				if err := tx.Delete(dm.Message.Class, ref); err != nil {
					return err
				}
			}
			return nil
		})
	})
	s.Handle("message.destroy_all", func(c *Call) (any, error) {
		filters, _ := c.Args[0].(map[string]string)
		match := func(r *db.Row) bool {
			for k, v := range filters {
				if f := dm.Message.Class.Field(k); f == nil || r.String(f) != v {
					return false
				}
			}
			return true
		}
		rows := s.messagesWhere(c, match)
		return nil, c.Update(func(tx *db.Tx) error {
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

func (s *Server) createMessage(c *Call) (any, error) {
	name, prio, cls, uuid, body := c.String(0), c.Args[1].(int64), c.String(2), c.String(3), c.String(4)
	if name == "" {
		return nil, xerr.New(xerr.InvalidValue, "name", name)
	}
	rec := &dm.MessageRecord{Name: name, Priority: prio, Cls: dm.Cls(cls), ObjUUID: uuid, Timestamp: time.Now().UTC(), Body: body}
	var ref string
	err := c.Update(func(tx *db.Tx) (err error) {
		ref, err = tx.Insert(dm.Message.Class, "", rec.Row())
		return err
	})
	return ref, err
}

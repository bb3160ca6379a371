package api

import (
	"strings"

	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// implicit serves the messages the datamodel generates for every class:
// record and field getters, setters, set and map operations, lookups,
// create and destroy, all straight against the database.
func (s *Server) implicit(c *Call) (any, error) {
	m, cls := c.Msg, c.Msg.Class
	if !cls.InDB {
		return nil, xerr.New(xerr.NotImplemented, m.Wire)
	}
	snap := c.Snapshot()
	switch m.Name {
	case "get_record":
		return c.Row(0, cls)
	case "get_by_uuid":
		id := c.String(0)
		row, ok := snap.ByUUID(cls, id)
		if !ok {
			return nil, xerr.New(xerr.UUIDInvalid, cls.Name, id)
		}
		return row.Ref, nil
	case "get_by_name_label":
		return refs(snap.ByNameLabel(cls, c.String(0))), nil
	case "get_all":
		return refs(snap.All(cls)), nil
	case "get_all_records":
		return snap.All(cls), nil
	case "get_all_where":
		rows, err := snap.Where(cls, c.String(0))
		if err != nil {
			return nil, err
		}
		return refs(rows), nil
	case "get_all_records_where":
		return snap.Where(cls, c.String(0))
	case "create":
		return s.implicitCreate(c, cls, nil)
	case "destroy":
		if _, err := c.Row(0, cls); err != nil {
			return nil, err
		}
		return nil, c.Update(func(tx *db.Tx) error { return tx.Delete(cls, c.String(0)) })
	}
	// Field accessors: the longer prefixes first (add_to_ before add_).
	for _, p := range []string{"get_", "set_", "add_to_", "remove_from_", "add_", "remove_"} {
		name, ok := strings.CutPrefix(m.Name, p)
		if !ok {
			continue
		}
		f := cls.Field(name)
		if f == nil || f.Internal {
			continue
		}
		row, err := c.Row(0, cls)
		if err != nil {
			return nil, err
		}
		ref := row.Ref
		switch p {
		case "get_":
			return snap.Value(row, f), nil
		case "set_":
			return nil, c.Update(func(tx *db.Tx) error { return tx.Set(f, ref, c.Args[1]) })
		case "add_to_":
			return nil, c.Update(func(tx *db.Tx) error { return tx.AddToMap(f, ref, c.String(1), c.Args[2]) })
		case "remove_from_":
			return nil, c.Update(func(tx *db.Tx) error { return tx.RemoveFromMap(f, ref, c.String(1)) })
		case "add_":
			return nil, c.Update(func(tx *db.Tx) error { return tx.AddToSet(f, ref, c.Args[1]) })
		case "remove_":
			return nil, c.Update(func(tx *db.Tx) error { return tx.RemoveFromSet(f, ref, c.Args[1]) })
		}
	}
	return nil, xerr.New(xerr.NotImplemented, m.Wire)
}

// implicitCreate makes a row from a constructor record: the fields a
// client may set at creation (RW and RO/constructor) come from the record
// or their defaults; the server's own fields (RO/runtime, and the runtime
// state listed in serverOwnedAtCreation) start at their defaults or empty.
// Fields in server (a handler's own choices) are set whatever their
// qualifier.
func (s *Server) implicitCreate(c *Call, cls *schema.Class, server map[string]any) (any, error) {
	rec, _ := c.Args[0].(map[string]any)
	fields := make(map[string]any, len(cls.Fields))
	for _, f := range cls.Fields {
		if f.Derived || f == cls.UUID {
			continue
		}
		v, given := rec[f.Name]
		switch {
		case serverOwnedAtCreate(f):
			// The server's own state (RO/runtime, and the RO/constructor
			// fields listed in serverOwnedAtCreation): what the caller
			// sent is ignored and the object starts as new.
			if v, ok := initialValue(f); ok {
				fields[f.Name] = v
			}
		case given:
			fields[f.Name] = v
		}
		if v, ok := server[f.Name]; ok {
			fields[f.Name] = v
		}
	}
	var ref string
	err := c.Update(func(tx *db.Tx) (err error) {
		ref, err = tx.Create(cls, "", fields)
		return err
	})
	return ref, err
}

func refs(rows []*db.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.Ref
	}
	return out
}

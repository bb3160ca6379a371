package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"toolstackd/internal/db"
)

// addDataSourceCommands registers the host-, vm- and sr-data-source-*
// commands (list, record, query, forget) over the data-source messages
// of the metrics module. As xapi's, they act on one object: the host,
// VM or SR the selectors pick; the list prints one record per data
// source with xapi's keys, and query prints the value as C's %f.
func (s *Server) addDataSourceCommands() {
	for _, k := range []struct {
		prefix, class string
		sel           selectorKind
		opts          selectOpts
	}{
		{"host", "host", hostSelector, selectOpts{}},
		{"vm", "VM", vmSelector, selectOpts{controlDomains: true}},
		{"sr", "SR", srSelector, selectOpts{}},
	} {
		one := func(c *Ctx, op func(row *db.Row) error) error {
			return c.eachSelected(k.sel, k.opts, false, func(row *db.Row, _ formatter) error { return op(row) })
		}
		s.register(k.prefix+"-data-source-list", "Lists the data sources the metrics module has for the "+k.class+
			": enabled ones are being recorded, standard ones are recorded by default.", func(c *Ctx) error {
			return one(c, func(row *db.Row) error {
				v, err := c.call(k.class+".get_data_sources", row.Ref)
				if err != nil {
					return err
				}
				list, _ := v.([]any)
				recs := make([][]field, 0, len(list))
				for _, item := range list {
					m, _ := item.(map[string]any)
					recs = append(recs, []field{
						{"name_label", fmt.Sprint(m["name_label"])},
						{"name_description", fmt.Sprint(m["name_description"])},
						{"enabled", fmt.Sprint(m["enabled"])},
						{"standard", fmt.Sprint(m["standard"])},
						{"min", ocamlFloat(m["min"])},
						{"max", ocamlFloat(m["max"])},
						{"units", fmt.Sprint(m["units"])},
					})
				}
				c.out.table(recs)
				return nil
			})
		})
		for _, v := range []struct{ cmd, msg, help string }{
			{"record", "record_data_source", "Starts recording a data source of the " + k.class + "."},
			{"forget", "forget_data_source_archives", "Stops recording a data source of the " + k.class + " and drops its history."},
		} {
			s.register(k.prefix+"-data-source-"+v.cmd, v.help, func(c *Ctx) error {
				name := c.require("data-source")
				return one(c, func(row *db.Row) error {
					_, err := c.call(k.class+"."+v.msg, row.Ref, name)
					return err
				})
			})
		}
		s.register(k.prefix+"-data-source-query", "Prints the newest 5 s value of a recorded data source of the "+k.class+".", func(c *Ctx) error {
			name := c.require("data-source")
			return one(c, func(row *db.Row) error {
				v, err := c.call(k.class+".query_data_source", row.Ref, name)
				if err != nil {
					return err
				}
				f, _ := v.(float64)
				c.out.list(strconv.FormatFloat(f, 'f', 6, 64))
				return nil
			})
		})
	}
}

// ocamlFloat prints a float as OCaml's string_of_float, which xapi's
// data-source list uses: up to 12 significant digits, a trailing "." on
// whole numbers, and inf, -inf and nan.
func ocamlFloat(v any) string {
	f, _ := v.(float64)
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	s := strconv.FormatFloat(f, 'g', 12, 64)
	if !strings.ContainsAny(s, ".e") {
		s += "."
	}
	return s
}

package rrd

import (
	"io"
	"math"
	"strconv"
)

// lastDSString is how the previous raw reading appears in a dump: the
// number, or "0.0" when unknown.
func appendLastDS(dst []byte, v Value) []byte {
	switch v.Kind {
	case Float:
		return appendFloat(dst, v.F)
	case Int:
		return strconv.AppendInt(dst, v.I, 10)
	}
	return append(dst, "0.0"...)
}

// truncSeconds is OCaml's int_of_float as xapi uses it for unknown_sec:
// truncation toward zero, and the x86-64 result for what cannot be
// represented.
func truncSeconds(f float64) int64 {
	if math.IsNaN(f) || f >= 9.223372036854775807e18 || f < -9.223372036854775808e18 {
		return math.MinInt64
	}
	return int64(f)
}

// AppendXML appends the RRD as an rrdtool XML dump, byte for byte as xapi
// writes it. internal adds each source's last_updated, which xapi writes
// only to its own archives (it makes a restored RRD continue exactly).
func (r *RRD) AppendXML(dst []byte, internal bool) []byte {
	o := xmlOut{b: append(dst, xmlDecl...)}
	o.start("rrd")
	o.elText("version", "0003")
	o.elInt("step", r.step)
	// Written as a whole number of seconds: XenCenter expects an integer.
	o.elInt("lastupdate", int64(r.lastUpdated))
	for i := range r.ds {
		d := &r.ds[i]
		o.start("ds")
		o.elText("name", d.Name)
		o.elText("type", d.Type.String())
		o.elFloat("minimal_heartbeat", d.Heartbeat)
		o.elFloat("min", d.Min)
		o.elFloat("max", d.Max)
		o.start("last_ds")
		o.flush()
		o.b = appendLastDS(o.b, d.last)
		o.end("last_ds")
		o.elFloat("value", d.value)
		o.elInt("unknown_sec", truncSeconds(d.unknownSec))
		if internal {
			o.elFloat("last_updated", d.lastUpdated)
		}
		o.end("ds")
	}
	for a := range r.rras {
		x := &r.rras[a]
		o.start("rra")
		o.elText("cf", x.CF.String())
		o.elInt("pdp_per_row", int64(x.PDPPerRow))
		o.start("params")
		o.elFloat("xff", x.XFF)
		o.end("params")
		o.start("cdp_prep")
		for i := range r.ds {
			o.start("ds")
			o.elText("primary_value", "0.0")
			o.elText("secondary_value", "0.0")
			o.elFloat("value", x.cdpValue[i])
			o.elInt("unknown_datapoints", x.cdpUnknown[i])
			o.end("ds")
		}
		o.end("cdp_prep")
		o.start("database")
		if len(r.ds) > 0 {
			// Oldest row first.
			for row := x.Rows - 1; row >= 0; row-- {
				o.start("row")
				for i := range r.ds {
					o.elFloat("v", x.peek(i, row))
				}
				o.end("row")
			}
		}
		o.end("database")
		o.end("rra")
	}
	o.end("rrd")
	return o.b
}

// WriteXML writes the rrdtool XML dump (see AppendXML).
func (r *RRD) WriteXML(w io.Writer, internal bool) error {
	_, err := w.Write(r.AppendXML(nil, internal))
	return err
}

func appendJSONFloat(dst []byte, f float64) []byte {
	dst = append(dst, '"')
	dst = appendFloat(dst, f)
	return append(dst, '"')
}

func appendJSONInt(dst []byte, i int64) []byte {
	dst = append(dst, '"')
	dst = strconv.AppendInt(dst, i, 10)
	return append(dst, '"')
}

// AppendJSON appends the RRD in xapi's JSON form (what /host_rrd returns
// when JSON is asked for): the XML dump's structure, compact, with every
// number written as a string and each source's last_updated always present.
func (r *RRD) AppendJSON(dst []byte) []byte {
	b := append(dst, `{"version":"0003","step":`...)
	b = appendJSONInt(b, r.step)
	b = append(b, `,"lastupdate":`...)
	b = appendJSONFloat(b, r.lastUpdated)
	b = append(b, `,"ds":[`...)
	for i := range r.ds {
		d := &r.ds[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"name":`...)
		b = appendJSONString(b, d.Name)
		b = append(b, `,"type":"`...)
		b = append(b, d.Type.String()...)
		b = append(b, `","minimal_heartbeat":`...)
		b = appendJSONFloat(b, d.Heartbeat)
		b = append(b, `,"min":`...)
		b = appendJSONFloat(b, d.Min)
		b = append(b, `,"max":`...)
		b = appendJSONFloat(b, d.Max)
		b = append(b, `,"last_ds":"`...)
		b = appendLastDS(b, d.last)
		b = append(b, `","value":`...)
		b = appendJSONFloat(b, d.value)
		b = append(b, `,"unknown_sec":`...)
		b = appendJSONFloat(b, d.unknownSec)
		b = append(b, `,"last_updated":`...)
		b = appendJSONFloat(b, d.lastUpdated)
		b = append(b, '}')
	}
	b = append(b, `],"rra":[`...)
	for a := range r.rras {
		x := &r.rras[a]
		if a > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"cf":"`...)
		b = append(b, x.CF.String()...)
		b = append(b, `","pdp_per_row":`...)
		b = appendJSONInt(b, int64(x.PDPPerRow))
		b = append(b, `,"params":{"xff":`...)
		b = appendJSONFloat(b, x.XFF)
		b = append(b, `},"cdp_prep":{"ds":[`...)
		for i := range r.ds {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"primary_value":"0.0","secondary_value":"0.0","value":`...)
			b = appendJSONFloat(b, x.cdpValue[i])
			b = append(b, `,"unknown_datapoints":`...)
			b = appendJSONInt(b, x.cdpUnknown[i])
			b = append(b, '}')
		}
		b = append(b, `]},"database":[`...)
		if len(r.ds) > 0 {
			for row := x.Rows - 1; row >= 0; row-- {
				if row != x.Rows-1 {
					b = append(b, ',')
				}
				b = append(b, '[')
				for i := range r.ds {
					if i > 0 {
						b = append(b, ',')
					}
					b = appendJSONFloat(b, x.peek(i, row))
				}
				b = append(b, ']')
			}
		}
		b = append(b, "]}"...)
	}
	return append(b, "]}"...)
}

// WriteJSON writes the JSON form (see AppendJSON).
func (r *RRD) WriteJSON(w io.Writer) error {
	_, err := w.Write(r.AppendJSON(nil))
	return err
}

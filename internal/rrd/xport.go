package rrd

import (
	"fmt"
	"io"
	"math"
	"time"
)

// Source is one RRD given to Export with the prefix its legend entries get:
// "host:<uuid>:", "vm:<uuid>:" or "sr:<uuid>:".
type Source struct {
	Prefix string
	RRD    *RRD
}

// XportRow is one row of an export: the time that ends the row and one value
// per legend entry.
type XportRow struct {
	T      int64
	Values []float64
}

// Xport is the answer to /rrd_updates, in rrdtool's xport shape.
type Xport struct {
	Start, Step, End int64
	// Legend names each column "<CF>:<prefix><data source>".
	Legend []string
	// Rows are newest first.
	Rows []XportRow
}

// ParseCFQuery reads /rrd_updates's cf parameter: an unknown or empty value
// means any consolidation function, as in xapi.
func ParseCFQuery(s string) CF {
	cf, err := ParseCF(s)
	if err != nil {
		return AnyCF
	}
	return cf
}

// Selection says which owners (VMs or SRs) /rrd_updates includes.
type Selection struct {
	All   bool
	UUIDs map[string]bool
}

// Has says whether the owner with this UUID is selected.
func (s Selection) Has(uuid string) bool { return s.All || s.UUIDs[uuid] }

// SelectOwners reads the values of a repeated vm_uuid or sr_uuid parameter.
// No value at all gives the default: all VMs (for backward compatibility)
// but no SRs, so pass defaultAll true for vm_uuid and false for sr_uuid.
// "all" selects every owner and "none" (like any UUID that matches nothing)
// adds none; several values select the union. This is the rule of xapi's
// design and of its releases; xapi's newest code, which added repeated
// values, dropped the "all" spelling, which looks like an oversight.
func SelectOwners(values []string, defaultAll bool) Selection {
	if len(values) == 0 {
		return Selection{All: defaultAll}
	}
	s := Selection{UUIDs: make(map[string]bool, len(values))}
	for _, v := range values {
		switch v {
		case "all":
			s.All = true
		case "none":
		default:
			s.UUIDs[v] = true
		}
	}
	return s
}

// SelectHost reads the host parameter: only "true" includes the host RRD.
func SelectHost(value string) bool { return value == "true" }

// bestArchives is xapi's find_best_rras: the indexes of the archives of rd
// (with the CF asked for, unless AnyCF) that should answer a query starting
// at start at a resolution of at least pdpInterval steps: the first archive
// that covers start and every archive of the same shape; failing that, the
// archives of the same shape as the longest one that still satisfy the
// resolution.
func bestArchives(rd *RRD, pdpInterval int64, cf CF, start int64) ([]int, error) {
	var cand []int
	for a := range rd.rras {
		if cf == AnyCF || rd.rras[a].CF == cf {
			cand = append(cand, a)
		}
	}
	if len(cand) == 0 {
		return nil, ErrNoRRA
	}
	lastPDP, _ := getTimes(rd.lastUpdated, rd.step)
	span := func(x *rra) int64 { return rd.step * int64(x.Rows) * int64(x.PDPPerRow) }
	covers := func(t int64, a int) bool {
		x := &rd.rras[a]
		return int64(x.PDPPerRow) >= pdpInterval && t > lastPDP-span(x)
	}
	sameShape := func(keep func(int) bool, like *rra) []int {
		var out []int
		for _, a := range cand {
			x := &rd.rras[a]
			if keep(a) && x.PDPPerRow == like.PDPPerRow && x.Rows == like.Rows {
				out = append(out, a)
			}
		}
		return out
	}
	for _, a := range cand {
		if covers(start, a) {
			return sameShape(func(int) bool { return true }, &rd.rras[a]), nil
		}
	}
	longest := &rd.rras[cand[len(cand)-1]]
	oldest := 1 + lastPDP - span(longest)
	var out []int
	for _, a := range cand {
		if covers(oldest, a) {
			out = append(out, a)
		}
	}
	return out, nil
}

// Export builds the /rrd_updates answer from several RRDs (xapi's
// Rrd_updates.create_multi). start is in Unix seconds; a negative start is
// relative to each RRD's last update, and the earliest wins. interval asks
// for rows at least that many seconds long. Every RRD should have the same
// step and archive layout and have been updated together: those whose step
// differs from the first's are left out, as are archives whose shape
// differs from the first chosen one. Times come from the first RRD. If any
// RRD has no archive with the CF asked for, the answer is ErrNoRRA, as in
// xapi. Columns follow the order of srcs; xapi lists the host, then VMs
// and SRs in hash-table order, so a caller wanting stable output sorts
// them (by UUID, say).
func Export(srcs []Source, start, interval int64, cf CF) (*Xport, error) {
	if len(srcs) == 0 {
		return nil, ErrNoRRA
	}
	for _, s := range srcs {
		if s.RRD == nil {
			return nil, fmt.Errorf("rrd: export source %q has no RRD", s.Prefix)
		}
	}
	step := srcs[0].RRD.step
	lastUpdated := srcs[0].RRD.lastUpdated
	pdpInterval := interval / step

	kept := make([]Source, 0, len(srcs))
	for _, s := range srcs {
		if s.RRD.step == step {
			kept = append(kept, s)
		}
	}
	from := int64(math.MaxInt64)
	for _, s := range kept {
		t := start
		if start < 0 {
			t = start + int64(s.RRD.lastUpdated)
		}
		from = min(from, t)
	}

	chosen := make([][]int, len(kept))
	var first *rra
	for k, s := range kept {
		idx, err := bestArchives(s.RRD, pdpInterval, cf, from)
		if err != nil {
			return nil, err
		}
		chosen[k] = idx
		if first == nil && len(idx) > 0 {
			first = &s.RRD.rras[idx[0]]
		}
	}
	if first == nil {
		return nil, ErrNoRRA
	}

	type column struct {
		x *rra
		i int
	}
	var cols []column
	var legend []string
	for k, s := range kept {
		for _, a := range chosen[k] {
			x := &s.RRD.rras[a]
			if x.PDPPerRow != first.PDPPerRow || x.Rows != first.Rows {
				continue
			}
			for i := range s.RRD.ds {
				legend = append(legend, x.CF.String()+":"+s.Prefix+s.RRD.ds[i].Name)
				cols = append(cols, column{x, i})
			}
		}
	}

	rowStep := step * int64(first.PDPPerRow)
	lastCDP, _ := getTimes(lastUpdated, rowStep)
	// xapi goes through a float here; integer division gives the same
	// result for every start that a float represents exactly, and no
	// undefined conversion for absurd ones.
	clamped := max(min(from, 1<<62), -(1 << 62))
	firstCDP := (clamped/rowStep)*rowStep + rowStep

	out := &Xport{Start: firstCDP, Step: rowStep, End: lastCDP, Legend: legend}
	for i := 0; i < first.Rows; i++ {
		t := lastCDP - int64(i)*rowStep
		if t < from {
			break
		}
		row := XportRow{T: t, Values: make([]float64, len(cols))}
		for c, col := range cols {
			row.Values[c] = col.x.peek(col.i, i)
		}
		out.Rows = append(out.Rows, row)
	}
	return out, nil
}

// AppendXML appends the export as rrdtool xport XML, byte for byte as xapi
// writes it.
func (x *Xport) AppendXML(dst []byte) []byte {
	o := xmlOut{b: append(dst, xmlDecl...)}
	o.start("xport")
	o.start("meta")
	o.elInt("start", x.Start)
	o.elInt("step", x.Step)
	o.elInt("end", x.End)
	o.elInt("rows", int64(len(x.Rows)))
	o.elInt("columns", int64(len(x.Legend)))
	o.start("legend")
	for _, l := range x.Legend {
		o.elText("entry", l)
	}
	o.end("legend")
	o.end("meta")
	o.start("data")
	for _, r := range x.Rows {
		o.start("row")
		o.elInt("t", r.T)
		for _, v := range r.Values {
			o.elFloat("v", v)
		}
		o.end("row")
	}
	o.end("data")
	o.end("xport")
	return o.b
}

// WriteXML writes the xport XML.
func (x *Xport) WriteXML(w io.Writer) error {
	_, err := w.Write(x.AppendXML(nil))
	return err
}

// AppendJSON appends the export in xapi's JSON form: the XML's structure,
// compact, every number a string, each row {"t":…,"values":[…]}.
func (x *Xport) AppendJSON(dst []byte) []byte {
	b := append(dst, `{"meta":{"start":`...)
	b = appendJSONInt(b, x.Start)
	b = append(b, `,"step":`...)
	b = appendJSONInt(b, x.Step)
	b = append(b, `,"end":`...)
	b = appendJSONInt(b, x.End)
	b = append(b, `,"rows":`...)
	b = appendJSONInt(b, int64(len(x.Rows)))
	b = append(b, `,"columns":`...)
	b = appendJSONInt(b, int64(len(x.Legend)))
	b = append(b, `,"legend":[`...)
	for i, l := range x.Legend {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, l)
	}
	b = append(b, `]},"data":[`...)
	for i, r := range x.Rows {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"t":`...)
		b = appendJSONInt(b, r.T)
		b = append(b, `,"values":[`...)
		for j, v := range r.Values {
			if j > 0 {
				b = append(b, ',')
			}
			b = appendJSONFloat(b, v)
		}
		b = append(b, "]}"...)
	}
	return append(b, "]}"...)
}

// WriteJSON writes the JSON form.
func (x *Xport) WriteJSON(w io.Writer) error {
	_, err := w.Write(x.AppendJSON(nil))
	return err
}

// Query returns the newest AVERAGE value of the named source from the
// first archive covering t (xapi's query_named_ds, behind
// host.query_data_source and the SR physical_utilisation poll).
func (r *RRD) Query(name string, t time.Time) (float64, error) {
	i := r.DSIndex(name)
	if i < 0 {
		return 0, fmt.Errorf("rrd: no data source %q", name)
	}
	idx, err := bestArchives(r, 0, Average, t.Unix())
	if err != nil {
		return 0, err
	}
	if len(idx) == 0 || r.rras[idx[0]].Rows == 0 {
		return 0, ErrNoRRA
	}
	return r.rras[idx[0]].peek(i, 0), nil
}

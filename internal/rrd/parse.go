package rrd

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// MaxXMLBytes bounds the rrdtool XML ParseXML reads. xapi's largest RRDs
// (a host with many devices) are a few MiB.
const MaxXMLBytes = 32 << 20

// maxText bounds one element's character data.
const maxText = 4096

// ParseXML reads an rrdtool XML dump as xapi writes it (and as PUT /rrd
// uploads one). It accepts what xapi's from_xml accepts, with its quirks:
// a source's min below zero is read as zero (and stored values below it
// become unknown), last_ds is ignored so a Derive source's next reading is
// unknown, a missing last_updated means the RRD's lastupdate, and when a
// name repeats only its last source is kept. It checks more than xapi: the
// input is bounded (MaxXMLBytes and the Max* limits), every archive must
// have one value per source in every row and one cdp_prep entry per source,
// and numbers must be in range; anything else is an error, never a panic.
func ParseXML(r io.Reader) (*RRD, error) { return parseXML(r, MaxXMLBytes) }

func parseXML(r io.Reader, limit int64) (*RRD, error) {
	lim := &io.LimitedReader{R: r, N: limit + 1}
	p := &xmlIn{d: xml.NewDecoder(lim)}
	p.d.Strict = true
	out, err := p.rrd()
	if lim.N <= 0 {
		return nil, fmt.Errorf("rrd: XML larger than %d bytes", limit)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// xmlIn reads an XML token stream with one token of look-ahead, skipping
// comments, processing instructions and whitespace between elements.
type xmlIn struct {
	d      *xml.Decoder
	peeked xml.Token
}

var errSyntax = errors.New("rrd: XML does not have the rrdtool dump structure")

func (p *xmlIn) raw() (xml.Token, error) {
	for {
		// RawToken is the cheaper tokenizer: it does not match end tags to
		// start tags or resolve namespaces, which the readers below do
		// themselves (every end tag is checked against the element it
		// closes, and prefixed names and attributes are refused).
		t, err := p.d.RawToken()
		if err != nil {
			if err == io.EOF {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("rrd: bad XML: %w", err)
		}
		switch t := t.(type) {
		case xml.Comment, xml.ProcInst:
			continue
		case xml.Directive:
			return nil, errors.New("rrd: XML directives (DOCTYPE) are not accepted")
		case xml.CharData:
			return t.Copy(), nil
		default:
			return t, nil
		}
	}
}

// next returns the next element start or end, skipping whitespace.
func (p *xmlIn) next() (xml.Token, error) {
	if p.peeked != nil {
		t := p.peeked
		p.peeked = nil
		return t, nil
	}
	for {
		t, err := p.raw()
		if err != nil {
			return nil, err
		}
		if cd, ok := t.(xml.CharData); ok {
			if len(bytes.TrimSpace(cd)) == 0 {
				continue
			}
			return nil, errSyntax
		}
		return t, nil
	}
}

func (p *xmlIn) peekStart(name string) (bool, error) {
	if p.peeked == nil {
		t, err := p.next()
		if err != nil {
			return false, err
		}
		p.peeked = t
	}
	s, ok := p.peeked.(xml.StartElement)
	return ok && s.Name.Local == name && s.Name.Space == "", nil
}

// start reads <name>, which like xapi's reader must have no attributes.
func (p *xmlIn) start(name string) error {
	t, err := p.next()
	if err != nil {
		return err
	}
	if s, ok := t.(xml.StartElement); !ok || s.Name.Local != name || s.Name.Space != "" || len(s.Attr) > 0 {
		return fmt.Errorf("rrd: expected <%s>", name)
	}
	return nil
}

func isEnd(t xml.Token, name string) bool {
	e, ok := t.(xml.EndElement)
	return ok && e.Name.Local == name && e.Name.Space == ""
}

func (p *xmlIn) end(name string) error {
	t, err := p.next()
	if err != nil {
		return err
	}
	if !isEnd(t, name) {
		return fmt.Errorf("rrd: expected </%s>", name)
	}
	return nil
}

// text reads <name>data</name> and returns the data without surrounding
// white space.
func (p *xmlIn) text(name string) (string, error) {
	if err := p.start(name); err != nil {
		return "", err
	}
	var sb strings.Builder
	for {
		t, err := p.raw()
		if err != nil {
			return "", err
		}
		switch t := t.(type) {
		case xml.CharData:
			if sb.Len()+len(t) > maxText {
				return "", fmt.Errorf("rrd: <%s> longer than %d bytes", name, maxText)
			}
			sb.Write(t)
		case xml.EndElement:
			if !isEnd(t, name) {
				return "", fmt.Errorf("rrd: expected </%s>", name)
			}
			return strings.TrimSpace(sb.String()), nil
		default:
			return "", fmt.Errorf("rrd: <%s> must hold only text", name)
		}
	}
}

func (p *xmlIn) float(name string) (float64, error) {
	s, err := p.text(name)
	if err != nil {
		return 0, err
	}
	f, err := parseFloat(s)
	if err != nil {
		return 0, fmt.Errorf("rrd: <%s>: %q is not a number", name, s)
	}
	return f, nil
}

func (p *xmlIn) int(name string, lo, hi int64) (int64, error) {
	s, err := p.text(name)
	if err != nil {
		return 0, err
	}
	i, err := strconv.ParseInt(s, 10, 64)
	if err != nil || i < lo || i > hi {
		return 0, fmt.Errorf("rrd: <%s>: %q is not an integer from %d to %d", name, s, lo, hi)
	}
	return i, nil
}

func validTime(name string, t float64) error {
	if !(t >= 0 && t < maxUnixSeconds) {
		return fmt.Errorf("rrd: <%s> out of range", name)
	}
	return nil
}

func (p *xmlIn) rrd() (*RRD, error) {
	if err := p.start("rrd"); err != nil {
		return nil, err
	}
	if _, err := p.text("version"); err != nil {
		return nil, err
	}
	step, err := p.int("step", 1, MaxStep)
	if err != nil {
		return nil, err
	}
	last, err := p.float("lastupdate")
	if err != nil {
		return nil, err
	}
	if err := validTime("lastupdate", last); err != nil {
		return nil, err
	}
	r := &RRD{step: step, lastUpdated: last}
	for {
		ok, err := p.peekStart("ds")
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		if len(r.ds) >= MaxDS {
			return nil, fmt.Errorf("rrd: more than %d data sources", MaxDS)
		}
		d, err := p.ds(last)
		if err != nil {
			return nil, err
		}
		r.ds = append(r.ds, d)
	}
	cells := 0
	for {
		ok, err := p.peekStart("rra")
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		if len(r.rras) >= MaxRRAs {
			return nil, fmt.Errorf("rrd: more than %d archives", MaxRRAs)
		}
		x, err := p.rra(r.ds, MaxCells-cells)
		if err != nil {
			return nil, fmt.Errorf("rrd: archive %d: %w", len(r.rras), err)
		}
		cells += len(x.data)
		r.rras = append(r.rras, x)
	}
	if err := p.end("rrd"); err != nil {
		return nil, err
	}
	r.dropRepeatedNames()
	r.sizeScratch()
	return r, nil
}

func (p *xmlIn) ds(rrdLast float64) (dsState, error) {
	var d dsState
	if err := p.start("ds"); err != nil {
		return d, err
	}
	name, err := p.text("name")
	if err != nil {
		return d, err
	}
	ty, err := p.text("type")
	if err != nil {
		return d, err
	}
	d.Name = name
	if d.Type, err = ParseDSType(ty); err != nil {
		return d, err
	}
	if d.Heartbeat, err = p.float("minimal_heartbeat"); err != nil {
		return d, err
	}
	if d.Min, err = p.float("min"); err != nil {
		return d, err
	}
	// xapi's CA-408126: older RRDs have min -infinity where the data can
	// only be positive; reading min as at least zero hides bad history.
	d.Min = ocamlMax(d.Min, 0)
	if d.Max, err = p.float("max"); err != nil {
		return d, err
	}
	if _, err = p.text("last_ds"); err != nil {
		return d, err
	}
	if d.value, err = p.float("value"); err != nil {
		return d, err
	}
	if d.unknownSec, err = p.float("unknown_sec"); err != nil {
		return d, err
	}
	d.lastUpdated = rrdLast
	ok, err := p.peekStart("last_updated")
	if err != nil {
		return d, err
	}
	if ok {
		if d.lastUpdated, err = p.float("last_updated"); err != nil {
			return d, err
		}
		if err := validTime("last_updated", d.lastUpdated); err != nil {
			return d, err
		}
	}
	if err := p.end("ds"); err != nil {
		return d, err
	}
	if err := validDS(d.DS); err != nil {
		return d, err
	}
	return d, nil
}

func (p *xmlIn) rra(dss []dsState, cellBudget int) (rra, error) {
	var x rra
	if err := p.start("rra"); err != nil {
		return x, err
	}
	if err := p.rraHead(&x); err != nil {
		return x, err
	}
	n := len(dss)
	if err := p.cdpPrep(&x, n); err != nil {
		return x, err
	}
	rows, nrows, err := p.database(dss, cellBudget)
	if err != nil {
		return x, err
	}
	if err := p.end("rra"); err != nil {
		return x, err
	}
	if n > 0 && nrows == 0 {
		return x, errors.New("rrd: archive has no rows")
	}
	x.Rows = nrows
	x.data = make([]float32, n*nrows)
	x.cur = make([]int32, n)
	for i := range n {
		x.cur[i] = int32(nrows - 1)
		for j := range nrows {
			x.data[i*nrows+j] = rows[j*n+i]
		}
	}
	return x, nil
}

// rraHead reads an archive's consolidation function, steps per row and
// xff.
func (p *xmlIn) rraHead(x *rra) error {
	cf, err := p.text("cf")
	if err != nil {
		return err
	}
	if x.CF, err = ParseCF(cf); err != nil {
		return err
	}
	pdp, err := p.int("pdp_per_row", 1, MaxPDPPerRow)
	if err != nil {
		return err
	}
	x.PDPPerRow = int(pdp)
	if err := p.start("params"); err != nil {
		return err
	}
	if x.XFF, err = p.float("xff"); err != nil {
		return err
	}
	if !(x.XFF >= 0 && x.XFF <= 1) {
		return errors.New("rrd: xff must be between 0 and 1")
	}
	return p.end("params")
}

// cdpPrep reads an archive's row in progress: one entry for each of the
// n data sources.
func (p *xmlIn) cdpPrep(x *rra, n int) error {
	if err := p.start("cdp_prep"); err != nil {
		return err
	}
	for {
		ok, err := p.peekStart("ds")
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if len(x.cdpValue) >= n {
			return errors.New("rrd: more cdp_prep entries than data sources")
		}
		if err := p.start("ds"); err != nil {
			return err
		}
		if _, err := p.text("primary_value"); err != nil {
			return err
		}
		if _, err := p.text("secondary_value"); err != nil {
			return err
		}
		v, err := p.float("value")
		if err != nil {
			return err
		}
		u, err := p.int("unknown_datapoints", 0, MaxPDPPerRow)
		if err != nil {
			return err
		}
		if err := p.end("ds"); err != nil {
			return err
		}
		x.cdpValue = append(x.cdpValue, v)
		x.cdpUnknown = append(x.cdpUnknown, u)
	}
	if err := p.end("cdp_prep"); err != nil {
		return err
	}
	if len(x.cdpValue) != n {
		return fmt.Errorf("rrd: %d cdp_prep entries for %d data sources", len(x.cdpValue), n)
	}
	return nil
}

// database reads an archive's rows, oldest first, a value for each data
// source (one outside its source's range is unknown), within cellBudget
// values; it returns them row by row and how many rows there were.
func (p *xmlIn) database(dss []dsState, cellBudget int) ([]float32, int, error) {
	n := len(dss)
	if err := p.start("database"); err != nil {
		return nil, 0, err
	}
	var rows []float32
	nrows := 0
	for {
		ok, err := p.peekStart("row")
		if err != nil {
			return nil, 0, err
		}
		if !ok {
			break
		}
		if nrows >= MaxRows {
			return nil, 0, fmt.Errorf("rrd: more than %d rows", MaxRows)
		}
		if len(rows)+n > cellBudget {
			return nil, 0, fmt.Errorf("rrd: more than %d stored values", MaxCells)
		}
		if rows, err = p.row(dss, rows); err != nil {
			return nil, 0, err
		}
		nrows++
	}
	return rows, nrows, p.end("database")
}

// row reads one row's values onto rows.
func (p *xmlIn) row(dss []dsState, rows []float32) ([]float32, error) {
	if err := p.start("row"); err != nil {
		return rows, err
	}
	got := 0
	for {
		ok, err := p.peekStart("v")
		if err != nil {
			return rows, err
		}
		if !ok {
			break
		}
		if got >= len(dss) {
			return rows, errors.New("rrd: a row has more values than data sources")
		}
		v, err := p.float("v")
		if err != nil {
			return rows, err
		}
		d := &dss[got].DS
		if v < d.Min || v > d.Max {
			v = math.NaN()
		}
		rows = append(rows, float32(v))
		got++
	}
	if got != len(dss) {
		return rows, fmt.Errorf("rrd: a row has %d values for %d data sources", got, len(dss))
	}
	return rows, p.end("row")
}

// dropRepeatedNames keeps only the last source of each name, as xapi's
// from_xml does by removing the first of a repeated name until one is left.
// It compacts in one pass so that a hostile upload full of repeats costs
// linear time.
func (r *RRD) dropRepeatedNames() {
	lastAt := make(map[string]int, len(r.ds))
	for i := range r.ds {
		lastAt[r.ds[i].Name] = i
	}
	if len(lastAt) == len(r.ds) {
		return
	}
	keep := make([]int, 0, len(lastAt))
	for i := range r.ds {
		if lastAt[r.ds[i].Name] == i {
			keep = append(keep, i)
		}
	}
	ds := make([]dsState, len(keep))
	for k, i := range keep {
		ds[k] = r.ds[i]
	}
	r.ds = ds
	for a := range r.rras {
		x := &r.rras[a]
		data := make([]float32, len(keep)*x.Rows)
		cur := make([]int32, len(keep))
		cv := make([]float64, len(keep))
		cu := make([]int64, len(keep))
		for k, i := range keep {
			copy(data[k*x.Rows:(k+1)*x.Rows], x.data[i*x.Rows:(i+1)*x.Rows])
			cur[k], cv[k], cu[k] = x.cur[i], x.cdpValue[i], x.cdpUnknown[i]
		}
		x.data, x.cur, x.cdpValue, x.cdpUnknown = data, cur, cv, cu
	}
}

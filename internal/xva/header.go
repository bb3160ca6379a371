// Package xva reads and writes xapi's XVA format, the archive a VM is
// exported as and imported from, and serves it over HTTP:
//
//	GET /export?uuid=|ref=[&use_compression=true|gzip|zstd][&task_id=]
//	GET /export_metadata?uuid=|ref=|all=true[&export_snapshots=][&include_vhd_parents=]
//	PUT /import?[sr_id=|sr_uuid=][&restore=][&force=][&task_id=]
//
// and through VM.import (an archive fetched from an http(s) URL).
//
// An XVA is a tar (ustar) archive, compressed whole with gzip or zstd or
// not at all. Its first member is ova.xml: one XML-RPC value, a struct
// with "version" (who exported it: hostname, date, product_version,
// product_brand, build_number, xapi_major, xapi_minor, export_vsn) and
// "objects", an array of {class, id, snapshot} where snapshot is the
// object's record with every reference to another exported object
// replaced by that object's id ("Ref:12") and references to anything
// else by OpaqueRef:NULL. Then come the disks, one after another in the
// order of their ids compared as strings: each disk is cut into 1 MiB
// blocks, and block n is the member "<id>/<n as 8 digits>" followed by
// its checksum "<id>/<n>.xxhash" (XXH64 as 16 upper-case hex digits) or,
// from older exporters, "<id>/<n>.checksum" (SHA-1 in lower-case hex).
// Blocks that hold only zeroes are left out, except the first and the
// last, so that a reader always knows where a disk ends. A block of
// length 0 carries nothing (xapi sends them to keep a slow connection
// alive) and is skipped.
//
// The format part of the package (Header, Reader, Writer) is pure and
// bounded: ova.xml is capped at MaxOVASize and MaxObjects, a block at
// BlockSize, a disk at the size its VDI record declares; the service part
// (Service) builds records and moves disk contents through the storage
// layer.
package xva

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"toolstackd/internal/api"
	"toolstackd/internal/api/wire"
)

const (
	// OVAName is the name of the archive's first member.
	OVAName = "ova.xml"
	// BlockSize is the size of every disk block but a disk's last.
	BlockSize = 1 << 20
	// MaxOVASize bounds ova.xml: the metadata of a VM with many
	// snapshots fits many times over.
	MaxOVASize = 32 << 20
	// MaxObjects bounds the objects ova.xml may describe. An export
	// holds a VM, its VBDs, VDIs and VIFs, their SRs and networks (xapi
	// adds the host, the VM's metrics records, vGPUs and vTPMs) and,
	// with its snapshots, the same again for each snapshot: a VM with 16
	// disks, 7 NICs and 100 snapshots is about 4,500 objects. The bound
	// is over twice that; an archive over it is refused while ova.xml is
	// read (countObjects), before any object is decoded.
	MaxObjects = 10000
	// ExportVsn is the archive version we write: 2, as xapi writes, with
	// a checksum after every block.
	ExportVsn = 2
)

// Version says who made an archive.
type Version struct {
	Hostname       string
	Date           string
	ProductVersion string
	ProductBrand   string
	BuildNumber    string
	XapiMajor      int64
	XapiMinor      int64
	// ExportVsn is 0 for archives from before checksums were written.
	ExportVsn int64
}

// Object is one exported record: its class (as the datamodel spells it,
// "VM", "VDI"...), its id within the archive ("Ref:3") and its record in
// XML-RPC's neutral values (see package wire).
type Object struct {
	Class    string
	ID       string
	Snapshot map[string]any
}

// Header is ova.xml.
type Header struct {
	Version Version
	Objects []Object
}

// Find returns the object with the given id, or nil. It scans the
// objects: to look many ids up, use an index (see planImport).
func (h *Header) Find(id string) *Object {
	for i := range h.Objects {
		if h.Objects[i].ID == id {
			return &h.Objects[i]
		}
	}
	return nil
}

// Encode writes the header as xapi writes ova.xml: a lone XML-RPC value.
func (h *Header) Encode() []byte {
	objs := make([]any, len(h.Objects))
	for i, o := range h.Objects {
		snap := o.Snapshot
		if snap == nil {
			snap = map[string]any{}
		}
		objs[i] = map[string]any{"class": o.Class, "id": o.ID, "snapshot": snap}
	}
	v := h.Version
	top := map[string]any{
		"version": map[string]any{
			"hostname": v.Hostname, "date": v.Date, "product_version": v.ProductVersion,
			"product_brand": v.ProductBrand, "build_number": v.BuildNumber,
			// Written as <i4>, as xapi writes them (an int64 would go as a
			// string).
			"xapi_major": wire.Int32(clamp32(v.XapiMajor)), "xapi_minor": wire.Int32(clamp32(v.XapiMinor)),
			"export_vsn": wire.Int32(clamp32(v.ExportVsn)),
		},
		"objects": objs,
	}
	return []byte(wire.XMLValueFragment(top))
}

// DecodeHeader reads ova.xml. Errors describe what is wrong in words; the
// service turns them into IMPORT_ERROR.
func DecodeHeader(b []byte) (*Header, error) {
	if len(b) > MaxOVASize {
		return nil, fmt.Errorf("%s is larger than %d bytes", OVAName, MaxOVASize)
	}
	b = bytes.TrimSpace(b)
	// An XML declaration may open the document; it cannot stay inside
	// the methodCall the value is wrapped in below.
	if bytes.HasPrefix(b, []byte("<?xml")) {
		end := bytes.Index(b, []byte("?>"))
		if end < 0 {
			return nil, errors.New("unterminated XML declaration")
		}
		b = b[end+2:]
	}
	// The objects are counted first, from the markup alone: a header
	// over the bound is refused before its values are built.
	if err := countObjects(b); err != nil {
		return nil, err
	}
	// The value is read by the XML-RPC request decoder, which is bounded
	// in depth and hardened against hostile input: wrapped as the one
	// parameter of a call.
	var doc bytes.Buffer
	doc.Grow(len(b) + 100)
	doc.WriteString("<methodCall><methodName>ova</methodName><params><param>")
	doc.Write(b)
	doc.WriteString("</param></params></methodCall>")
	_, params, err := wire.DecodeXMLRequest(&doc)
	if err != nil {
		return nil, fmt.Errorf("%s is not an XML-RPC value: %v", OVAName, err)
	}
	if len(params) != 1 {
		return nil, fmt.Errorf("%s holds %d values, not one", OVAName, len(params))
	}
	top, ok := params[0].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s is not a struct", OVAName)
	}
	h := &Header{}
	if v, ok := top["version"].(map[string]any); ok {
		h.Version = Version{
			Hostname: str(v["hostname"]), Date: str(v["date"]), ProductVersion: str(v["product_version"]),
			ProductBrand: str(v["product_brand"]), BuildNumber: str(v["build_number"]),
			XapiMajor: num(v["xapi_major"]), XapiMinor: num(v["xapi_minor"]), ExportVsn: num(v["export_vsn"]),
		}
	} else {
		return nil, fmt.Errorf("%s has no version struct", OVAName)
	}
	objs, ok := top["objects"].([]any)
	if !ok {
		return nil, fmt.Errorf("%s has no objects array", OVAName)
	}
	if len(objs) > MaxObjects {
		return nil, fmt.Errorf("%s describes %d objects, more than %d objects", OVAName, len(objs), MaxObjects)
	}
	seen := make(map[string]bool, len(objs))
	h.Objects = make([]Object, 0, len(objs))
	for i, x := range objs {
		m, ok := x.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("object %d is not a struct", i)
		}
		o := Object{Class: str(m["class"]), ID: str(m["id"])}
		o.Snapshot, ok = m["snapshot"].(map[string]any)
		switch {
		case !ok:
			return nil, fmt.Errorf("object %d has no snapshot struct", i)
		case o.Class == "" || o.ID == "":
			return nil, fmt.Errorf("object %d has no class or id", i)
		case len(o.ID) > 255:
			return nil, fmt.Errorf("object %d has an id of %d bytes", i, len(o.ID))
		case seen[o.ID]:
			return nil, fmt.Errorf("object id %q appears twice", clip(o.ID))
		}
		seen[o.ID] = true
		h.Objects = append(h.Objects, o)
	}
	return h, nil
}

// countObjects reads ova.xml's markup, builds none of its values, and
// fails as soon as the objects array of its top-level struct has more than
// MaxObjects entries. Markup it cannot read it leaves to the decoder,
// which reads the same tokens and says what is wrong.
func countObjects(b []byte) error {
	// The path to an object: the top <value>, its <struct>, a <member>
	// named "objects", its <value>, <array>, <data>, then one <value> per
	// object. matched counts the open elements, from the top, that are
	// on it.
	path := [...]string{"value", "struct", "member", "value", "array", "data", "value"}
	d := xml.NewDecoder(bytes.NewReader(b))
	d.Strict = true
	depth, matched, n := 0, 0, 0
	var name []byte // the text of the member's <name>
	inName, isObjects := false, false
	for {
		tok, err := d.RawToken()
		if err != nil {
			return nil // the end, or the decoder's to report
		}
		switch t := tok.(type) {
		case xml.StartElement:
			depth++
			if matched == depth-1 && depth <= len(path) && t.Name.Local == path[depth-1] {
				matched = depth
			}
			switch {
			case depth == 3 && matched == 3: // a member of the top struct
				name = name[:0]
			case depth == 4 && matched == 3 && t.Name.Local == "name":
				inName = true
			case depth == 4 && matched == 4: // the member's value
				isObjects = string(name) == "objects"
			case depth == len(path) && matched == depth && isObjects:
				if n++; n > MaxObjects {
					return fmt.Errorf("%s describes more than %d objects", OVAName, MaxObjects)
				}
			}
		case xml.EndElement:
			if depth == 0 {
				return nil // an end with no start: the decoder's to report
			}
			if matched == depth {
				matched--
			}
			depth--
			inName = false
		case xml.CharData:
			switch {
			case !inName:
			case len(name)+len(t) <= len("objects"):
				name = append(name, t...)
			default:
				name = append(name[:0], '?') // longer: another member
			}
		}
	}
}

func clamp32(n int64) int32 { return int32(max(min(n, math.MaxInt32), math.MinInt32)) }

func str(v any) string { s, _ := v.(string); return s }

// num reads an integer that xapi writes as <int> or, for 64-bit values,
// as a string.
func num(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(strings.TrimSpace(x), 10, 64)
		return n
	}
	return 0
}

// clip shortens text taken from an archive for an error message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// ThisVersion is the version record of archives we write: the xapi
// version we speak for (an xapi refuses archives from a newer one).
func ThisVersion(hostname string) Version {
	var major, minor int64
	parts := strings.SplitN(api.XapiVersion, ".", 3)
	major = num(parts[0])
	if len(parts) > 1 {
		minor = num(parts[1])
	}
	return Version{
		Hostname: hostname, Date: time.Now().UTC().Format("2006-01-02"), ProductVersion: api.ProductVersion,
		ProductBrand: "toolstackd", BuildNumber: "0", XapiMajor: major, XapiMinor: minor, ExportVsn: ExportVsn,
	}
}

// DiskOrder sorts disk ids in the order their data comes in an archive:
// as strings, as xapi sorts them ("Ref:10" before "Ref:9").
func DiskOrder(ids []string) { sort.Strings(ids) }

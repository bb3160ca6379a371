package wire

// Preencoder is an Encoder that can take a value encoded earlier, so that
// a reply many clients receive at once (the same event.from batch) is
// encoded once per transport and copied after that.
type Preencoder interface {
	Encoder
	// Kind names the encoding ("xml" or "json"): bytes made by one
	// encoder may be given to another of the same kind.
	Kind() string
	// EncodeAlone encodes v as a single value with a new encoder of the
	// same kind and returns the bytes.
	EncodeAlone(v any) []byte
	// AppendAlone is EncodeAlone appending to dst instead of making a
	// new buffer: the same bytes, for callers that reuse their scratch.
	AppendAlone(dst []byte, v any) []byte
	// Preencoded writes one complete value made by EncodeAlone or
	// AppendAlone.
	Preencoded(b []byte)
}

var (
	_ Preencoder = (*XMLEncoder)(nil)
	_ Preencoder = (*JSONEncoder)(nil)
)

// Kind is "xml".
func (e *XMLEncoder) Kind() string { return "xml" }

// Kind is "json".
func (e *JSONEncoder) Kind() string { return "json" }

// EncodeAlone encodes v on its own in XML-RPC.
func (e *XMLEncoder) EncodeAlone(v any) []byte { return e.AppendAlone(nil, v) }

// EncodeAlone encodes v on its own in JSON.
func (e *JSONEncoder) EncodeAlone(v any) []byte { return e.AppendAlone(nil, v) }

// AppendAlone appends v, encoded on its own in XML-RPC, to dst.
func (e *XMLEncoder) AppendAlone(dst []byte, v any) []byte {
	x := &XMLEncoder{sink: sink{buf: dst}}
	x.nest.init()
	Encode(x, v)
	return x.buf
}

// AppendAlone appends v, encoded on its own in JSON, to dst.
func (e *JSONEncoder) AppendAlone(dst []byte, v any) []byte {
	j := &JSONEncoder{sink: sink{buf: dst}}
	j.nest.init()
	Encode(j, v)
	return j.buf
}

// Preencoded writes a value made by EncodeAlone or AppendAlone.
func (e *XMLEncoder) Preencoded(b []byte) {
	e.begin()
	e.buf = append(e.buf, b...)
	e.end()
}

// Preencoded writes a value made by EncodeAlone or AppendAlone.
func (e *JSONEncoder) Preencoded(b []byte) {
	e.begin()
	e.buf = append(e.buf, b...)
	e.end()
}

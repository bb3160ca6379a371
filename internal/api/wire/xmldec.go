package wire

import (
	"encoding/base64"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// MaxDepth is how deeply arrays and structs may nest in a request. A
// parameter that is an array of structs has depth 2.
const MaxDepth = 64

// DecodeError reports a request that cannot be decoded.
type DecodeError struct {
	Msg string
}

func (e *DecodeError) Error() string { return "wire: " + e.Msg }

func decodeErrorf(format string, args ...any) *DecodeError {
	return &DecodeError{Msg: fmt.Sprintf(format, args...)}
}

// DecodeXMLRequest reads an XML-RPC methodCall. See the package
// documentation for what is accepted.
func DecodeXMLRequest(r io.Reader) (method string, params []any, err error) {
	d := xml.NewDecoder(r)
	d.Strict = true
	d.CharsetReader = charsetReader
	p := xmlParser{d: d}
	method, params, err = p.call()
	if err != nil {
		var de *DecodeError
		if !errors.As(err, &de) {
			err = decodeErrorf("malformed XML at byte %d: %v", d.InputOffset(), err)
		}
		return "", nil, err
	}
	return method, params, nil
}

// charsetReader lets through the declared encodings that are UTF-8 on the
// wire and refuses the rest.
func charsetReader(label string, in io.Reader) (io.Reader, error) {
	switch strings.ToLower(label) {
	case "utf8", "us-ascii", "ascii":
		return in, nil
	}
	return nil, decodeErrorf("unsupported XML encoding %q", label)
}

type xmlParser struct {
	d   *xml.Decoder
	eof bool
	// text collects character data; it is reused between values.
	text []byte
}

// next returns the next token that matters: start and end elements and
// character data. Comments, processing instructions and directives are
// skipped. Character data is only valid until the following call.
func (p *xmlParser) next() (xml.Token, error) {
	for {
		tok, err := p.d.RawToken()
		if err == io.EOF {
			if p.eof {
				return nil, io.EOF
			}
			return nil, &DecodeError{Msg: "unexpected end of input"}
		}
		if err != nil {
			return nil, err
		}
		switch tok.(type) {
		case xml.StartElement, xml.EndElement, xml.CharData:
			return tok, nil
		}
	}
}

// element returns the next start or end element, skipping whitespace.
func (p *xmlParser) element() (xml.Token, error) {
	for {
		tok, err := p.next()
		if err != nil {
			return nil, err
		}
		if cd, ok := tok.(xml.CharData); ok {
			if !isXMLSpace(cd) {
				return nil, decodeErrorf("unexpected text %q", truncate(cd))
			}
			continue
		}
		return tok, nil
	}
}

func (p *xmlParser) start(name string) error {
	tok, err := p.element()
	if err != nil {
		return err
	}
	if se, ok := tok.(xml.StartElement); !ok || se.Name.Local != name {
		return decodeErrorf("got %s, want <%s>", describe(tok), name)
	}
	return nil
}

func (p *xmlParser) end(name string) error {
	tok, err := p.element()
	if err != nil {
		return err
	}
	if ee, ok := tok.(xml.EndElement); !ok || ee.Name.Local != name {
		return decodeErrorf("got %s, want </%s>", describe(tok), name)
	}
	return nil
}

// chars reads the character data up to </name>; child elements are errors.
func (p *xmlParser) chars(name string) (string, error) {
	p.text = p.text[:0]
	for {
		tok, err := p.next()
		if err != nil {
			return "", err
		}
		switch t := tok.(type) {
		case xml.CharData:
			p.text = append(p.text, t...)
		case xml.EndElement:
			if t.Name.Local != name {
				return "", decodeErrorf("got %s, want </%s>", describe(tok), name)
			}
			return string(p.text), nil
		default:
			return "", decodeErrorf("unexpected %s inside <%s>", describe(tok), name)
		}
	}
}

func (p *xmlParser) call() (string, []any, error) {
	p.eof = true // only here and after </methodCall> may the input end
	tok, err := p.element()
	p.eof = false
	if err == io.EOF {
		return "", nil, &DecodeError{Msg: "empty request"}
	}
	if err != nil {
		return "", nil, err
	}
	if se, ok := tok.(xml.StartElement); !ok || se.Name.Local != "methodCall" {
		return "", nil, decodeErrorf("root is %s, want <methodCall>", describe(tok))
	}
	if err := p.start("methodName"); err != nil {
		return "", nil, err
	}
	method, err := p.chars("methodName")
	if err != nil {
		return "", nil, err
	}
	if method = trimXMLSpace(method); method == "" {
		return "", nil, &DecodeError{Msg: "empty methodName"}
	}
	params := []any{}
	tok, err = p.element()
	if err != nil {
		return "", nil, err
	}
	if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "params" {
		for {
			tok, err := p.element()
			if err != nil {
				return "", nil, err
			}
			if ee, ok := tok.(xml.EndElement); ok && ee.Name.Local == "params" {
				break
			}
			if se, ok := tok.(xml.StartElement); !ok || se.Name.Local != "param" {
				return "", nil, decodeErrorf("got %s, want <param>", describe(tok))
			}
			if err := p.start("value"); err != nil {
				return "", nil, err
			}
			v, err := p.value(0)
			if err != nil {
				return "", nil, err
			}
			params = append(params, v)
			if err := p.end("param"); err != nil {
				return "", nil, err
			}
		}
		if tok, err = p.element(); err != nil {
			return "", nil, err
		}
	}
	if ee, ok := tok.(xml.EndElement); !ok || ee.Name.Local != "methodCall" {
		return "", nil, decodeErrorf("got %s, want </methodCall>", describe(tok))
	}
	p.eof = true
	if tok, err := p.element(); err != io.EOF {
		if err != nil {
			return "", nil, err
		}
		return "", nil, decodeErrorf("unexpected %s after </methodCall>", describe(tok))
	}
	return method, params, nil
}

// value parses the content of a <value> whose start tag has been read, up
// to and including </value>. depth counts the enclosing containers.
func (p *xmlParser) value(depth int) (any, error) {
	p.text = p.text[:0]
	for {
		tok, err := p.next()
		if err != nil {
			return nil, err
		}
		switch t := tok.(type) {
		case xml.CharData:
			p.text = append(p.text, t...)
		case xml.EndElement:
			if t.Name.Local != "value" {
				return nil, decodeErrorf("got %s, want </value>", describe(tok))
			}
			// The whole content is text: an untyped string, untrimmed.
			return string(p.text), nil
		case xml.StartElement:
			if !isXMLSpace(p.text) {
				return nil, decodeErrorf("text %q before <%s> in <value>", truncate(p.text), t.Name.Local)
			}
			v, err := p.typed(t.Name.Local, depth)
			if err != nil {
				return nil, err
			}
			return v, p.end("value")
		}
	}
}

// typed parses a type element whose start tag has been read, up to and
// including its end tag.
func (p *xmlParser) typed(tag string, depth int) (any, error) {
	switch tag {
	case "string":
		return p.chars(tag)
	case "int", "i4", "i8":
		s, err := p.chars(tag)
		if err != nil {
			return nil, err
		}
		n, err := strconv.ParseInt(trimXMLSpace(s), 10, 64)
		if err != nil {
			return nil, decodeErrorf("bad <%s> %q", tag, truncate([]byte(s)))
		}
		return n, nil
	case "double":
		s, err := p.chars(tag)
		if err != nil {
			return nil, err
		}
		f, err := strconv.ParseFloat(trimXMLSpace(s), 64)
		if err != nil && !(errors.Is(err, strconv.ErrRange) && !math.IsInf(f, 0)) {
			return nil, decodeErrorf("bad <double> %q", truncate([]byte(s)))
		}
		return f, nil
	case "boolean":
		s, err := p.chars(tag)
		if err != nil {
			return nil, err
		}
		switch strings.ToLower(trimXMLSpace(s)) {
		case "1", "true":
			return true, nil
		case "0", "false":
			return false, nil
		}
		return nil, decodeErrorf("bad <boolean> %q", truncate([]byte(s)))
	case "dateTime.iso8601":
		s, err := p.chars(tag)
		if err != nil {
			return nil, err
		}
		t, ok := parseDateTime(trimXMLSpace(s))
		if !ok {
			// Not a request error: xapi fails only a call that reads the
			// value (the Go SDK writes 111T0:0:0 into fields no
			// constructor reads).
			return InvalidDateTime(truncate([]byte(s))), nil
		}
		return t, nil
	case "base64":
		s, err := p.chars(tag)
		if err != nil {
			return nil, err
		}
		return decodeBase64(s)
	case "nil":
		s, err := p.chars(tag)
		if err != nil {
			return nil, err
		}
		if !isXMLSpace([]byte(s)) {
			return nil, decodeErrorf("text inside <nil>")
		}
		return nil, nil
	case "array":
		return p.array(depth + 1)
	case "struct":
		return p.structure(depth + 1)
	}
	return nil, decodeErrorf("unknown type <%s>", tag)
}

func (p *xmlParser) array(depth int) (any, error) {
	if depth > MaxDepth {
		return nil, decodeErrorf("values nested deeper than %d", MaxDepth)
	}
	items := []any{}
	tok, err := p.element()
	if err != nil {
		return nil, err
	}
	if ee, ok := tok.(xml.EndElement); ok && ee.Name.Local == "array" {
		return items, nil // <array/>
	}
	if se, ok := tok.(xml.StartElement); !ok || se.Name.Local != "data" {
		return nil, decodeErrorf("got %s, want <data>", describe(tok))
	}
	for {
		tok, err := p.element()
		if err != nil {
			return nil, err
		}
		if ee, ok := tok.(xml.EndElement); ok && ee.Name.Local == "data" {
			break
		}
		if se, ok := tok.(xml.StartElement); !ok || se.Name.Local != "value" {
			return nil, decodeErrorf("got %s, want <value>", describe(tok))
		}
		v, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		items = append(items, v)
	}
	return items, p.end("array")
}

func (p *xmlParser) structure(depth int) (any, error) {
	if depth > MaxDepth {
		return nil, decodeErrorf("values nested deeper than %d", MaxDepth)
	}
	m := map[string]any{}
	for {
		tok, err := p.element()
		if err != nil {
			return nil, err
		}
		if ee, ok := tok.(xml.EndElement); ok && ee.Name.Local == "struct" {
			return m, nil
		}
		if se, ok := tok.(xml.StartElement); !ok || se.Name.Local != "member" {
			return nil, decodeErrorf("got %s, want <member>", describe(tok))
		}
		if err := p.start("name"); err != nil {
			return nil, err
		}
		name, err := p.chars("name")
		if err != nil {
			return nil, err
		}
		if err := p.start("value"); err != nil {
			return nil, err
		}
		v, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		m[name] = v
		if err := p.end("member"); err != nil {
			return nil, err
		}
	}
}

// decodeBase64 decodes standard base64, padded or not, ignoring the line
// breaks and indentation that Python inserts.
func decodeBase64(s string) ([]byte, error) {
	clean := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if !isSpaceByte(s[i]) {
			clean = append(clean, s[i])
		}
	}
	enc := base64.StdEncoding
	if len(clean)%4 != 0 {
		enc = base64.RawStdEncoding
	}
	out := make([]byte, enc.DecodedLen(len(clean)))
	n, err := enc.Decode(out, clean)
	if err != nil {
		return nil, decodeErrorf("bad <base64>: %v", err)
	}
	return out[:n], nil
}

func describe(tok xml.Token) string {
	switch t := tok.(type) {
	case xml.StartElement:
		return "<" + t.Name.Local + ">"
	case xml.EndElement:
		return "</" + t.Name.Local + ">"
	case xml.CharData:
		return fmt.Sprintf("text %q", truncate(t))
	}
	return fmt.Sprintf("%T", tok)
}

func truncate(b []byte) string {
	const max = 40
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}

package diskfull

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"
)

// A minimal XML-RPC client: requests carry strings and string maps, and
// replies are decoded into strings, maps and slices, which is all this
// test needs.

var httpClient = &http.Client{Timeout: 15 * time.Second}

// apiError is a XenAPI failure reply: the call was answered, not lost.
type apiError struct{ desc []string }

func (e *apiError) Error() string { return strings.Join(e.desc, " ") }

func (e *apiError) code() string {
	if len(e.desc) == 0 {
		return ""
	}
	return e.desc[0]
}

func xmlEscape(s string) string {
	var b bytes.Buffer
	xml.EscapeText(&b, []byte(s))
	return b.String()
}

func encodeValue(b *strings.Builder, v any) {
	b.WriteString("<value>")
	switch v := v.(type) {
	case string:
		b.WriteString("<string>" + xmlEscape(v) + "</string>")
	case map[string]string:
		b.WriteString("<struct>")
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			b.WriteString("<member><name>" + xmlEscape(k) + "</name>")
			encodeValue(b, v[k])
			b.WriteString("</member>")
		}
		b.WriteString("</struct>")
	case map[string]any:
		b.WriteString("<struct>")
		for k, x := range v {
			b.WriteString("<member><name>" + xmlEscape(k) + "</name>")
			encodeValue(b, x)
			b.WriteString("</member>")
		}
		b.WriteString("</struct>")
	default:
		panic(fmt.Sprintf("xmlrpc: cannot encode %T", v))
	}
	b.WriteString("</value>")
}

// node is a parsed XML element.
type node struct {
	XMLName xml.Name
	Text    string `xml:",chardata"`
	Kids    []node `xml:",any"`
}

func (n *node) kid(name string) *node {
	for i := range n.Kids {
		if n.Kids[i].XMLName.Local == name {
			return &n.Kids[i]
		}
	}
	return nil
}

// decodeValue turns a <value> element into a Go value.
func decodeValue(v *node) any {
	if len(v.Kids) == 0 {
		return v.Text // a bare value is a string
	}
	t := &v.Kids[0]
	switch t.XMLName.Local {
	case "struct":
		m := map[string]any{}
		for _, mem := range t.Kids {
			name, val := mem.kid("name"), mem.kid("value")
			if name != nil && val != nil {
				m[name.Text] = decodeValue(val)
			}
		}
		return m
	case "array":
		var out []any
		if data := t.kid("data"); data != nil {
			for i := range data.Kids {
				out = append(out, decodeValue(&data.Kids[i]))
			}
		}
		return out
	default:
		return t.Text
	}
}

// call makes one XML-RPC call. A transport error means the outcome is
// unknown; an *apiError means the daemon answered with a failure.
func call(addr, method string, params ...any) (any, error) {
	var b strings.Builder
	b.WriteString(`<?xml version="1.0"?><methodCall><methodName>` + method + `</methodName><params>`)
	for _, p := range params {
		b.WriteString("<param>")
		encodeValue(&b, p)
		b.WriteString("</param>")
	}
	b.WriteString("</params></methodCall>")
	resp, err := httpClient.Post("http://"+addr+"/RPC2", "text/xml", strings.NewReader(b.String()))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, body)
	}
	var root node
	if err := xml.Unmarshal(body, &root); err != nil {
		return nil, fmt.Errorf("reply is not XML: %v: %s", err, body)
	}
	v := root.kid("params")
	if v != nil {
		v = v.kid("param")
	}
	if v != nil {
		v = v.kid("value")
	}
	if v == nil {
		return nil, fmt.Errorf("reply has no value: %s", body)
	}
	m, ok := decodeValue(v).(map[string]any)
	if !ok {
		return nil, fmt.Errorf("reply is not a struct: %s", body)
	}
	if m["Status"] != "Success" {
		var desc []string
		list, _ := m["ErrorDescription"].([]any)
		for _, d := range list {
			desc = append(desc, fmt.Sprint(d))
		}
		return nil, &apiError{desc}
	}
	return m["Value"], nil
}

func isAPIError(err error) (*apiError, bool) {
	var e *apiError
	ok := errors.As(err, &e)
	return e, ok
}

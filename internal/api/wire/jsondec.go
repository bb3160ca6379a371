package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"strconv"
	"strings"
)

// DecodeJSONRequest reads a JSON-RPC 1.0 or 2.0 call. See the package
// documentation for what is accepted.
func DecodeJSONRequest(body []byte) (*JSONRequest, error) {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var top any
	if err := d.Decode(&top); err != nil {
		return nil, decodeErrorf("malformed JSON: %v", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, &DecodeError{Msg: "malformed JSON: data after the request object"}
	}
	obj, ok := top.(map[string]any)
	if !ok {
		return nil, &DecodeError{Msg: "request is not a JSON object"}
	}

	req := &JSONRequest{}
	if v, ok := obj["jsonrpc"]; ok {
		if v != "2.0" {
			return nil, &DecodeError{Msg: `field "jsonrpc" must be "2.0"`}
		}
		req.V2 = true
	}

	method, ok := obj["method"].(string)
	if !ok {
		return nil, &DecodeError{Msg: `field "method" is missing or not a string`}
	}
	if method == "" {
		return nil, &DecodeError{Msg: `field "method" is empty`}
	}
	req.Method = method

	switch p := obj["params"].(type) {
	case []any:
		for i, v := range p {
			n, err := normalizeJSON(v, 0)
			if err != nil {
				return nil, err
			}
			p[i] = n
		}
		req.Params = p
	case map[string]any:
		if !req.V2 {
			return nil, &DecodeError{Msg: `field "params" must be an array in JSON-RPC 1.0`}
		}
		n, err := normalizeJSON(p, 0)
		if err != nil {
			return nil, err
		}
		req.Params = []any{n}
	case nil:
		if !req.V2 { // 2.0 allows params to be absent or null
			return nil, &DecodeError{Msg: `field "params" must be an array in JSON-RPC 1.0`}
		}
		req.Params = []any{}
	default:
		return nil, &DecodeError{Msg: `field "params" must be an array or an object`}
	}

	switch id := obj["id"].(type) {
	case nil:
		return nil, &DecodeError{Msg: `field "id" is missing or null: notifications are not supported`}
	case string:
		req.ID = appendJSONString(nil, id)
	case json.Number:
		s := id.String()
		if strings.ContainsAny(s, ".eE") {
			return nil, &DecodeError{Msg: `field "id" must be an integer or a string`}
		}
		if _, err := strconv.ParseInt(s, 10, 64); err != nil {
			return nil, &DecodeError{Msg: `field "id" is out of range`}
		}
		req.ID = json.RawMessage(s)
	default:
		return nil, &DecodeError{Msg: `field "id" must be an integer or a string`}
	}
	return req, nil
}

// normalizeJSON turns the json.Numbers in v into int64 or float64, in
// place, and enforces MaxDepth. depth counts the enclosing containers.
func normalizeJSON(v any, depth int) (any, error) {
	switch x := v.(type) {
	case json.Number:
		return jsonNumber(x)
	case []any:
		if depth++; depth > MaxDepth {
			return nil, decodeErrorf("values nested deeper than %d", MaxDepth)
		}
		for i, el := range x {
			n, err := normalizeJSON(el, depth)
			if err != nil {
				return nil, err
			}
			x[i] = n
		}
	case map[string]any:
		if depth++; depth > MaxDepth {
			return nil, decodeErrorf("values nested deeper than %d", MaxDepth)
		}
		for k, el := range x {
			n, err := normalizeJSON(el, depth)
			if err != nil {
				return nil, err
			}
			x[k] = n
		}
	}
	return v, nil
}

// jsonNumber maps an integer literal to int64 and anything else to float64.
func jsonNumber(n json.Number) (any, error) {
	s := string(n)
	if !strings.ContainsAny(s, ".eE") {
		i, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, decodeErrorf("integer %s out of range", truncate([]byte(s)))
		}
		return i, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && (!errors.Is(err, strconv.ErrRange) || math.IsInf(f, 0)) {
		return nil, decodeErrorf("number %s out of range", truncate([]byte(s)))
	}
	return f, nil
}

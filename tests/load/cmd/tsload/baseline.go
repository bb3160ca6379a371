package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"encoding/xml"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"time"
)

// The baseline is the simplest Go XenAPI-ish server one would write with
// the standard library: net/http, encoding/json and encoding/xml, no
// sessions table, no database. It answers host.get_record with a fixed
// record (the one toolstackd returned, so the reply has the same shape and
// size) and checks the session and ref it is given. It runs as its own
// process (tsload re-executes itself with "baseline") so that it, like
// toolstackd, is a separate process from the load generator.

type baseline struct {
	session, ref string
	record       any // decoded with UseNumber: maps, slices, strings, json.Number, bools
}

func runBaseline(args []string) error {
	fs := flag.NewFlagSet("baseline", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on")
	recordFile := fs.String("record", "", "JSON file holding the host record to serve")
	session := fs.String("session", "", "the only session accepted")
	ref := fs.String("ref", "", "the host ref")
	fs.Parse(args)
	raw, err := os.ReadFile(*recordFile)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	b := &baseline{session: *session, ref: *ref}
	if err := dec.Decode(&b.record); err != nil {
		return err
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /jsonrpc", b.serveJSON)
	mux.HandleFunc("POST /", b.serveXML)
	fmt.Printf("listening %s\n", l.Addr())
	os.Stdout.Sync()
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second}
	return hs.Serve(l)
}

type baseJSONRequest struct {
	JSONRPC string `json:"jsonrpc"`
	Method  string `json:"method"`
	Params  []any  `json:"params"`
	ID      any    `json:"id"`
}

type baseJSONError struct {
	Code    int      `json:"code"`
	Message string   `json:"message"`
	Data    []string `json:"data"`
}

type baseJSONResponse struct {
	JSONRPC string         `json:"jsonrpc"`
	Result  any            `json:"result,omitempty"`
	Error   *baseJSONError `json:"error,omitempty"`
	ID      any            `json:"id"`
}

// dispatch is the whole "API": login and host.get_record.
func (b *baseline) dispatch(method string, params []string) (any, []string) {
	switch method {
	case "session.login_with_password":
		return b.session, nil
	case "host.get_record":
		if len(params) != 2 {
			return nil, []string{"MESSAGE_PARAMETER_COUNT_MISMATCH", method, "2", strconv.Itoa(len(params))}
		}
		if params[0] != b.session {
			return nil, []string{"SESSION_INVALID", params[0]}
		}
		if params[1] != b.ref {
			return nil, []string{"HANDLE_INVALID", "host", params[1]}
		}
		return b.record, nil
	}
	return nil, []string{"MESSAGE_METHOD_UNKNOWN", method}
}

func (b *baseline) serveJSON(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 4<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req baseJSONRequest
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	params := make([]string, len(req.Params))
	for i, p := range req.Params {
		params[i], _ = p.(string)
	}
	res, failure := b.dispatch(req.Method, params)
	resp := baseJSONResponse{JSONRPC: "2.0", Result: res, ID: req.ID}
	if failure != nil {
		resp.Result = nil
		resp.Error = &baseJSONError{Code: 1, Message: failure[0], Data: failure[1:]}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(resp)
}

type baseXMLCall struct {
	MethodName string `xml:"methodName"`
	Params     []struct {
		String *string `xml:"string"`
		Text   string  `xml:",chardata"`
	} `xml:"params>param>value"`
}

func (b *baseline) serveXML(w http.ResponseWriter, r *http.Request) {
	var call baseXMLCall
	if err := xml.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<20)).Decode(&call); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	params := make([]string, len(call.Params))
	for i, p := range call.Params {
		if p.String != nil {
			params[i] = *p.String
		} else {
			params[i] = p.Text
		}
	}
	res, failure := b.dispatch(call.MethodName, params)
	w.Header().Set("Content-Type", "text/xml")
	bw := bufio.NewWriter(w)
	bw.WriteString(`<?xml version="1.0"?><methodResponse><params><param><value><struct>`)
	if failure != nil {
		bw.WriteString(`<member><name>Status</name><value>Failure</value></member><member><name>ErrorDescription</name><value><array><data>`)
		for _, f := range failure {
			xmlEncode(bw, f)
		}
		bw.WriteString(`</data></array></value></member>`)
	} else {
		bw.WriteString(`<member><name>Status</name><value>Success</value></member><member><name>Value</name>`)
		xmlEncode(bw, res)
		bw.WriteString(`</member>`)
	}
	bw.WriteString(`</struct></value></param></params></methodResponse>`)
	bw.Flush()
}

// xmlEncode writes v as an XML-RPC <value> in xapi's style (strings and
// integers as bare text).
func xmlEncode(w *bufio.Writer, v any) {
	w.WriteString("<value>")
	switch v := v.(type) {
	case string:
		xml.EscapeText(w, []byte(v))
	case json.Number:
		if _, err := v.Int64(); err == nil {
			w.WriteString(v.String())
		} else {
			w.WriteString("<double>" + v.String() + "</double>")
		}
	case bool:
		if v {
			w.WriteString("<boolean>1</boolean>")
		} else {
			w.WriteString("<boolean>0</boolean>")
		}
	case []any:
		w.WriteString("<array><data>")
		for _, e := range v {
			xmlEncode(w, e)
		}
		w.WriteString("</data></array>")
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		w.WriteString("<struct>")
		for _, k := range keys {
			w.WriteString("<member><name>")
			xml.EscapeText(w, []byte(k))
			w.WriteString("</name>")
			xmlEncode(w, v[k])
			w.WriteString("</member>")
		}
		w.WriteString("</struct>")
	case nil:
		w.WriteString("<nil/>")
	default:
		fmt.Fprintf(w, "%v", v)
	}
	w.WriteString("</value>")
}

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// createVMs makes n VMs with VM.create from the record of template tmpl,
// with workers parallel JSON-RPC connections.
func createVMs(cl *client, tmpl string, n, workers int) (time.Duration, error) {
	var rec map[string]json.RawMessage
	if err := cl.call(&rec, "VM.get_record", cl.session, tmpl); err != nil {
		return 0, err
	}
	rec["is_a_template"] = json.RawMessage("false")
	rec["is_default_template"] = json.RawMessage("false")
	rec["other_config"] = json.RawMessage(`{}`)
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := newClient(cl.addr)
			if err != nil {
				firstErr.CompareAndSwap(nil, err)
				return
			}
			defer c.c.Close()
			c.session = cl.session
			r := make(map[string]json.RawMessage, len(rec))
			for k, v := range rec {
				r[k] = v
			}
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				r["name_label"] = json.RawMessage(strconv.Quote("load-vm-" + strconv.FormatInt(i, 10)))
				var ref string
				if err := c.call(&ref, "VM.create", c.session, r); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(t0)
	if f := failed.Load(); f > 0 {
		return d, fmt.Errorf("%d of %d VM.create calls failed, first: %v", f, n, firstErr.Load())
	}
	if e := firstErr.Load(); e != nil {
		return d, e.(error)
	}
	return d, nil
}

type garResult struct {
	t        transport
	dur      time.Duration
	bytes    int
	records  int
	cpu      time.Duration
	rssAfter int64
}

// getAllRecords times one VM.get_all_records call on a fresh connection,
// from sending the request to reading the last byte.
func getAllRecords(addr, session string, pid int, t transport) (garResult, error) {
	cpu0 := cpuTime(pid)
	body, d, err := rawCall(addr, t, "VM.get_all_records", session)
	res := garResult{t: t, dur: d, bytes: len(body), cpu: cpuTime(pid) - cpu0, rssAfter: rssKB(pid)}
	if err != nil {
		return res, err
	}
	if t == jsonRPC {
		res.records = bytes.Count(body, []byte(`"name_label":`))
	} else {
		res.records = bytes.Count(body, []byte(`<name>name_label</name>`))
	}
	return res, nil
}

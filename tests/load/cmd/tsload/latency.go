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

// Write-to-event latency: watchers loop on event.from(classes, token,
// 30.0), each on its own connection; a writer sets a VM's name_description
// to a numbered value every interval. A watcher that receives the VM's mod
// event with value k has learnt of every write <= k: writes it never saw
// on their own (their events coalesced into a later one, which is what
// event.from does for an object modified twice between calls) count as
// delivered at that moment too. Latency is from the writer's call
// returning to the watcher having read the whole reply; all clocks are
// this process's monotonic clock.

type latResult struct {
	watchers    int
	writes      int
	samples     int // (watcher, write) pairs delivered
	missing     int // pairs never delivered
	coalesced   int // delivered by a later value
	early       int // delivered before the writer's call had returned (counted as 0)
	errors      int
	p50, p99    time.Duration // from the writer's call returning
	max         time.Duration
	p50s        time.Duration // from the writer's call starting
	p99s        time.Duration
	writeP50    time.Duration // the writes themselves
	writeP99    time.Duration
	cpuPerWrite time.Duration // daemon CPU per write over the run
}

type delivery struct {
	seq    int
	at     time.Time
	direct bool
}

// eventFromRequest frames event.from(session, classes, token, timeout) for
// JSON-RPC without going through encoding/json.
func eventFromRequest(addr, session string, classes []string, token string, timeout float64) []byte {
	cj, _ := json.Marshal(classes)
	body := fmt.Sprintf(`{"jsonrpc":"2.0","method":"event.from","params":[%q,%s,%q,%s],"id":1}`,
		session, cj, token, strconv.FormatFloat(timeout, 'f', 1, 64))
	return httpPost(addr, "/jsonrpc", "application/json", []byte(body))
}

// batchToken finds the token of an event.from reply: the last "token"
// member (toolstackd writes it after the events). It falls back to a full
// decode when what it finds does not look like a token.
func batchToken(body []byte) (string, error) {
	key := []byte(`"token":"`)
	if i := bytes.LastIndex(body, key); i >= 0 {
		rest := body[i+len(key):]
		if j := bytes.IndexByte(rest, '"'); j > 0 {
			tok := rest[:j]
			if bytes.Count(tok, []byte(",")) == 1 && len(bytes.Trim(tok, "0123456789,")) == 0 {
				return string(tok), nil
			}
		}
	}
	var reply struct {
		Result struct {
			Token string `json:"token"`
		} `json:"result"`
		Error *rpcError `json:"error"`
	}
	if err := json.Unmarshal(body, &reply); err != nil {
		return "", fmt.Errorf("event.from reply: %v (%.200s)", err, body)
	}
	if reply.Error != nil {
		return "", fmt.Errorf("event.from: %v", reply.Error)
	}
	return reply.Result.Token, nil
}

// maxValue returns the largest k such that marker+k+`"` occurs in body,
// or -1.
func maxValue(body, marker []byte) int {
	best := -1
	for {
		i := bytes.Index(body, marker)
		if i < 0 {
			return best
		}
		body = body[i+len(marker):]
		n, j := 0, 0
		for j < len(body) && '0' <= body[j] && body[j] <= '9' {
			n = n*10 + int(body[j]-'0')
			j++
		}
		if j > 0 && j < len(body) && body[j] == '"' {
			best = max(best, n)
		}
	}
}

func eventLatency(addr string, pid int, session, vmRef string, classes func(i int) []string, watchers, writes int, interval time.Duration, tag string) (latResult, error) {
	res := latResult{watchers: watchers, writes: writes}
	marker := []byte(`"name_description":"` + tag + "-")
	got := make([][]delivery, watchers)
	errs := make([]error, watchers)
	conns := make([]*conn, watchers)
	var ready, done sync.WaitGroup
	var stopping atomic.Bool
	for i := 0; i < watchers; i++ {
		c, err := dial(addr)
		if err != nil {
			return res, err
		}
		conns[i] = c
		ready.Add(1)
		done.Add(1)
		go func(i int) {
			defer done.Done()
			cls := classes(i)
			body, err := c.roundTrip(eventFromRequest(addr, session, cls, "", 0))
			var token string
			if err == nil {
				token, err = batchToken(body)
			}
			ready.Done()
			if err != nil {
				errs[i] = err
				return
			}
			last := -1
			for last < writes-1 {
				body, err := c.roundTrip(eventFromRequest(addr, session, cls, token, 30))
				now := time.Now()
				if err != nil {
					if !stopping.Load() {
						errs[i] = err
					}
					return
				}
				if k := maxValue(body, marker); k > last {
					for j := last + 1; j <= k; j++ {
						got[i] = append(got[i], delivery{seq: j, at: now, direct: j == k})
					}
					last = k
				}
				if token, err = batchToken(body); err != nil {
					errs[i] = err
					return
				}
			}
		}(i)
	}
	ready.Wait()
	time.Sleep(200 * time.Millisecond) // let every watcher's blocking call reach the server

	w, err := newClient(addr)
	if err != nil {
		return res, err
	}
	defer w.c.Close()
	start := make([]time.Time, writes)
	ret := make([]time.Time, writes)
	cpu0 := cpuTime(pid)
	tick := time.NewTicker(interval)
	for k := 0; k < writes; k++ {
		<-tick.C
		start[k] = time.Now()
		if err := w.call(nil, "VM.set_name_description", session, vmRef, tag+"-"+strconv.Itoa(k)); err != nil {
			tick.Stop()
			return res, err
		}
		ret[k] = time.Now()
	}
	tick.Stop()

	finished := make(chan struct{})
	go func() { done.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(5 * time.Second):
	}
	stopping.Store(true)
	for _, c := range conns {
		c.Close()
	}
	<-finished
	res.cpuPerWrite = (cpuTime(pid) - cpu0) / time.Duration(writes)

	var fromRet, fromStart, writesD []time.Duration
	for k := range writes {
		writesD = append(writesD, ret[k].Sub(start[k]))
	}
	for i := range got {
		if errs[i] != nil {
			res.errors++
		}
		for _, d := range got[i] {
			l := d.at.Sub(ret[d.seq])
			if l < 0 {
				res.early++
				l = 0
			}
			if !d.direct {
				res.coalesced++
			}
			fromRet = append(fromRet, l)
			fromStart = append(fromStart, d.at.Sub(start[d.seq]))
		}
	}
	res.samples = len(fromRet)
	res.missing = watchers*writes - res.samples
	res.p50, res.p99 = percentile(fromRet, 50), percentile(fromRet, 99)
	res.max = percentile(fromRet, 100)
	res.p50s, res.p99s = percentile(fromStart, 50), percentile(fromStart, 99)
	res.writeP50 = percentile(writesD, 50)
	res.writeP99 = percentile(writesD, 99)
	for i, e := range errs {
		if e != nil {
			return res, fmt.Errorf("watcher %d: %v", i, e)
		}
	}
	return res, nil
}

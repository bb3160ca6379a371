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
	ws, err := startWatchers(addr, session, classes, watchers, writes, marker)
	if err != nil {
		return res, err
	}

	w, err := newClient(addr)
	if err != nil {
		return res, err
	}
	defer w.c.Close()
	cpu0 := cpuTime(pid)
	start, ret, err := writeValues(w, session, vmRef, tag, writes, interval)
	if err != nil {
		return res, err
	}

	ws.stop()
	res.cpuPerWrite = (cpuTime(pid) - cpu0) / time.Duration(writes)
	ws.tally(start, ret, &res)
	for i, e := range ws.errs {
		if e != nil {
			return res, fmt.Errorf("watcher %d: %v", i, e)
		}
	}
	return res, nil
}

// watchSet is eventLatency's watchers, one goroutine and connection each,
// and what each has received.
type watchSet struct {
	addr, session string
	writes        int    // how many values the writer sets
	marker        []byte // the written values, less their number
	got           [][]delivery
	errs          []error
	conns         []*conn
	ready, done   sync.WaitGroup
	stopping      atomic.Bool
}

// startWatchers connects n watchers, watcher i watching classes(i) for
// the values after marker, and returns once each has its first token and
// its blocking call has had time to reach the server.
func startWatchers(addr, session string, classes func(i int) []string, n, writes int, marker []byte) (*watchSet, error) {
	ws := &watchSet{addr: addr, session: session, writes: writes, marker: marker,
		got: make([][]delivery, n), errs: make([]error, n), conns: make([]*conn, n)}
	for i := 0; i < n; i++ {
		c, err := dial(addr)
		if err != nil {
			return nil, err
		}
		ws.conns[i] = c
		ws.ready.Add(1)
		ws.done.Add(1)
		go ws.watch(i, c, classes)
	}
	ws.ready.Wait()
	time.Sleep(200 * time.Millisecond) // let every watcher's blocking call reach the server
	return ws, nil
}

// watch is the goroutine of watcher i: it takes a token, then loops on
// event.from on c until it has seen the last value, noting when each
// value arrived.
func (ws *watchSet) watch(i int, c *conn, classes func(i int) []string) {
	defer ws.done.Done()
	cls := classes(i)
	body, err := c.roundTrip(eventFromRequest(ws.addr, ws.session, cls, "", 0))
	var token string
	if err == nil {
		token, err = batchToken(body)
	}
	ws.ready.Done()
	if err != nil {
		ws.errs[i] = err
		return
	}
	last := -1
	for last < ws.writes-1 {
		body, err := c.roundTrip(eventFromRequest(ws.addr, ws.session, cls, token, 30))
		now := time.Now()
		if err != nil {
			if !ws.stopping.Load() {
				ws.errs[i] = err
			}
			return
		}
		if k := maxValue(body, ws.marker); k > last {
			for j := last + 1; j <= k; j++ {
				ws.got[i] = append(ws.got[i], delivery{seq: j, at: now, direct: j == k})
			}
			last = k
		}
		if token, err = batchToken(body); err != nil {
			ws.errs[i] = err
			return
		}
	}
}

// writeValues sets vmRef's name_description to tag-0, tag-1, ... one
// every interval, and returns when each call started and returned.
func writeValues(w *client, session, vmRef, tag string, writes int, interval time.Duration) (start, ret []time.Time, err error) {
	start = make([]time.Time, writes)
	ret = make([]time.Time, writes)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for k := 0; k < writes; k++ {
		<-tick.C
		start[k] = time.Now()
		if err = w.call(nil, "VM.set_name_description", session, vmRef, tag+"-"+strconv.Itoa(k)); err != nil {
			return nil, nil, err
		}
		ret[k] = time.Now()
	}
	return start, ret, nil
}

// stop gives the watchers up to 5 s to see the last value, then closes
// their connections and waits for them to end.
func (ws *watchSet) stop() {
	finished := make(chan struct{})
	go func() { ws.done.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(5 * time.Second):
	}
	ws.stopping.Store(true)
	for _, c := range ws.conns {
		c.Close()
	}
	<-finished
}

// tally records in res the delivery latencies, from the write calls'
// start and return times, and the write calls' own times.
func (ws *watchSet) tally(start, ret []time.Time, res *latResult) {
	var fromRet, fromStart, writesD []time.Duration
	for k := range ws.writes {
		writesD = append(writesD, ret[k].Sub(start[k]))
	}
	for i := range ws.got {
		if ws.errs[i] != nil {
			res.errors++
		}
		for _, d := range ws.got[i] {
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
	res.missing = res.watchers*res.writes - res.samples
	res.p50, res.p99 = percentile(fromRet, 50), percentile(fromRet, 99)
	res.max = percentile(fromRet, 100)
	res.p50s, res.p99s = percentile(fromStart, 50), percentile(fromStart, 99)
	res.writeP50 = percentile(writesD, 50)
	res.writeP99 = percentile(writesD, 99)
}

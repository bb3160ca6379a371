package main

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Idle long polls: n event.from(['vm'], token, timeout) calls, each on its
// own TCP connection, with a current token so that they block. Then one
// write must wake every one of them.

type pollResult struct {
	n, opened, dialErrors, early, otherErrors int
	openTime                                  time.Duration
	rssBeforeKB, rssWithKB, rssAfterKB        int64
	fdsBefore, fdsWith                        int
	threadsBefore, threadsWith                int64
	cpuIdle                                   time.Duration // server CPU while the polls sat idle
	idleFor                                   time.Duration
	write                                     time.Duration // the waking write call
	probe, probeAt                            time.Duration // host.get_record during the wake-up, and when it started
	responses, withValue                      int
	deliverP50, deliverAll                    time.Duration // from the write's return
	deliverP50s, deliverAlls                  time.Duration // from the write's start
	wakeCPU                                   time.Duration // server CPU to answer them all
	limit                                     string
}

func (r pollResult) perConnKB() float64 {
	if r.opened == 0 {
		return 0
	}
	return float64(r.rssWithKB-r.rssBeforeKB) / float64(r.opened)
}

func idlePolls(cl *client, pid int, hostRef, vmRef string, n int, timeout float64, tag string) (pollResult, error) {
	res := pollResult{n: n, limit: nofileLimit(pid)}
	var first struct {
		Token string `json:"token"`
	}
	if err := cl.call(&first, "event.from", cl.session, []string{"vm"}, "", 0.0); err != nil {
		return res, err
	}
	res.rssBeforeKB = rssKB(pid)
	res.fdsBefore = openFDs(pid)
	res.threadsBefore, _ = procStatus(pid, "Threads")

	req := eventFromRequest(cl.addr, cl.session, []string{"vm"}, first.Token, timeout)
	marker := []byte(`"name_description":"` + tag + `"`)
	ps := &pollSet{recv: make([]time.Time, n), conns: make([]*conn, n)}
	t0 := time.Now()
	ps.open(cl.addr, req, marker)
	res.openTime = time.Since(t0)
	res.opened = int(ps.nOpened.Load())
	res.dialErrors = int(ps.dialErrs.Load())
	measureIdle(pid, &res)
	res.early = int(ps.early.Load())

	writer, probe, err := startWakers(cl, hostRef, vmRef, tag)
	if err != nil {
		return res, err
	}
	cpu1 := cpuTime(pid)
	ps.writeStarted.Store(true)
	ws, wr, err := fireWakers(writer, probe, &res)
	if err != nil {
		return res, err
	}
	ps.collect(pid, cpu1, ws, wr, &res)
	time.Sleep(500 * time.Millisecond)
	res.rssAfterKB = rssKB(pid)
	if res.opened < n {
		return res, fmt.Errorf("only %d of %d polls opened", res.opened, n)
	}
	return res, nil
}

// pollSet is idlePolls' long polls, one goroutine and connection each,
// and what those goroutines have counted and seen.
type pollSet struct {
	writeStarted                                           atomic.Bool
	opened, answered                                       sync.WaitGroup
	nOpened, dialErrs, early, others, withValue, responses atomic.Int64
	recv                                                   []time.Time // when each poll's reply came, zero if none
	conns                                                  []*conn
}

// open starts one poll per slot of ps.conns, each sending req on a
// connection of its own, and returns once every one has been sent or has
// failed to connect. Replies holding marker count as carrying the value.
func (ps *pollSet) open(addr string, req, marker []byte) {
	sem := make(chan struct{}, 128)
	for i := range ps.conns {
		ps.opened.Add(1)
		ps.answered.Add(1)
		go ps.poll(i, addr, req, marker, sem)
	}
	ps.opened.Wait()
}

// poll is the goroutine of poll i: it connects (at most cap(sem) dialling
// at once), sends req, then waits for the reply and notes when it came.
func (ps *pollSet) poll(i int, addr string, req, marker []byte, sem chan struct{}) {
	defer ps.answered.Done()
	sem <- struct{}{}
	c, err := dialPoll(addr, req)
	<-sem
	if err != nil {
		ps.dialErrs.Add(1)
		ps.opened.Done()
		return
	}
	ps.conns[i] = c
	ps.nOpened.Add(1)
	ps.opened.Done()
	body, err := c.readResponse()
	at := time.Now()
	if !ps.writeStarted.Load() {
		ps.early.Add(1)
	}
	if err != nil && err != errConnClosed {
		ps.others.Add(1)
		return
	}
	ps.responses.Add(1)
	ps.recv[i] = at
	if bytes.Contains(body, marker) {
		ps.withValue.Add(1)
	}
	c.body = bytes.Buffer{}
}

// dialPoll connects to addr with a small read buffer and sends req on the
// connection, trying up to five times.
func dialPoll(addr string, req []byte) (*conn, error) {
	var c *conn
	var err error
	for try := 0; try < 5; try++ {
		if c, err = dialSize(addr, 4096); err == nil {
			if _, err = c.c.Write(req); err == nil {
				break
			}
			c.Close()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return c, err
}

// measureIdle waits for the daemon to hold every open poll, lets it
// settle, and records in res its CPU over two idle seconds and its RSS,
// open fds and threads with the polls open.
func measureIdle(pid int, res *pollResult) {
	deadline := time.Now().Add(20 * time.Second)
	for openFDs(pid) < res.fdsBefore+res.opened && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	cpu0, i0 := cpuTime(pid), time.Now()
	time.Sleep(2 * time.Second)
	res.cpuIdle, res.idleFor = cpuTime(pid)-cpu0, time.Since(i0)
	res.rssWithKB = rssKB(pid)
	res.fdsWith = openFDs(pid)
	res.threadsWith, _ = procStatus(pid, "Threads")
}

// startWakers starts the processes of their own that make the waking
// write (setting vmRef's name_description to tag) and the host.get_record
// probe, and gives them time to start and connect.
func startWakers(cl *client, hostRef, vmRef, tag string) (writer, probe *remoteCall, err error) {
	writer, err = startRemoteCall(cl.addr, "VM.set_name_description", cl.session, vmRef, tag)
	if err != nil {
		return nil, nil, err
	}
	probe, err = startRemoteCall(cl.addr, "host.get_record", cl.session, hostRef)
	if err != nil {
		writer.kill()
		return nil, nil, err
	}
	time.Sleep(300 * time.Millisecond) // let them start and connect
	return writer, probe, nil
}

// fireWakers makes the write, and the probe 20 ms after it to see how long
// an unrelated call waits while the daemon answers the polls. It records
// both calls' times in res and returns when the write started and ended.
func fireWakers(writer, probe *remoteCall, res *pollResult) (ws, wr time.Time, err error) {
	if err = writer.fire(); err != nil {
		probe.kill()
		return ws, wr, err
	}
	time.Sleep(20 * time.Millisecond)
	if err = probe.fire(); err != nil {
		return ws, wr, err
	}
	ws, wr, err = writer.result()
	if err != nil {
		probe.kill()
		return ws, wr, err
	}
	ps, pr, err := probe.result()
	if err != nil {
		return ws, wr, err
	}
	res.write = wr.Sub(ws)
	res.probe, res.probeAt = pr.Sub(ps), ps.Sub(ws)
	return ws, wr, nil
}

// collect waits up to a minute for every poll's reply, records the
// daemon's CPU since cpu1, closes the polls, and records in res the
// replies and how long after the write (which started at ws and returned
// at wr) they came.
func (ps *pollSet) collect(pid int, cpu1 time.Duration, ws, wr time.Time, res *pollResult) {
	waited := make(chan struct{})
	go func() { ps.answered.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(60 * time.Second):
	}
	res.wakeCPU = cpuTime(pid) - cpu1
	for _, c := range ps.conns {
		if c != nil {
			c.Close()
		}
	}
	<-waited
	res.responses = int(ps.responses.Load())
	res.withValue = int(ps.withValue.Load())
	res.otherErrors = int(ps.others.Load())
	var ds, dss []time.Duration
	for _, at := range ps.recv {
		if !at.IsZero() {
			at = at.Round(0) // wall clock: the write's times come from another process
			ds = append(ds, max(at.Sub(wr), 0))
			dss = append(dss, at.Sub(ws))
		}
	}
	res.deliverP50 = percentile(ds, 50)
	res.deliverAll = percentile(ds, 100)
	res.deliverP50s = percentile(dss, 50)
	res.deliverAlls = percentile(dss, 100)
}

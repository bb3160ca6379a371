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
	var writeStarted atomic.Bool
	var opened, answered sync.WaitGroup
	var nOpened, dialErrs, early, others, withValue, responses atomic.Int64
	recv := make([]time.Time, n)
	conns := make([]*conn, n)
	sem := make(chan struct{}, 128)
	t0 := time.Now()
	for i := 0; i < n; i++ {
		opened.Add(1)
		answered.Add(1)
		go func(i int) {
			defer answered.Done()
			sem <- struct{}{}
			var c *conn
			var err error
			for try := 0; try < 5; try++ {
				if c, err = dialSize(cl.addr, 4096); err == nil {
					if _, err = c.c.Write(req); err == nil {
						break
					}
					c.Close()
				}
				time.Sleep(50 * time.Millisecond)
			}
			<-sem
			if err != nil {
				dialErrs.Add(1)
				opened.Done()
				return
			}
			conns[i] = c
			nOpened.Add(1)
			opened.Done()
			body, err := c.readResponse()
			at := time.Now()
			if !writeStarted.Load() {
				early.Add(1)
			}
			if err != nil && err != errConnClosed {
				others.Add(1)
				return
			}
			responses.Add(1)
			recv[i] = at
			if bytes.Contains(body, marker) {
				withValue.Add(1)
			}
			c.body = bytes.Buffer{}
		}(i)
	}
	opened.Wait()
	res.openTime = time.Since(t0)
	res.opened = int(nOpened.Load())
	res.dialErrors = int(dialErrs.Load())

	// Wait for the daemon to hold every connection, then let it settle.
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
	res.early = int(early.Load())

	// The write, and a host.get_record fired 20 ms after it to see how
	// long an unrelated call waits while the daemon answers the polls,
	// come from processes of their own.
	writer, err := startRemoteCall(cl.addr, "VM.set_name_description", cl.session, vmRef, tag)
	if err != nil {
		return res, err
	}
	probe, err := startRemoteCall(cl.addr, "host.get_record", cl.session, hostRef)
	if err != nil {
		writer.kill()
		return res, err
	}
	time.Sleep(300 * time.Millisecond) // let them start and connect
	cpu1 := cpuTime(pid)
	writeStarted.Store(true)
	if err := writer.fire(); err != nil {
		probe.kill()
		return res, err
	}
	time.Sleep(20 * time.Millisecond)
	if err := probe.fire(); err != nil {
		return res, err
	}
	ws, wr, err := writer.result()
	if err != nil {
		probe.kill()
		return res, err
	}
	ps, pr, err := probe.result()
	if err != nil {
		return res, err
	}
	res.write = wr.Sub(ws)
	res.probe, res.probeAt = pr.Sub(ps), ps.Sub(ws)
	waited := make(chan struct{})
	go func() { answered.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(60 * time.Second):
	}
	res.wakeCPU = cpuTime(pid) - cpu1
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
	<-waited
	res.responses = int(responses.Load())
	res.withValue = int(withValue.Load())
	res.otherErrors = int(others.Load())
	var ds, dss []time.Duration
	for _, at := range recv {
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
	time.Sleep(500 * time.Millisecond)
	res.rssAfterKB = rssKB(pid)
	if res.opened < n {
		return res, fmt.Errorf("only %d of %d polls opened", res.opened, n)
	}
	return res, nil
}

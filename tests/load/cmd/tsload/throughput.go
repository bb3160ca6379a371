package main

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

type tputResult struct {
	calls      int
	errors     int
	elapsed    time.Duration
	rate       float64       // calls per second
	p50, p99   time.Duration // per-call latency seen by the clients
	serverCPU  time.Duration // the server process's CPU time over the run
	clientCPU  time.Duration // this process's CPU time over the run
	otherCPU   time.Duration // every other process's CPU time over the run
	replyBytes int
}

// otherLoad is how many CPUs other processes kept busy on average.
func (r tputResult) otherLoad() float64 { return r.otherCPU.Seconds() / r.elapsed.Seconds() }

func (r tputResult) clientCPUPerCall() time.Duration {
	if r.calls == 0 {
		return 0
	}
	return r.clientCPU / time.Duration(r.calls)
}

func (r tputResult) cpuPerCall() time.Duration {
	if r.calls == 0 {
		return 0
	}
	return r.serverCPU / time.Duration(r.calls)
}

// throughput runs clients goroutines, each on its own keep-alive
// connection, sending req in a loop for d, against the server at addr
// whose process is pid.
func throughput(addr string, pid int, t transport, req []byte, clients int, d time.Duration) (tputResult, error) {
	var res tputResult
	conns := make([]*conn, clients)
	for i := range conns {
		c, err := dial(addr)
		if err != nil {
			return res, err
		}
		defer c.Close()
		body, err := c.roundTrip(req) // warm-up, and a check of the reply
		if err != nil {
			return res, err
		}
		if !okReply(t, body) {
			return res, fmt.Errorf("unexpected reply from %s: %.300s", addr, body)
		}
		res.replyBytes = len(body)
		conns[i] = c
	}
	lats := make([][]time.Duration, clients)
	errs := make([]int, clients)
	var wg sync.WaitGroup
	startGate := make(chan struct{})
	var deadline time.Time
	for i := range conns {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c := conns[i]
			l := make([]time.Duration, 0, 1<<14)
			<-startGate
			for {
				s := time.Now()
				if !s.Before(deadline) {
					break
				}
				body, err := c.roundTrip(req)
				e := time.Since(s)
				if err != nil && !errors.Is(err, errConnClosed) {
					errs[i]++
					c.Close()
					if c2, derr := dial(addr); derr == nil {
						c, conns[i] = c2, c2
					} else {
						break
					}
					continue
				}
				if !okReply(t, body) {
					errs[i]++
				} else {
					l = append(l, e)
				}
				if errors.Is(err, errConnClosed) {
					c.Close()
					if c2, derr := dial(addr); derr == nil {
						c, conns[i] = c2, c2
					} else {
						break
					}
				}
			}
			lats[i] = l
		}(i)
	}
	cpu0, self0, busy0 := cpuTime(pid), cpuTime(os.Getpid()), busyCPU()
	t0 := time.Now()
	deadline = t0.Add(d)
	close(startGate)
	wg.Wait()
	res.elapsed = time.Since(t0)
	res.serverCPU = cpuTime(pid) - cpu0
	res.clientCPU = cpuTime(os.Getpid()) - self0
	res.otherCPU = max(busyCPU()-busy0-res.serverCPU-res.clientCPU, 0)
	var all []time.Duration
	for i := range lats {
		all = append(all, lats[i]...)
		res.errors += errs[i]
	}
	res.calls = len(all)
	res.rate = float64(res.calls) / res.elapsed.Seconds()
	res.p50 = percentile(all, 50)
	res.p99 = percentile(all, 99)
	return res, nil
}

package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
)

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }
func us(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/1e3) }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "**no**"
}

func runThroughput(o options, cl *client, host string, md *strings.Builder) error {
	var rec json.RawMessage
	if err := cl.call(&rec, "host.get_record", cl.session, host); err != nil {
		return err
	}
	baddr, bpid, stop, err := startBaseline(rec, cl.session, host)
	if err != nil {
		return err
	}
	defer stop()
	logf("throughput: baseline on %s (pid %d); %d rounds x 4 runs x %s, %d clients", baddr, bpid, o.rounds, o.duration, o.clients)
	tr := &tputRun{o: o, baddr: baddr, bpid: bpid, session: cl.session, host: host,
		results:   map[tputKey][]tputResult{},
		ratios:    map[transport][]float64{},
		cpuRatios: map[transport][]float64{},
		together:  map[transport][]float64{},
	}
	for r := 0; r < o.rounds; r++ {
		for _, t := range []transport{jsonRPC, xmlRPC} {
			if err := tr.round(r, t); err != nil {
				return err
			}
		}
	}
	tr.runsTable(md)
	tr.ratiosTable(md)
	return nil
}

// tputKey names one series of throughput runs: a transport, against
// toolstackd or the baseline.
type tputKey struct {
	t    transport
	base bool
}

// tputRun is one runThroughput: the baseline it compares toolstackd with,
// the record it asks both for, and what its rounds have measured.
type tputRun struct {
	o             options
	baddr         string // the baseline's address and process
	bpid          int
	session, host string
	results       map[tputKey][]tputResult
	ratios        map[transport][]float64 // calls/s, ours over the baseline's, back to back
	cpuRatios     map[transport][]float64 // the baseline's server CPU per call over ours
	xmlVsJSONBase []float64               // our XML-RPC against the JSON baseline, same round
	together      map[transport][]float64 // ratio with both servers loaded at once
}

// load runs the throughput test of host.get_record over t against the
// server at addr whose process is pid.
func (tr *tputRun) load(addr string, pid int, t transport) (tputResult, error) {
	return throughput(addr, pid, t, request(addr, t, "host.get_record", tr.session, tr.host), tr.o.clients, tr.o.duration)
}

// round measures transport t in round r, back to back and then side by
// side, and adds that round's ratios.
func (tr *tputRun) round(r int, t transport) error {
	ours, base, err := tr.backToBack(r, t)
	if err != nil {
		return err
	}
	both, err := tr.sideBySide(t)
	if err != nil {
		return err
	}
	logf("round %d %-8s side by side: toolstackd %.0f calls/s, baseline %.0f calls/s", r+1, t, both[0].rate, both[1].rate)
	tr.together[t] = append(tr.together[t], both[0].rate/both[1].rate)
	tr.ratios[t] = append(tr.ratios[t], ours.rate/base.rate)
	if t == xmlRPC {
		jb := tr.results[tputKey{jsonRPC, true}]
		tr.xmlVsJSONBase = append(tr.xmlVsJSONBase, ours.rate/jb[len(jb)-1].rate)
	}
	if ours.cpuPerCall() > 0 {
		tr.cpuRatios[t] = append(tr.cpuRatios[t], float64(base.cpuPerCall())/float64(ours.cpuPerCall()))
	}
	return nil
}

// backToBack loads toolstackd and then the baseline over t, the other way
// round in odd rounds, logging and keeping each run's result.
func (tr *tputRun) backToBack(r int, t transport) (ours, base tputResult, err error) {
	order := []bool{false, true}
	if r%2 == 1 {
		order = []bool{true, false}
	}
	for _, isBase := range order {
		addr, pid, name := tr.o.addr, tr.o.pid, "toolstackd"
		if isBase {
			addr, pid, name = tr.baddr, tr.bpid, "baseline"
		}
		res, err := tr.load(addr, pid, t)
		if err != nil {
			return ours, base, fmt.Errorf("%s %s: %w", name, t, err)
		}
		logf("round %d %-8s %-10s %8.0f calls/s  p50 %s p99 %s  server CPU %s/call (client %s/call)  other processes %.2f CPUs  errors %d",
			r+1, t, name, res.rate, ms(res.p50), ms(res.p99), us(res.cpuPerCall()), us(res.clientCPUPerCall()), res.otherLoad(), res.errors)
		tr.results[tputKey{t, isBase}] = append(tr.results[tputKey{t, isBase}], res)
		if isBase {
			base = res
		} else {
			ours = res
		}
	}
	return ours, base, nil
}

// sideBySide loads toolstackd and the baseline over t at the same time,
// so that whatever else the machine does hits both alike, and returns
// their results in that order.
func (tr *tputRun) sideBySide(t transport) ([2]tputResult, error) {
	var wg sync.WaitGroup
	var both [2]tputResult
	var bothErr [2]error
	for j, a := range []struct {
		addr string
		pid  int
	}{{tr.o.addr, tr.o.pid}, {tr.baddr, tr.bpid}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			both[j], bothErr[j] = tr.load(a.addr, a.pid, t)
		}()
	}
	wg.Wait()
	if bothErr[0] != nil || bothErr[1] != nil {
		return both, fmt.Errorf("side by side %s: %v %v", t, bothErr[0], bothErr[1])
	}
	return both, nil
}

// runsTable writes the report's table of every server and transport's
// runs: medians over rounds, with the range of calls/s.
func (tr *tputRun) runsTable(md *strings.Builder) {
	o := tr.o
	fmt.Fprintf(md, "### 1. host.get_record throughput\n\n")
	fmt.Fprintf(md, "%d keep-alive clients, each looping for %s per run; %d rounds, each running, per transport, toolstackd and the baseline back to back (order alternating) and then both at once; medians over rounds (min–max in brackets). Server CPU is the server process's user+system time divided by calls; load generator CPU is tsload's own; other processes' load is the rest of the machine's busy time (other builds and tests), in CPUs, during the run.\n\n",
		o.clients, o.duration, o.rounds)
	fmt.Fprintf(md, "| transport | server | calls/s | p50 latency | p99 latency | server CPU per call | load generator CPU per call | other processes' load (CPUs) | reply bytes | errors |\n")
	fmt.Fprintf(md, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, t := range []transport{jsonRPC, xmlRPC} {
		for _, isBase := range []bool{false, true} {
			rs := tr.results[tputKey{t, isBase}]
			var rates, other []float64
			var p50, p99, cpu, ccpu []time.Duration
			errs := 0
			for _, r := range rs {
				rates = append(rates, r.rate)
				p50 = append(p50, r.p50)
				p99 = append(p99, r.p99)
				cpu = append(cpu, r.cpuPerCall())
				ccpu = append(ccpu, r.clientCPUPerCall())
				other = append(other, r.otherLoad())
				errs += r.errors
			}
			lo, hi := minMaxF(rates)
			name := "toolstackd"
			if isBase {
				name = "baseline (net/http + encoding/json, encoding/xml)"
			}
			fmt.Fprintf(md, "| %s | %s | %.0f (%.0f–%.0f) | %s | %s | %s | %s | %.2f | %d | %d |\n",
				t, name, medianF(rates), lo, hi, ms(medianD(p50)), ms(medianD(p99)), us(medianD(cpu)), us(medianD(ccpu)), medianF(other), rs[0].replyBytes, errs)
		}
	}
}

// ratiosTable writes the report's table of toolstackd/baseline ratios,
// medians of the per-round ones, against the goal of at least half.
func (tr *tputRun) ratiosTable(md *strings.Builder) {
	fmt.Fprintf(md, "\nRatios toolstackd/baseline, medians of the per-round ratios: calls/s in back-to-back runs; calls/s with both servers loaded at once (%d clients each; the machine's other load hits both alike); and CPU efficiency (baseline's server CPU per call ÷ ours).\n\n", tr.o.clients)
	fmt.Fprintf(md, "| transport | calls/s, back to back | calls/s, side by side | CPU efficiency | goal ≥ 0.5 met |\n|---|---:|---:|---:|---|\n")
	for _, t := range []transport{jsonRPC, xmlRPC} {
		lo, hi := minMaxF(tr.ratios[t])
		tlo, thi := minMaxF(tr.together[t])
		clo, chi := minMaxF(tr.cpuRatios[t])
		fmt.Fprintf(md, "| %s | %.2f (%.2f–%.2f) | %.2f (%.2f–%.2f) | %.2f (%.2f–%.2f) | %s |\n", t, medianF(tr.ratios[t]), lo, hi,
			medianF(tr.together[t]), tlo, thi, medianF(tr.cpuRatios[t]), clo, chi,
			yesNo(medianF(tr.ratios[t]) >= 0.5 && medianF(tr.together[t]) >= 0.5))
	}
	lo, hi := minMaxF(tr.xmlVsJSONBase)
	fmt.Fprintf(md, "| our XML-RPC vs the JSON-RPC baseline | %.2f (%.2f–%.2f) | | | %s |\n", medianF(tr.xmlVsJSONBase), lo, hi, yesNo(medianF(tr.xmlVsJSONBase) >= 0.5))
	md.WriteString("\n")
}

func runLatency(o options, cl *client, vmRef string, md *strings.Builder) error {
	type cfg struct {
		name     string
		watchers int
		classes  func(i int) []string
	}
	cfgs := []cfg{
		{"1 watcher, ['vm']", 1, func(int) []string { return []string{"vm"} }},
		{"1 watcher, ['*']", 1, func(int) []string { return []string{"*"} }},
		{fmt.Sprintf("%d watchers, half ['vm'] half ['*']", o.latWatchers), o.latWatchers, func(i int) []string {
			if i%2 == 0 {
				return []string{"vm"}
			}
			return []string{"*"}
		}},
	}
	results := make([][]latResult, len(cfgs))
	logf("latency: %d rounds x %d configurations, %d writes every %s", o.latRounds, len(cfgs), o.latWrites, o.latInterval)
	for r := 0; r < o.latRounds; r++ {
		for ci, c := range cfgs {
			tag := fmt.Sprintf("tsload-r%dc%d", r, ci)
			res, err := eventLatency(o.addr, o.pid, cl.session, vmRef, c.classes, c.watchers, o.latWrites, o.latInterval, tag)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			logf("round %d %-34s p50 %s p99 %s max %s  (from write start p50 %s p99 %s)  delivered %d/%d coalesced %d early %d; write p50 %s p99 %s; daemon CPU/write %s",
				r+1, c.name, ms(res.p50), ms(res.p99), ms(res.max), ms(res.p50s), ms(res.p99s), res.samples, res.watchers*res.writes, res.coalesced, res.early, ms(res.writeP50), ms(res.writeP99), us(res.cpuPerWrite))
			results[ci] = append(results[ci], res)
		}
	}
	fmt.Fprintf(md, "### 2. Write-to-event latency (event.from)\n\n")
	fmt.Fprintf(md, "Writer: VM.set_name_description on the control domain every %s, %d writes per run, JSON-RPC; watchers: event.from(classes, token, 30.0) in a loop, one connection each. Latency: writer's call returned → watcher has read the reply holding that value (or a later one). Medians over %d rounds (min–max).\n\n",
		o.latInterval, o.latWrites, o.latRounds)
	fmt.Fprintf(md, "| watchers | p50 | p99 | max | p50 / p99 from write start | delivered | coalesced | before write returned | write call p50 / p99 | daemon CPU per write | goal p50 < 5 ms, p99 < 20 ms |\n")
	fmt.Fprintf(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for ci, c := range cfgs {
		var p50, p99, mx, p50s, p99s, wp, wp99, cpw []time.Duration
		del, exp, coal, early := 0, 0, 0, 0
		for _, r := range results[ci] {
			p50, p99, mx = append(p50, r.p50), append(p99, r.p99), append(mx, r.max)
			p50s, p99s, wp = append(p50s, r.p50s), append(p99s, r.p99s), append(wp, r.writeP50)
			wp99, cpw = append(wp99, r.writeP99), append(cpw, r.cpuPerWrite)
			del += r.samples
			exp += r.watchers * r.writes
			coal += r.coalesced
			early += r.early
		}
		a, b := minMaxD(p50)
		c2, d := minMaxD(p99)
		fmt.Fprintf(md, "| %s | %s (%s–%s) | %s (%s–%s) | %s | %s / %s | %d/%d | %d | %d | %s / %s | %s | %s |\n",
			c.name, ms(medianD(p50)), ms(a), ms(b), ms(medianD(p99)), ms(c2), ms(d), ms(medianD(mx)),
			ms(medianD(p50s)), ms(medianD(p99s)), del, exp, coal, early, ms(medianD(wp)), ms(medianD(wp99)), us(medianD(cpw)),
			yesNo(medianD(p50) < 5*time.Millisecond && medianD(p99) < 20*time.Millisecond))
	}
	md.WriteString("\n")
	return nil
}

func runPolls(o options, cl *client, hostRef, vmRef string, md *strings.Builder) error {
	logf("polls: opening %d idle event.from long polls", o.polls)
	res, err := idlePolls(cl, o.pid, hostRef, vmRef, o.polls, o.pollTimeout, "tsload-wake")
	logf("polls: opened %d in %s (dial errors %d), early replies %d; RSS %d -> %d kB; fds %d -> %d; threads %d -> %d; %d replies (%d with the value), all within %s of the write starting; the write call took %s; a host.get_record %s after it took %s",
		res.opened, res.openTime.Round(time.Millisecond), res.dialErrors, res.early, res.rssBeforeKB, res.rssWithKB, res.fdsBefore, res.fdsWith,
		res.threadsBefore, res.threadsWith, res.responses, res.withValue, res.deliverAlls.Round(time.Millisecond), res.write.Round(time.Millisecond), res.probeAt.Round(time.Millisecond), res.probe.Round(time.Millisecond))
	if err != nil {
		return err
	}
	fmt.Fprintf(md, "### 3. %d idle event.from long polls\n\n", o.polls)
	fmt.Fprintf(md, "event.from(['vm'], current token, %.0f) on %d connections of their own (JSON-RPC, one session), then one VM.set_name_description on the control domain, made by a separate writer process, and 20 ms later a host.get_record from another process (times compared on the wall clock). Daemon RLIMIT_NOFILE %s.\n\n", o.pollTimeout, o.polls, res.limit)
	fmt.Fprintf(md, "| metric | value |\n|---|---:|\n")
	fmt.Fprintf(md, "| polls opened / asked | %d / %d (dial errors %d) |\n", res.opened, res.n, res.dialErrors)
	fmt.Fprintf(md, "| time to open them all | %s |\n", res.openTime.Round(time.Millisecond))
	fmt.Fprintf(md, "| replies before the write (should be 0) | %d |\n", res.early)
	fmt.Fprintf(md, "| daemon open fds before / with polls | %d / %d |\n", res.fdsBefore, res.fdsWith)
	fmt.Fprintf(md, "| daemon OS threads before / with polls | %d / %d |\n", res.threadsBefore, res.threadsWith)
	fmt.Fprintf(md, "| daemon VmRSS before / with polls | %.1f MiB / %.1f MiB |\n", float64(res.rssBeforeKB)/1024, float64(res.rssWithKB)/1024)
	fmt.Fprintf(md, "| RSS per open poll | %.1f KiB |\n", res.perConnKB())
	fmt.Fprintf(md, "| daemon CPU while idle with polls open | %s over %s |\n", res.cpuIdle, res.idleFor.Round(time.Millisecond))
	fmt.Fprintf(md, "| the waking write call | %s |\n", ms(res.write))
	fmt.Fprintf(md, "| host.get_record started %s after the write: its time | %s |\n", ms(res.probeAt), ms(res.probe))
	fmt.Fprintf(md, "| replies after the write / with the written value | %d / %d |\n", res.responses, res.withValue)
	fmt.Fprintf(md, "| delivery after the write call started: p50 / all | %s / %s |\n", ms(res.deliverP50s), ms(res.deliverAlls))
	fmt.Fprintf(md, "| delivery after the write call returned: p50 / all (0 when before) | %s / %s |\n", ms(res.deliverP50), ms(res.deliverAll))
	fmt.Fprintf(md, "| daemon CPU to answer them all | %s |\n", res.wakeCPU)
	fmt.Fprintf(md, "| daemon VmRSS after they closed | %.1f MiB |\n\n", float64(res.rssAfterKB)/1024)
	return nil
}

func runVMs(o options, cl *client, tmpl string, md *strings.Builder) error {
	var before []string
	if err := cl.call(&before, "VM.get_all", cl.session); err != nil {
		return err
	}
	logf("vms: creating %d VMs with %d parallel VM.create clients", o.vms, o.vmWorkers)
	rss0 := rssKB(o.pid)
	d, err := createVMs(cl, tmpl, o.vms, o.vmWorkers)
	if err != nil {
		return err
	}
	rss1 := rssKB(o.pid)
	logf("vms: created %d in %s (%.0f/s); RSS %d -> %d kB", o.vms, d.Round(time.Millisecond), float64(o.vms)/d.Seconds(), rss0, rss1)
	total := len(before) + o.vms
	rs := map[transport][]garResult{}
	for r := 0; r < o.garRounds; r++ {
		for _, t := range []transport{jsonRPC, xmlRPC} {
			res, err := getAllRecords(o.addr, cl.session, o.pid, t)
			if err != nil {
				return err
			}
			logf("round %d VM.get_all_records %-8s %s, %d bytes, %d records, server CPU %s, RSS %d kB", r+1, t, res.dur.Round(time.Millisecond), res.bytes, res.records, res.cpu, res.rssAfter)
			if res.records != total {
				return fmt.Errorf("VM.get_all_records over %s: %d records, want %d", t, res.records, total)
			}
			rs[t] = append(rs[t], res)
		}
	}
	fmt.Fprintf(md, "### 4. VM.get_all_records with %d VMs\n\n", total)
	fmt.Fprintf(md, "%d VMs created first with VM.create (template record, %d parallel JSON-RPC clients): %s, %.0f VMs/s; daemon RSS %.1f → %.1f MiB. Each call on a fresh connection, timed from sending the request to reading the last byte; median of %d calls per transport (min–max).\n\n",
		o.vms, o.vmWorkers, d.Round(time.Millisecond), float64(o.vms)/d.Seconds(), float64(rss0)/1024, float64(rss1)/1024, o.garRounds)
	fmt.Fprintf(md, "| transport | time | first call | response bytes | bytes per VM | MB/s | server CPU | first call's server CPU |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, t := range []transport{jsonRPC, xmlRPC} {
		var ds, cpu []time.Duration
		for _, r := range rs[t] {
			ds = append(ds, r.dur)
			cpu = append(cpu, r.cpu)
		}
		lo, hi := minMaxD(ds)
		b := rs[t][0].bytes
		// The first call also fills the daemon's cache of encoded records
		// (internal/api/records_enc.go); later ones copy from it.
		first := rs[t][0]
		fmt.Fprintf(md, "| %s | %s (%s–%s) | %s | %d | %d | %.0f | %s | %s |\n", t, medianD(ds).Round(time.Millisecond), lo.Round(time.Millisecond), hi.Round(time.Millisecond),
			first.dur.Round(time.Millisecond), b, b/total, float64(b)/1e6/medianD(ds).Seconds(), medianD(cpu), first.cpu)
	}
	md.WriteString("\n")
	return nil
}

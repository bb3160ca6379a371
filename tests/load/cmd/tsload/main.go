// Command tsload measures toolstackd's XenAPI over the wire: real HTTP on
// loopback, the load generator in this process, the daemon (and a
// minimal net/http + encoding/json baseline server, started by re-running
// this binary as "tsload baseline") in processes of their own.
//
//	tsload -addr 127.0.0.1:PORT -pid DAEMON_PID -password PW [-out results.md]
//
// It runs four measurements and prints markdown tables (medians over
// rounds):
//
//  1. host.get_record calls/s with 16 keep-alive clients, over JSON-RPC and
//     XML-RPC, toolstackd against the baseline: per round, back to back
//     (order alternating) and then both at once, so that machine noise
//     hits both alike; ratios are medians of the per-round ratios.
//  2. write-to-event latency: watchers looping on event.from, a writer
//     calling VM.set_name_description every 10 ms.
//  3. 10,000 idle event.from long polls on their own connections: the
//     daemon's RSS before and with them open, and one write (from a
//     separate process) waking all of them.
//  4. VM.get_all_records with 10,000 VMs (created first with VM.create).
//
// Subcommands used internally: "tsload baseline" (the baseline server),
// "tsload call ADDR METHOD PARAM..." (one call from a process of its own,
// on a line from stdin) and "tsload freeport".
//
// tests/load/run.sh builds everything, starts a daemon and runs this; see
// docs/performance.md, "Issue 3: XenAPI over the wire".
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

type options struct {
	addr, user, password string
	pid                  int
	tests                string
	out                  string

	clients  int
	duration time.Duration
	rounds   int

	latWatchers int
	latWrites   int
	latInterval time.Duration
	latRounds   int

	polls       int
	pollTimeout float64

	vms, vmWorkers, garRounds int
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "freeport" {
		// A free loopback port for run.sh.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(l.Addr().(*net.TCPAddr).Port)
		l.Close()
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "call" {
		if err := runCall(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "call:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "baseline" {
		if err := runBaseline(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "baseline:", err)
			os.Exit(1)
		}
		return
	}
	var o options
	flag.StringVar(&o.addr, "addr", "127.0.0.1:8080", "toolstackd's HTTP address (host:port or http://host:port)")
	flag.IntVar(&o.pid, "pid", 0, "toolstackd's process id (for RSS, CPU time and open files)")
	flag.StringVar(&o.user, "user", "root", "user name")
	flag.StringVar(&o.password, "password", os.Getenv("TOOLSTACKD_ROOT_PASSWORD"), "password (default $TOOLSTACKD_ROOT_PASSWORD)")
	flag.StringVar(&o.tests, "tests", "throughput,latency,polls,vms", "which measurements to run, comma-separated")
	flag.StringVar(&o.out, "out", "", "also write the markdown results to this file")
	flag.IntVar(&o.clients, "clients", 16, "throughput: concurrent clients")
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "throughput: how long each client loops per run")
	flag.IntVar(&o.rounds, "rounds", 4, "throughput: rounds (each runs, per transport, both servers back to back, then side by side)")
	flag.IntVar(&o.latWatchers, "watchers", 100, "latency: watchers in the many-watchers run")
	flag.IntVar(&o.latWrites, "writes", 300, "latency: writes per run")
	flag.DurationVar(&o.latInterval, "write-interval", 10*time.Millisecond, "latency: time between writes")
	flag.IntVar(&o.latRounds, "lat-rounds", 3, "latency: rounds")
	flag.IntVar(&o.polls, "polls", 10000, "idle long polls held open")
	flag.Float64Var(&o.pollTimeout, "poll-timeout", 120, "event.from timeout of the idle polls, seconds")
	flag.IntVar(&o.vms, "vms", 10000, "VMs to create before VM.get_all_records")
	flag.IntVar(&o.vmWorkers, "vm-workers", 16, "parallel VM.create clients")
	flag.IntVar(&o.garRounds, "gar-rounds", 3, "VM.get_all_records calls per transport")
	flag.Parse()
	o.addr = strings.TrimSuffix(strings.TrimPrefix(o.addr, "http://"), "/")
	if o.pid == 0 {
		fmt.Fprintln(os.Stderr, "tsload: -pid is required")
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "tsload:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%s] "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

type vmInfo struct {
	NameLabel       string `json:"name_label"`
	IsATemplate     bool   `json:"is_a_template"`
	IsControlDomain bool   `json:"is_control_domain"`
}

func run(o options) error {
	began := time.Now()
	want := func(name string) bool {
		for _, t := range strings.Split(o.tests, ",") {
			if strings.TrimSpace(t) == name {
				return true
			}
		}
		return false
	}
	lim, err := raiseNofile(uint64(o.polls + 4096))
	if err != nil {
		logf("RLIMIT_NOFILE: %v (now %d)", err, lim)
	}

	cl, err := newClient(o.addr)
	if err != nil {
		return err
	}
	if err := cl.login(o.user, o.password); err != nil {
		return err
	}
	var hosts []string
	if err := cl.call(&hosts, "host.get_all", cl.session); err != nil {
		return err
	}
	host := hosts[0]
	var vms map[string]vmInfo
	if err := cl.call(&vms, "VM.get_all_records", cl.session); err != nil {
		return err
	}
	var dom0, tmpl string
	for ref, v := range vms {
		if v.IsControlDomain {
			dom0 = ref
		}
		if v.IsATemplate && v.NameLabel == "Other install media" {
			tmpl = ref
		}
	}
	if dom0 == "" || tmpl == "" {
		return fmt.Errorf("no control domain or no 'Other install media' template among %d VMs", len(vms))
	}

	var md strings.Builder
	host0, _ := os.Hostname()
	loadavg, _ := os.ReadFile("/proc/loadavg")
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	fmt.Fprintf(&md, "Run %s on %s: %d CPUs (%s), Linux %s, %s; load average at start %s; daemon RLIMIT_NOFILE %s, tsload %d.\n\n",
		began.UTC().Format("2006-01-02 15:04 MST"), host0, runtime.NumCPU(), cpuModel(),
		strings.TrimSpace(string(kernel)), runtime.Version(), strings.Join(strings.Fields(string(loadavg))[:3], " "),
		nofileLimit(o.pid), lim)

	if want("throughput") {
		if err := runThroughput(o, cl, host, &md); err != nil {
			return fmt.Errorf("throughput: %w", err)
		}
	}
	if want("latency") {
		if err := runLatency(o, cl, dom0, &md); err != nil {
			return fmt.Errorf("latency: %w", err)
		}
	}
	if want("polls") {
		if err := runPolls(o, cl, host, dom0, &md); err != nil {
			return fmt.Errorf("polls: %w", err)
		}
	}
	if want("vms") {
		if err := runVMs(o, cl, tmpl, &md); err != nil {
			return fmt.Errorf("vms: %w", err)
		}
	}
	fmt.Fprintf(&md, "Total run time %.0f s.\n\n", time.Since(began).Seconds())
	fmt.Print(md.String())
	if o.out != "" {
		return os.WriteFile(o.out, []byte(md.String()), 0o644)
	}
	return nil
}

// startBaseline runs this binary as the baseline server, serving rec.
func startBaseline(rec json.RawMessage, session, ref string) (addr string, pid int, stop func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return "", 0, nil, err
	}
	dir, err := os.MkdirTemp("", "tsload-baseline")
	if err != nil {
		return "", 0, nil, err
	}
	recFile := filepath.Join(dir, "host-record.json")
	if err := os.WriteFile(recFile, rec, 0o600); err != nil {
		return "", 0, nil, err
	}
	cmd := exec.Command(self, "baseline", "-listen", "127.0.0.1:0", "-record", recFile, "-session", session, "-ref", ref)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", 0, nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", 0, nil, err
	}
	stop = func() {
		cmd.Process.Kill()
		cmd.Wait()
		os.RemoveAll(dir)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		stop()
		return "", 0, nil, fmt.Errorf("baseline did not start: %v", err)
	}
	go io.Copy(io.Discard, out)
	return strings.TrimSpace(strings.TrimPrefix(line, "listening ")), cmd.Process.Pid, stop, nil
}

// runCall is "tsload call ADDR METHOD PARAM...": it connects, waits for a
// line on stdin, makes the JSON-RPC call (string parameters) and prints
// the wall-clock times, in Unix nanoseconds, at which it sent the call and
// had the reply. It is the writer of the idle-polls test, kept out of the
// process that holds the polls so that the client's own wake-up of
// thousands of goroutines cannot delay it.
func runCall(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: tsload call ADDR METHOD [PARAM ...]")
	}
	cl, err := newClient(args[0])
	if err != nil {
		return err
	}
	params := make([]any, len(args)-2)
	for i, a := range args[2:] {
		params[i] = a
	}
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	t0 := time.Now()
	err = cl.call(nil, args[1], params...)
	t1 := time.Now()
	if err != nil {
		return err
	}
	fmt.Printf("%d %d\n", t0.UnixNano(), t1.UnixNano())
	return nil
}

// remoteCall is a "tsload call" process, connected and waiting for the
// word to make its call.
type remoteCall struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out io.Reader
}

// startRemoteCall starts "tsload call" for method(params...).
func startRemoteCall(addr, method string, params ...string) (*remoteCall, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, append([]string{"call", addr, method}, params...)...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &remoteCall{cmd, in, out}, nil
}

// fire tells the process to make its call now.
func (r *remoteCall) fire() error {
	_, err := io.WriteString(r.in, "go\n")
	return err
}

// result waits for the call and returns when it started and ended.
func (r *remoteCall) result() (time.Time, time.Time, error) {
	defer r.cmd.Wait()
	var a, b int64
	if _, err := fmt.Fscan(r.out, &a, &b); err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("tsload call process: %v", err)
	}
	return time.Unix(0, a), time.Unix(0, b), nil
}

func (r *remoteCall) kill() {
	r.cmd.Process.Kill()
	r.cmd.Wait()
}

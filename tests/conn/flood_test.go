package conn_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The flood client runs in child processes (this test binary again), so
// that each has its own file limit: 20,000 connections do not fit in one
// process under the container's limit of 20,000.
const childEnv = "TOOLSTACKD_CONN_CHILD"

// A client process: env TOOLSTACKD_CONN_CHILD="ADDR IP:COUNT IP:COUNT ...".
// It opens COUNT keep-alive connections from each source IP, makes one
// request on each, keeps those that were answered, prints
// "ready IP:served:refused ...", then on each line of stdin prints
// "open IP:n ..." (connections the daemon still holds open) and exits at
// end of input.
func TestFloodChild(t *testing.T) {
	spec := os.Getenv(childEnv)
	if spec == "" {
		t.Skip("runs as a child of TestConnectionFlood")
	}
	raiseNofile()
	f := strings.Fields(spec)
	addr := f[0]
	type job struct {
		ip string
		n  int
	}
	var jobs []job
	for _, s := range f[1:] {
		ip, n, _ := strings.Cut(s, ":")
		c, _ := strconv.Atoi(n)
		jobs = append(jobs, job{ip, c})
	}
	var mu sync.Mutex
	held := map[string][]net.Conn{}
	served, refused := map[string]int{}, map[string]int{}
	work := make(chan string)
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ip := range work {
				c, ok := openOne(addr, ip)
				mu.Lock()
				if ok {
					served[ip]++
					held[ip] = append(held[ip], c)
				} else {
					refused[ip]++
				}
				mu.Unlock()
			}
		}()
	}
	for _, j := range jobs {
		for range j.n {
			work <- j.ip
		}
	}
	close(work)
	wg.Wait()
	out := []string{"ready"}
	for _, j := range jobs {
		out = append(out, fmt.Sprintf("%s:%d:%d", j.ip, served[j.ip], refused[j.ip]))
	}
	fmt.Println(strings.Join(out, " "))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		out := []string{"open"}
		for _, j := range jobs {
			out = append(out, fmt.Sprintf("%s:%d", j.ip, stillOpen(held[j.ip])))
		}
		fmt.Println(strings.Join(out, " "))
	}
}

// openOne connects from ip, makes one request and reports whether it was
// answered (the connection is then idle, kept alive by the daemon).
func openOne(addr, ip string) (net.Conn, bool) {
	dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	c, err := dialer.Dial("tcp", addr)
	if err != nil {
		return nil, false
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		c.Close()
		return nil, false
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.Close {
		c.Close()
		return nil, false
	}
	io.Copy(io.Discard, resp.Body)
	c.SetDeadline(time.Time{})
	return c, true
}

// stillOpen counts the connections the daemon has not closed, peeking at
// each socket without waiting.
func stillOpen(cs []net.Conn) int {
	n := 0
	var b [1]byte
	for _, c := range cs {
		rc, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			continue
		}
		open := false
		rc.Control(func(fd uintptr) {
			_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			open = err == syscall.EAGAIN
		})
		if open {
			n++
		}
	}
	return n
}

func raiseNofile() {
	var r syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r) == nil && r.Cur < r.Max {
		r.Cur = r.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r)
	}
}

type child struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startChild(t *testing.T, addr string, share map[string]int) *child {
	t.Helper()
	spec := []string{addr}
	for ip, n := range share {
		spec = append(spec, fmt.Sprintf("%s:%d", ip, n))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFloodChild$", "-test.v=false")
	cmd.Env = append(os.Environ(), childEnv+"="+strings.Join(spec, " "))
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	return c
}

// line reads the child's next line starting with word, as IP -> fields.
func (c *child) line(t *testing.T, word string) map[string][]int {
	t.Helper()
	for c.out.Scan() {
		f := strings.Fields(c.out.Text())
		if len(f) == 0 || f[0] != word {
			continue
		}
		m := map[string][]int{}
		for _, s := range f[1:] {
			parts := strings.Split(s, ":")
			for _, p := range parts[1:] {
				n, _ := strconv.Atoi(p)
				m[parts[0]] = append(m[parts[0]], n)
			}
		}
		return m
	}
	t.Fatalf("the client process ended without %q", word)
	return nil
}

// TestConnectionFlood opens N idle keep-alive connections (default 3,000;
// TOOLSTACKD_CONN_FLOOD=20000 for the full run) from many source addresses
// against a daemon whose file limit is just above what the global cap
// allows: one address is capped per client, the total is capped below the
// file limit by closing idle connections, another client's calls still
// work during the flood, and the daemon's files return to the baseline
// once the clients go.
func TestConnectionFlood(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("child")
	}
	n := 3000
	if s := os.Getenv("TOOLSTACKD_CONN_FLOOD"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	perClient, nofile, procs := 200, 2400, 2
	if n >= 10000 {
		perClient, nofile, procs = 512, 20000, 4
	}
	// What the daemon's cap will be (netguard.MaxConnsForLimit).
	maxConns := nofile - max(nofile/10, 512)
	raiseNofile()
	var r syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r)
	if int(r.Max) < nofile {
		t.Skipf("the file limit here (%d) is below the %d the test needs", r.Max, nofile)
	}
	d := start(t, nofile, "--max-conns-per-client="+strconv.Itoa(perClient), "--idle-timeout=30s", "--header-timeout=5s")
	sess := d.login(t)
	time.Sleep(200 * time.Millisecond)
	baseline := d.FDCount()

	// One address tries twice its cap; the rest is spread below the cap
	// per address over as many addresses as it takes.
	shares := map[string]int{"127.0.0.2": 2 * perClient}
	rest := n - 2*perClient
	per := perClient * 9 / 10
	for i := 0; rest > 0; i++ {
		k := min(per, rest)
		shares[fmt.Sprintf("127.0.%d.%d", 1+i/200, 3+i%200)] = k
		rest -= k
	}
	ips := make([]string, 0, len(shares))
	for ip := range shares {
		ips = append(ips, ip)
	}
	sort.Strings(ips)
	parts := make([]map[string]int, procs)
	for i, ip := range ips {
		if parts[i%procs] == nil {
			parts[i%procs] = map[string]int{}
		}
		parts[i%procs][ip] = shares[ip]
	}

	// While the flood runs, another client keeps calling.
	stop := make(chan struct{})
	var lat []time.Duration
	var callErrs []error
	var bg sync.WaitGroup
	bg.Add(1)
	go func() {
		defer bg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			begin := time.Now()
			_, err := d.call(t, "host.get_all", sess)
			if err != nil {
				callErrs = append(callErrs, err)
				continue
			}
			lat = append(lat, time.Since(begin))
		}
	}()
	begin := time.Now()
	var children []*child
	for _, p := range parts {
		children = append(children, startChild(t, d.Addr, p))
	}
	ready := map[string][]int{}
	maxFDs := 0
	for _, c := range children {
		for ip, v := range c.line(t, "ready") {
			ready[ip] = v
		}
		maxFDs = max(maxFDs, d.FDCount())
	}
	opened := time.Since(begin)
	// Let the dust settle, then look at what is held.
	time.Sleep(500 * time.Millisecond)
	held := d.FDCount()
	maxFDs = max(maxFDs, held)
	open := map[string]int{}
	total := 0
	for _, c := range children {
		io.WriteString(c.in, "check\n")
		for ip, v := range c.line(t, "open") {
			open[ip] = v[0]
			total += v[0]
		}
	}
	close(stop)
	bg.Wait()

	served, refused := 0, 0
	for _, v := range ready {
		served += v[0]
		refused += v[1]
	}
	t.Logf("%d connections from %d addresses in %v: %d answered, %d refused at once; %d still open; daemon files %d (baseline %d, peak seen %d, limit %d, cap %d)",
		n, len(shares), opened.Round(time.Millisecond), served, refused, total, held, baseline, maxFDs, nofile, maxConns)
	if len(callErrs) > 0 {
		t.Errorf("another client's calls failed during the flood: %d, first %v", len(callErrs), callErrs[0])
	}
	if len(lat) < 3 {
		t.Errorf("only %d calls of another client went through during the flood", len(lat))
	} else {
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		t.Logf("another client during the flood: %d calls, p50 %v, max %v", len(lat), lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond))
	}
	// The per-client cap: the address that tried twice its cap got at
	// most the cap, and at least its cap was refused.
	if v := ready["127.0.0.2"]; v[0] > perClient || v[1] < perClient {
		t.Errorf("127.0.0.2: %d answered, %d refused; cap %d", v[0], v[1], perClient)
	}
	for ip, k := range open {
		if k > perClient {
			t.Errorf("%s holds %d connections, cap %d", ip, k, perClient)
		}
	}
	// The global cap: well under the file limit.
	if total > maxConns {
		t.Errorf("%d connections held, cap %d", total, maxConns)
	}
	if maxFDs >= nofile-100 {
		t.Errorf("the daemon's open files reached %d, limit %d", maxFDs, nofile)
	}
	if served+refused != n {
		t.Errorf("answered %d + refused %d != %d", served, refused, n)
	}
	if n > maxConns && total < maxConns*8/10 {
		t.Errorf("only %d held, expected near the cap %d (idle reclaim too eager?)", total, maxConns)
	}
	// The clients go: the daemon's files come back near the baseline
	// (about 2 s on a quiet machine; the idle timeout is 30 s).
	gone := time.Now()
	for _, c := range children {
		c.in.Close()
		c.cmd.Wait()
	}
	for time.Since(gone) < 25*time.Second && d.FDCount() > baseline+10 {
		time.Sleep(100 * time.Millisecond)
	}
	if f := d.FDCount(); f > baseline+10 {
		t.Errorf("the daemon still has %d files open %v after the clients left (baseline %d)", f, time.Since(gone).Round(time.Millisecond), baseline)
	} else {
		t.Logf("files back to %d (baseline %d) %v after the clients left", f, baseline, time.Since(gone).Round(time.Millisecond))
	}
	// And the daemon still serves.
	d.must(t, "host.get_all", sess)
}

// TestIdleFigures measures, for docs/performance.md, what N idle
// keep-alive connections from three addresses cost the daemon: how many it
// holds, its open files and its resident memory per held connection. Run
// it against any build with TOOLSTACKD_BIN (extra daemon flags in
// TOOLSTACKD_CONN_ARGS, separated by spaces):
//
//	TOOLSTACKD_CONN_FIGURES=5000 go test -v -run TestIdleFigures ./tests/conn
func TestIdleFigures(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("TOOLSTACKD_CONN_FIGURES"))
	if n <= 0 || os.Getenv(childEnv) != "" {
		t.Skip("set TOOLSTACKD_CONN_FIGURES=N to measure")
	}
	d := start(t, 0, strings.Fields(os.Getenv("TOOLSTACKD_CONN_ARGS"))...)
	sess := d.login(t)
	d.must(t, "host.get_all", sess)
	time.Sleep(time.Second)
	fds0, rss0 := d.FDCount(), d.RSS()
	share := map[string]int{}
	for i, ip := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		share[ip] = n/3 + map[bool]int{true: n % 3}[i == 0]
	}
	c := startChild(t, d.Addr, share)
	ready := c.line(t, "ready")
	time.Sleep(2 * time.Second)
	io.WriteString(c.in, "check\n")
	open := c.line(t, "open")
	fds1, rss1 := d.FDCount(), d.RSS()
	held, served := 0, 0
	for ip, v := range open {
		held += v[0]
		served += ready[ip][0]
	}
	per := int64(0)
	if held > 0 {
		per = (rss1 - rss0) / int64(held)
	}
	t.Logf("FIGURES N=%d answered=%d held=%d fds %d -> %d, RSS %.1f MiB -> %.1f MiB, %d bytes per held connection",
		n, served, held, fds0, fds1, float64(rss0)/(1<<20), float64(rss1)/(1<<20), per)
}

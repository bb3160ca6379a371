package netlinkx_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"toolstackd/internal/network"
	"toolstackd/internal/testkit/netnstest"
)

// udpIn makes a UDP socket in the namespace ns, bound to addr.
func udpIn(t *testing.T, ns *netnstest.Namespace, addr string) *net.UDPConn {
	t.Helper()
	fd, err := ns.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	ua, err := net.ResolveUDPAddr("udp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	sa := &unix.SockaddrInet4{Port: ua.Port}
	copy(sa.Addr[:], ua.IP.To4())
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	if err := unix.Bind(fd, sa); err != nil {
		_ = unix.Close(fd)
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "udp")
	pc, err := net.FilePacketConn(f)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	return pc.(*net.UDPConn)
}

// throughput floods to from the guest's socket for d and returns the
// bytes per second the host's socket received, not counting the first
// skip bytes (the bucket's burst).
func throughput(t *testing.T, guest, host *net.UDPConn, to *net.UDPAddr, d time.Duration, skip uint64) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var got atomic.Uint64
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			_ = host.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			n, _, err := host.ReadFromUDP(buf)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					continue
				}
				return
			}
			got.Add(uint64(n))
		}
	}()
	payload := make([]byte, 1400)
	start := time.Now()
	for ctx.Err() == nil {
		_, _ = guest.WriteToUDP(payload, to)
	}
	elapsed := time.Since(start)
	// What is still queued arrives after the sender stopped; it counted
	// as sent within d, so wait for it to drain (the tbf's latency is
	// bounded) before stopping the count.
	<-done
	b := got.Load()
	if b > skip {
		b -= skip
	} else {
		b = 0
	}
	return float64(b) / elapsed.Seconds()
}

// TestRateLimitDatapath: a "guest" namespace joined to the host's by a
// veth standing in for a VM's tap floods UDP at the host at full speed;
// with a rate limit on the tap the host receives at that rate (at most
// 15 % over it; on a quiet machine within 3 % under it, and a busy one
// may send less, so only half of it is asked for), changing the limit
// changes the rate, removing it lifts it and removes the IFB device with
// it.
func TestRateLimitDatapath(t *testing.T) {
	host, guest := netnstest.New(t), netnstest.New(t)
	const tap = "tsvif9.0"
	netnstest.Veth(t, host, tap, guest, "eth0")
	netnstest.Exec(t, host, "ip", "addr", "add", "10.99.0.1/24", "dev", tap)
	netnstest.Exec(t, guest, "ip", "addr", "add", "10.99.0.2/24", "dev", "eth0")
	l := open(t, host)
	if err := l.Adopt(tap); err != nil {
		t.Fatal(err)
	}
	hc := udpIn(t, host, "10.99.0.1:5001")
	gc := udpIn(t, guest, "10.99.0.2:5002")
	to := &net.UDPAddr{IP: net.IPv4(10, 99, 0, 1), Port: 5001}
	netnstest.Ping(t, guest, "10.99.0.1")

	free := throughput(t, gc, hc, to, time.Second, 0)
	t.Logf("figure: unlimited: %.1f MB/s", free/1e6)

	for _, kbps := range []uint64{1024, 4096} {
		r, note := network.RateFor("ratelimit", map[string]string{"kbps": itoa(kbps)})
		if note != "" {
			t.Fatal(note)
		}
		if free < 3*float64(r.Bytes) {
			t.Skipf("this machine sends only %.1f MB/s through a veth: too slow to check a %d KiB/s limit", free/1e6, kbps)
		}
		if err := l.SetRate(tap, r.Bytes, r.Burst); err != nil {
			if errors.Is(err, network.ErrUnsupported) {
				t.Skipf("rate limits not exercised: %v", err)
			}
			t.Fatal(err)
		}
		got := throughput(t, gc, hc, to, 3*time.Second, r.Burst)
		ratio := got / float64(r.Bytes)
		t.Logf("figure: limit %d KiB/s (%d B/s, burst %d): received %.0f B/s, ratio %.3f", kbps, r.Bytes, r.Burst, got, ratio)
		if ratio < 0.5 || ratio > 1.15 {
			t.Fatalf("limit %d B/s: received %.0f B/s", r.Bytes, got)
		}
	}
	out := netnstest.Exec(t, host, "ip", "-br", "link")
	if !strings.Contains(out, "tsq9.0") {
		t.Fatalf("no IFB device tsq9.0:\n%s", out)
	}
	if err := l.SetRate(tap, 0, 0); err != nil {
		t.Fatal(err)
	}
	if out := netnstest.Exec(t, host, "ip", "-br", "link"); strings.Contains(out, "tsq9.0") {
		t.Fatalf("IFB device left after the limit was removed:\n%s", out)
	}
	if out := netnstest.Exec(t, host, "tc", "qdisc", "show", "dev", tap); strings.Contains(out, "ingress") {
		t.Fatalf("ingress qdisc left:\n%s", out)
	}
	lifted := throughput(t, gc, hc, to, time.Second, 0)
	if lifted < 2*4096*1024 {
		t.Fatalf("without a limit only %.0f B/s", lifted)
	}
	// Removing what is not there is not an error.
	if err := l.SetRate(tap, 0, 0); err != nil {
		t.Fatal(err)
	}
}

func itoa(v uint64) string {
	b := []byte{}
	for {
		b = append([]byte{byte('0' + v%10)}, b...)
		v /= 10
		if v == 0 {
			return string(b)
		}
	}
}

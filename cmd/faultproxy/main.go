// Command faultproxy runs one fault-injecting TCP proxy (package
// internal/testkit/faultproxy) for manual and long runs, steered by commands on its
// standard input:
//
//	faultproxy -listen 127.0.0.2:4431 -target 127.0.0.2:443
//	> set 127.0.0.3 blackhole           cut connections from 127.0.0.3
//	> set 127.0.0.4 delay=75ms±50ms     delay them (also delay=75ms+-50ms)
//	> set * drop=0.5                    all sources: clear their rules, then drop
//	> default delay=10ms                sources without a rule of their own
//	> clear 127.0.0.3                   back to the default
//	> reset [SOURCE]                    reset connections now (all, or from SOURCE)
//	> heal                              lift every rule
//	> show | stats | help
//
// A fault is "pass", "blackhole", or any of delay=D[±J], jitter=J and
// drop=P. The proxy stops at end of input, SIGINT or SIGTERM.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"toolstackd/internal/testkit/faultproxy"
)

func main() {
	var cfg faultproxy.Config
	flag.StringVar(&cfg.Listen, "listen", "", "address to accept connections on (host:port)")
	flag.StringVar(&cfg.Target, "target", "", "address to forward connections to (host:port)")
	flag.IntVar(&cfg.MaxConns, "max-conns", 0, "most connections held at once (0: default 128)")
	flag.IntVar(&cfg.ChunkSize, "chunk", 0, "largest chunk forwarded at once, bytes (0: default 16 KiB)")
	flag.DurationVar(&cfg.DialTimeout, "dial-timeout", 0, "timeout connecting to the target (0: default 5s)")
	flag.Uint64Var(&cfg.Seed, "seed", 0, "seed of jitter and drops (0: random)")
	fault := flag.String("fault", "pass", "initial fault for all sources")
	flag.Parse()

	f, err := faultproxy.ParseFault(*fault)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	p, err := faultproxy.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = p.SetAll(f)
	fmt.Fprintf(os.Stderr, "faultproxy: %s → %s (%v)\n", p.Addr(), p.Target(), f)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	inputDone := make(chan struct{})
	go func() {
		defer close(inputDone)
		interpret(p, os.Stdin, os.Stdout)
	}()
	select {
	case <-ctx.Done():
	case <-inputDone:
	}
	if err := p.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// interpret runs the commands read from in against p, answering on out,
// until in ends.
func interpret(p *faultproxy.Proxy, in io.Reader, out io.Writer) {
	sc := bufio.NewScanner(in) // lines over 64 KiB end the input
	for sc.Scan() {
		msg := command(p, sc.Text())
		if msg == "" {
			continue
		}
		if _, err := fmt.Fprintln(out, msg); err != nil {
			return // nobody is listening any more
		}
	}
}

// command runs one command line and returns its answer.
func command(p *faultproxy.Proxy, line string) string {
	verb, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
	rest = strings.TrimSpace(rest)
	switch verb {
	case "", "#":
		return ""
	case "help":
		return "set SOURCE|* FAULT; default FAULT; clear SOURCE; reset [SOURCE]; heal; show; stats"
	case "set":
		src, spec, _ := strings.Cut(rest, " ")
		f, err := faultproxy.ParseFault(spec)
		if err != nil {
			return "error: " + err.Error()
		}
		if src == "*" {
			err = p.SetAll(f)
		} else {
			var a netip.Addr
			if a, err = netip.ParseAddr(src); err == nil {
				err = p.SetFault(a, f)
			}
		}
		if err != nil {
			return "error: " + err.Error()
		}
		return "ok"
	case "default":
		f, err := faultproxy.ParseFault(rest)
		if err == nil {
			err = p.SetDefault(f)
		}
		if err != nil {
			return "error: " + err.Error()
		}
		return "ok"
	case "clear":
		a, err := netip.ParseAddr(rest)
		if err != nil {
			return "error: " + err.Error()
		}
		p.ClearFault(a)
		return "ok"
	case "reset":
		if rest == "" {
			return fmt.Sprintf("reset %d", p.ResetConns())
		}
		a, err := netip.ParseAddr(rest)
		if err != nil {
			return "error: " + err.Error()
		}
		return fmt.Sprintf("reset %d", p.ResetFrom(a))
	case "heal":
		p.Heal()
		return "ok"
	case "show":
		if rest == "" {
			return "error: show SOURCE"
		}
		a, err := netip.ParseAddr(rest)
		if err != nil {
			return "error: " + err.Error()
		}
		return p.FaultFor(a).String()
	case "stats":
		s := p.Stats()
		return fmt.Sprintf("%s accepted=%d refused=%d dial_fails=%d resets=%d active=%d bytes=%d",
			time.Now().Format(time.TimeOnly), s.Accepted, s.Refused, s.DialFails, s.Resets, s.Active, s.Bytes)
	}
	return fmt.Sprintf("error: unknown command %q (try help)", verb)
}

package storage

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/nbd"
	"toolstackd/internal/xerr"
)

func (e *suspendEnv) userVDI(size int64) string {
	e.t.Helper()
	sr := e.d.Snapshot().All(dm.Pool.Class)[0].String(dm.Pool.SuspendImageSR)
	v, _, err := e.srv.Invoke(context.Background(), e.sess, "VDI.create", map[string]any{"SR": sr, "virtual_size": size, "type": "user",
		"name_label": "mirror target", "name_description": "", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	if err != nil {
		e.t.Fatal(err)
	}
	return v.(string)
}

// pipeDial is a dialer for a Relay that reaches exp through an in-memory
// connection, as the orchestrator reaches it through the pool connection.
func pipeDial(ctx context.Context, exp *Export) func(context.Context) (net.Conn, error) {
	return func(context.Context) (net.Conn, error) {
		a, b := net.Pipe()
		go func() { _ = exp.Serve(ctx, b) }()
		return a, nil
	}
}

func mirrorDPs(s *Service) []string {
	var out []string
	for _, dps := range s.Datapaths() {
		for dp := range dps {
			if strings.HasPrefix(dp, "mirror/") {
				out = append(out, dp)
			}
		}
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestExportLifecycle: a VDI exported for a mirror takes writes through a
// relay and a tunnel, keeps them after Close, is the VDI's only writer
// while exported, and leaves no process, socket or datapath behind.
func TestExportLifecycle(t *testing.T) {
	e := newSuspendEnv(t)
	ctx := context.Background()
	vdi := e.userVDI(64 << 20)

	exp, err := e.s.Export(ctx, vdi)
	if err != nil {
		t.Fatal(err)
	}
	if exp.Size() != 64<<20 {
		t.Fatalf("export size %d", exp.Size())
	}
	if got := mirrorDPs(e.s); len(got) != 1 {
		t.Fatalf("mirror datapaths %v", got)
	}
	if _, err := e.s.Export(ctx, vdi); !xerr.HasCode(err, xerr.VDIInUse) {
		t.Fatalf("second export: %v, want VDI_IN_USE", err)
	}
	sock := exp.URI().Socket

	relay, err := NewRelay("", pipeDial(ctx, exp))
	if err != nil {
		t.Fatal(err)
	}
	c, err := nbd.Dial(ctx, relay.URI())
	if err != nil {
		t.Fatal(err)
	}
	if c.Size() != 64<<20 || c.ReadOnly() {
		t.Fatalf("through the relay: size %d read-only %v", c.Size(), c.ReadOnly())
	}
	data := make([]byte, 3<<20)
	rand.Read(data)
	if _, err := c.WriteAt(data, 5<<20); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	rsock := relay.URI().Socket
	if err := relay.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rsock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("relay socket left: %v", err)
	}
	server := exp.server
	if err := exp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := exp.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	select {
	case <-server.exited:
	default:
		t.Fatal("qemu-nbd still runs after Close")
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("export socket left: %v", err)
	}
	if got := mirrorDPs(e.s); len(got) != 0 {
		t.Fatalf("mirror datapaths left: %v", got)
	}
	a, b := net.Pipe()
	if err := exp.Serve(ctx, b); err == nil {
		t.Fatal("Serve after Close succeeded")
	}
	_ = a.Close()

	// The data is the VDI's: a new export reads it back.
	exp2, err := e.s.Export(ctx, vdi)
	if err != nil {
		t.Fatal(err)
	}
	defer exp2.Close()
	c2, err := nbd.Dial(ctx, exp2.URI())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	got := make([]byte, len(data))
	if _, err := c2.ReadAt(got, 5<<20); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the VDI does not hold what was written through the export")
	}
}

// TestExportHostile: garbage on a tunnel, too many tunnels, a relay whose
// far end cannot be reached and a VDI that does not exist all fail
// cleanly, and Close cuts tunnels that are still open.
func TestExportHostile(t *testing.T) {
	e := newSuspendEnv(t)
	ctx := context.Background()
	if _, err := e.s.Export(ctx, "OpaqueRef:nonsense"); err == nil {
		t.Fatal("export of an unknown VDI succeeded")
	}
	exp, err := e.s.Export(ctx, e.userVDI(16<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Close()

	// Garbage instead of a handshake: the server hangs up, Serve returns.
	a, b := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- exp.Serve(ctx, b) }()
	go func() { _, _ = a.Write(bytes.Repeat([]byte("GET / HTTP/1.1\r\n"), 4096)) }()
	buf := make([]byte, 4096)
	_ = a.SetReadDeadline(time.Now().Add(20 * time.Second))
	for {
		if _, err := a.Read(buf); err != nil {
			break
		}
	}
	_ = a.Close()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return after garbage")
	}

	// MaxTunnels at once, then a refusal; Close ends those that are open.
	var peers []net.Conn
	serving := make(chan error, MaxTunnels)
	for range MaxTunnels {
		a, b := net.Pipe()
		peers = append(peers, a)
		go func() { serving <- exp.Serve(ctx, b) }()
	}
	waitFor(t, "the tunnels to open", func() bool {
		exp.t.mu.Lock()
		defer exp.t.mu.Unlock()
		return len(exp.t.conns) == 2*MaxTunnels
	})
	x, y := net.Pipe()
	if err := exp.Serve(ctx, y); err == nil || !strings.Contains(err.Error(), "too many") {
		t.Fatalf("tunnel beyond the bound: %v", err)
	}
	_ = x.Close()
	if err := exp.Close(); err != nil {
		t.Fatal(err)
	}
	for range MaxTunnels {
		select {
		case <-serving:
		case <-time.After(20 * time.Second):
			t.Fatal("Close left a tunnel open")
		}
	}
	for _, p := range peers {
		_ = p.Close()
	}

	// A relay whose destination is unreachable: the client is cut off.
	relay, err := NewRelay("", func(context.Context) (net.Conn, error) { return nil, errors.New("no route") })
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := nbd.Dial(dctx, relay.URI()); err == nil {
		t.Fatal("handshake through a relay to nowhere succeeded")
	} else if dctx.Err() != nil {
		t.Fatalf("the relay held the client until the deadline: %v", err)
	}
	// A far end that accepts and never greets is cut off, so the client
	// is not held.
	silent := func(context.Context) (net.Conn, error) {
		a, b := net.Pipe()
		go func() { _, _ = io.Copy(io.Discard, b) }()
		return a, nil
	}
	mute, err := newRelay("", silent, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	began := time.Now()
	if _, err := nbd.Dial(dctx, mute.URI()); err == nil || dctx.Err() != nil {
		t.Fatalf("handshake through a relay to a silent end: %v after %v", err, time.Since(began))
	}
	if _, err := NewRelay("", nil); err == nil {
		t.Fatal("relay without a dialer")
	}
}

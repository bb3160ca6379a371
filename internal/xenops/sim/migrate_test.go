package sim

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"toolstackd/internal/xenops/backend"
)

// startDomain makes a running domain (or, with incoming, one waiting for
// a migration) on s.
func startDomain(t *testing.T, s *Simulator, uuid string, incoming bool) {
	t.Helper()
	ctx := context.Background()
	spec := &backend.Spec{UUID: uuid, VMRef: "OpaqueRef:" + uuid, Memory: 256 << 20, Target: 256 << 20, VCPUs: 2, Incoming: incoming}
	if incoming {
		spec.Target, spec.VCPUs = 128<<20, 1 // the source's figures must win
	}
	if _, err := s.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := s.StartDeviceModel(ctx, uuid); err != nil {
		t.Fatal(err)
	}
	if !incoming {
		if err := s.Unpause(ctx, uuid); err != nil {
			t.Fatal(err)
		}
	}
}

func newSim(t *testing.T, cfg Config) *Simulator {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// migrate runs both halves over a net.Pipe and returns their errors.
func migrate(ctx context.Context, src, dst *Simulator, uuid string, progress func(float64)) (sendErr, recvErr error) {
	a, b := net.Pipe()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		recvErr = dst.ReceiveLive(ctx, uuid, b)
		_ = b.Close()
	}()
	sendErr = src.SendLive(ctx, uuid, a, backend.MigrateOptions{}, progress)
	_ = a.Close()
	wg.Wait()
	return sendErr, recvErr
}

func TestMigrateRoundTrip(t *testing.T) {
	src := newSim(t, Config{StateDir: t.TempDir()})
	dstDir := t.TempDir()
	dst := newSim(t, Config{StateDir: dstDir})
	const uuid = "11111111-2222-3333-4444-555555555555"
	startDomain(t, src, uuid, false)
	if err := src.MarkComplete(uuid); err != nil {
		t.Fatal(err)
	}
	before, _ := src.Info(uuid)
	startDomain(t, dst, uuid, true)

	var steps []float64
	sendErr, recvErr := migrate(context.Background(), src, dst, uuid, func(f float64) { steps = append(steps, f) })
	if sendErr != nil || recvErr != nil {
		t.Fatalf("send %v, receive %v", sendErr, recvErr)
	}
	if len(steps) != migrateSteps || steps[len(steps)-1] != 1 {
		t.Errorf("progress %v", steps)
	}
	got, _ := dst.Info(uuid)
	if got.State != backend.DomainPaused || got.VCPUs != 2 || got.Memory != 256<<20 || !got.StartTime.Equal(before.StartTime) {
		t.Errorf("destination %+v, source was %+v", got, before)
	}
	if spec, _ := dst.DomainSpec(uuid); spec.Incoming {
		t.Error("destination still waits for its state")
	}
	old, _ := src.Info(uuid)
	if old.State != backend.DomainPaused || !old.Migrated {
		t.Errorf("source after the send: %+v", old)
	}
	if err := src.SendLive(context.Background(), uuid, io.Discard, backend.MigrateOptions{}, nil); err == nil {
		t.Error("a migrated domain was sent again")
	}
	if err := dst.Unpause(context.Background(), uuid); err != nil {
		t.Fatal(err)
	}
	if err := src.Destroy(context.Background(), uuid); err != nil {
		t.Fatal(err)
	}
	if _, ok := src.Info(uuid); ok {
		t.Error("source domain left after Destroy")
	}
}

// A restarted simulator drops a domain whose incoming migration never
// finished, even one marked complete.
func TestMigrateIncomingDroppedAtRestart(t *testing.T) {
	dir := t.TempDir()
	dst := newSim(t, Config{StateDir: dir})
	const uuid = "21111111-2222-3333-4444-555555555555"
	startDomain(t, dst, uuid, true)
	if err := dst.MarkComplete(uuid); err != nil {
		t.Fatal(err)
	}
	again := newSim(t, Config{StateDir: dir})
	if _, ok := again.Info(uuid); ok {
		t.Error("an unfinished incoming domain survived a restart")
	}
}

func TestMigrateBadStreams(t *testing.T) {
	const uuid = "31111111-2222-3333-4444-555555555555"
	// A whole stream, to cut and corrupt.
	src := newSim(t, Config{})
	startDomain(t, src, uuid, false)
	var whole bytes.Buffer
	if err := src.SendLive(context.Background(), uuid, &whole, backend.MigrateOptions{}, nil); err != nil {
		t.Fatal(err)
	}
	good := whole.Bytes()
	hostile := func(name string, stream []byte, want string) {
		t.Run(name, func(t *testing.T) {
			dst := newSim(t, Config{})
			startDomain(t, dst, uuid, true)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := dst.ReceiveLive(ctx, uuid, bytes.NewReader(stream))
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("got %v, want an error with %q", err, want)
			}
			if spec, _ := dst.DomainSpec(uuid); !spec.Incoming {
				t.Error("a failed receive changed the domain")
			}
		})
	}
	for _, cut := range []int{0, 5, 30, len(good) / 2, len(good) - 1} {
		hostile("truncated", good[:cut], "truncated")
	}
	hostile("garbage", bytes.Repeat([]byte("x"), 4096), "not a toolstackd migration stream")
	qemuHdr := append([]byte("TOOLSTACKD-MIGRATE-1\n\x04qemu"), 'E', 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0)
	hostile("other backend", qemuHdr, `"qemu" backend's stream`)
	hdr := []byte("TOOLSTACKD-MIGRATE-1\n\x09simulator")
	hostile("huge frame", append(append([]byte{}, hdr...), 'D', 0xff, 0xff, 0xff, 0xff), "data frame of")
	hostile("unknown frame", append(append([]byte{}, hdr...), 'Z', 0, 0, 0, 1, 0), "unknown frame type")
	bad := append([]byte{}, good...)
	bad[len(bad)-1]++ // the end frame's total
	hostile("wrong total", bad, "bytes, ")
	hostile("not the state", append(append([]byte{}, hdr...), 'D', 0, 0, 0, 2, '{', '}', 'E', 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 2), "does not fit")
	var other bytes.Buffer
	const uuid2 = "41111111-2222-3333-4444-555555555555"
	startDomain(t, src, uuid2, false)
	if err := src.SendLive(context.Background(), uuid2, &other, backend.MigrateOptions{}, nil); err != nil {
		t.Fatal(err)
	}
	hostile("another domain", other.Bytes(), "does not fit")
}

// Cancelling half-way leaves the source running and fails the
// receiver cleanly; so does a failure injected into the send.
func TestMigrateCancel(t *testing.T) {
	const uuid = "51111111-2222-3333-4444-555555555555"
	src := newSim(t, Config{Delays: map[string]time.Duration{"migrate": 300 * time.Millisecond}})
	dst := newSim(t, Config{})
	startDomain(t, src, uuid, false)
	startDomain(t, dst, uuid, true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sendErr, recvErr := migrate(ctx, src, dst, uuid, func(f float64) {
		if f >= 0.5 {
			cancel()
		}
	})
	if !errors.Is(sendErr, context.Canceled) {
		t.Errorf("send: %v", sendErr)
	}
	if recvErr == nil {
		t.Error("the receiver succeeded on a cancelled migration")
	}
	if info, _ := src.Info(uuid); info.State != backend.DomainRunning || info.Migrated {
		t.Errorf("source after cancel: %+v", info)
	}

	// The sender fails: the receiver reads its reason.
	src.SetDelay("migrate", 0)
	src.SetFail("migrate", errors.New("injected"))
	dst2 := newSim(t, Config{})
	startDomain(t, dst2, uuid, true)
	sendErr, recvErr = migrate(context.Background(), src, dst2, uuid, nil)
	var aborted *backend.MigrateAborted
	if sendErr == nil || !errors.As(recvErr, &aborted) || aborted.Reason != "injected" {
		t.Errorf("send %v, receive %v", sendErr, recvErr)
	}
	if info, _ := src.Info(uuid); info.State != backend.DomainRunning {
		t.Errorf("source after a failed send: %+v", info)
	}

	// The receiver's context ends while nothing arrives: it returns,
	// having unblocked its read.
	dst3 := newSim(t, Config{})
	startDomain(t, dst3, uuid, true)
	a, b := net.Pipe()
	defer a.Close()
	rctx, rcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer rcancel()
	if err := dst3.ReceiveLive(rctx, uuid, b); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("receive on a silent stream: %v", err)
	}
}

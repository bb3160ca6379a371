package xenops

import (
	"context"
	"testing"
	"time"
)

func TestQueueProgressSeesAStuckQueue(t *testing.T) {
	m := &Manager{q: newQueues(4)}
	p := m.Progress()
	if d := p.Stalled(); d != 0 {
		t.Fatalf("no queues: stalled %v", d)
	}
	release := make(chan struct{})
	running := make(chan struct{})
	ctx := context.Background()
	m.q.submit("vm1", &job{ctx: ctx, name: "stuck", run: func(context.Context) error {
		close(running)
		<-release
		return nil
	}})
	<-running
	if d := p.Stalled(); d != 0 {
		t.Fatalf("one running job, nothing waiting: stalled %v", d)
	}
	behind := &job{ctx: ctx, name: "behind", run: func(context.Context) error { return nil }}
	m.q.submit("vm1", behind)
	if d := p.Stalled(); d != 0 {
		t.Fatalf("first look at a waiting job: stalled %v", d)
	}
	time.Sleep(30 * time.Millisecond)
	if d := p.Stalled(); d < 30*time.Millisecond {
		t.Fatalf("the same job waited 30ms: stalled %v", d)
	}
	close(release)
	if err := behind.wait(); err != nil {
		t.Fatal(err)
	}
	if d := p.Stalled(); d != 0 {
		t.Fatalf("the queue moved: stalled %v", d)
	}
}

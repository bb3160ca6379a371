package rafttest

// Long mode: TOOLSTACKD_LONG=1 multiplies the round counts of the fault
// tests by 10 (100 leader kills, 200 partition/heal cycles). The cluster
// tests run in parallel with each other: they spend their time waiting for
// election timeouts, not on the CPU.

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func rounds(n int) int {
	if os.Getenv("TOOLSTACKD_LONG") == "1" {
		return n * 10
	}
	return n
}

func TestFSMRefusesBadCommand(t *testing.T) {
	f := NewFSM()
	for _, data := range [][]byte{nil, []byte("no separator"), []byte("\x00value")} {
		res := f.Apply(&raft.Log{Index: 1, Data: data})
		if err, ok := res.(error); !ok || !errors.Is(err, ErrBadCommand) {
			t.Fatalf("Apply(%q) = %v, want ErrBadCommand", data, res)
		}
	}
	if res := f.Apply(&raft.Log{Index: 7, Term: 2, Data: EncodePut("k", "v")}); res != uint64(7) {
		t.Fatalf("Apply(put) = %v, want 7", res)
	}
	if v, ok := f.Get("k"); !ok || v != "v" || f.LastApplied() != 7 {
		t.Fatalf("after put: %q %v %d", v, ok, f.LastApplied())
	}
}

func TestElection(t *testing.T) {
	t.Parallel()
	c := NewCluster(t, Options{Nodes: 3})
	l, err := c.WaitLeader(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Every node comes to know the same leader, and only one leads.
	deadline := time.Now().Add(10 * time.Second)
	for {
		agree, leaders := 0, 0
		for i := range c.N() {
			r := c.Raft(i)
			if _, id := r.LeaderWithID(); id == raft.ServerID(fmt.Sprintf("node%d", l)) {
				agree++
			}
			if r.State() == raft.Leader {
				leaders++
			}
		}
		if agree == c.N() && leaders == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after election: %d of %d nodes know leader node%d, %d leaders", agree, c.N(), l, leaders)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func testReplication(t *testing.T, nodes, writes int) {
	t.Parallel()
	c := NewCluster(t, Options{Nodes: nodes})
	if _, err := c.WaitLeader(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i := range writes {
		_, idx, err := c.Put(fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i))
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		if idx <= last {
			t.Fatalf("write %d committed at %d after %d", i, idx, last)
		}
		last = idx
	}
	if err := c.WaitConverged(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	for n := range c.N() {
		f := c.FSM(n)
		if f.Len() != writes {
			t.Fatalf("node %d has %d keys, want %d", n, f.Len(), writes)
		}
		for i := range writes {
			if v, _ := f.Get(fmt.Sprintf("k%d", i)); v != fmt.Sprintf("v%d", i) {
				t.Fatalf("node %d: k%d = %q", n, i, v)
			}
		}
	}
	if err := c.CheckLogs(); err != nil {
		t.Fatal(err)
	}
}

func TestReplication3(t *testing.T) { testReplication(t, 3, 300) }
func TestReplication5(t *testing.T) { testReplication(t, 5, 300) }

// history records acknowledged writes.
type history struct {
	mu    sync.Mutex
	acked map[string]string
	acks  []ack
}

type ack struct {
	at   time.Time
	node int
}

func newHistory() *history { return &history{acked: make(map[string]string)} }

func (h *history) add(k, v string, node int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.acked[k] = v
	h.acks = append(h.acks, ack{time.Now(), node})
}

// firstAckAfter returns the first acknowledgement after t0 by a node
// other than old.
func (h *history) firstAckAfter(t0 time.Time, old int) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, a := range h.acks {
		if a.at.After(t0) && a.node != old {
			return a.at, true
		}
	}
	return time.Time{}, false
}

func (h *history) waitAckAfter(t0 time.Time, old int, timeout time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if at, ok := h.firstAckAfter(t0, old); ok {
			return at.Sub(t0), nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 0, fmt.Errorf("no write acknowledged by a new leader within %v", timeout)
}

// checkAll verifies every acknowledged write on every live node.
func (h *history) checkAll(t *testing.T, c *Cluster) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range c.N() {
		if !c.Alive(i) {
			continue
		}
		f := c.FSM(i)
		for k, v := range h.acked {
			if got, ok := f.Get(k); !ok || got != v {
				t.Fatalf("node %d lost acknowledged write %s=%s (has %q, %v)", i, k, v, got, ok)
			}
		}
	}
}

// writers runs n concurrent writers of unique keys until stop is called.
func writers(c *Cluster, h *history, n int, prefix string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			for seq := 0; ; seq++ {
				select {
				case <-done:
					return
				default:
				}
				k := fmt.Sprintf("%s-w%d-%d", prefix, w, seq)
				v := fmt.Sprintf("v%d", seq)
				node, _, err := c.Put(k, v)
				if err == nil {
					h.add(k, v, node)
				} else {
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

func report(t *testing.T, what string, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	s := slices.Clone(d)
	slices.Sort(s)
	t.Logf("%s: %d rounds, p50 %v, max %v", what, len(s), s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}

// TestLeaderKill kills the leader under 4 concurrent writers, round after
// round: a new leader takes writes, the old one restarts and catches up,
// and no acknowledged write is missing from any node.
func TestLeaderKill(t *testing.T) {
	t.Parallel()
	c := NewCluster(t, Options{Nodes: 3})
	if _, err := c.WaitLeader(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	h := newHistory()
	var failover []time.Duration
	for round := range rounds(10) {
		stop := writers(c, h, 4, fmt.Sprintf("r%d", round))
		time.Sleep(200 * time.Millisecond)
		l, err := c.WaitLeader(30 * time.Second)
		if err != nil {
			stop()
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := c.Kill(l); err != nil {
			stop()
			t.Fatalf("round %d: kill node %d: %v", round, l, err)
		}
		// About 2 s at the median on a quiet machine, 10 s at the most
		// (writers waiting out a Put on the dead leader).
		d, err := h.waitAckAfter(t0, l, 60*time.Second)
		if err != nil {
			stop()
			t.Fatalf("round %d: %v", round, err)
		}
		failover = append(failover, d)
		time.Sleep(100 * time.Millisecond)
		stop()
		if err := c.Restart(l); err != nil {
			t.Fatalf("round %d: restart node %d: %v", round, l, err)
		}
		settled(t, c, h, fmt.Sprintf("round %d", round))
	}
	t.Logf("acknowledged writes: %d", len(h.acked))
	report(t, "failover after leader kill (to first acknowledged write)", failover)
}

// TestPartitionHeal is the hashicorp/raft#695 scenario: the leader is cut
// off into a minority while clients write, the majority elects a new
// leader and takes writes, the partition heals while writes continue.
// Afterwards no acknowledged write is lost and every node holds the same
// log.
func TestPartitionHeal(t *testing.T) {
	t.Parallel()
	c := NewCluster(t, Options{Nodes: 3})
	if _, err := c.WaitLeader(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	h := newHistory()
	var failover []time.Duration
	for round := range rounds(20) {
		stop := writers(c, h, 4, fmt.Sprintf("r%d", round))
		time.Sleep(100 * time.Millisecond)
		l, err := c.WaitLeader(30 * time.Second)
		if err != nil {
			stop()
			t.Fatal(err)
		}
		t0 := time.Now()
		c.Isolate(l)
		d, err := h.waitAckAfter(t0, l, 60*time.Second)
		if err != nil {
			stop()
			t.Fatalf("round %d: %v", round, err)
		}
		failover = append(failover, d)
		time.Sleep(50 * time.Millisecond)
		c.Heal() // while the writers are still writing
		time.Sleep(100 * time.Millisecond)
		stop()
		settled(t, c, h, fmt.Sprintf("round %d", round))
	}
	t.Logf("acknowledged writes: %d", len(h.acked))
	report(t, "failover after leader partition (to first acknowledged write)", failover)
}

// TestPartition5 splits 5 nodes 2/3 with the leader on the minority side:
// only the majority elects a leader and commits, and after healing all
// five hold the same log.
func TestPartition5(t *testing.T) {
	t.Parallel()
	c := NewCluster(t, Options{Nodes: 5})
	l, err := c.WaitLeader(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	other := (l + 1) % 5
	minority := []int{l, other}
	var majority []int
	for i := range 5 {
		if i != l && i != other {
			majority = append(majority, i)
		}
	}
	c.Partition(minority...)
	nl, err := c.WaitLeader(15*time.Second, majority...)
	if err != nil {
		t.Fatal(err)
	}
	h := newHistory()
	for i := range 50 {
		k, v := fmt.Sprintf("p%d", i), "x"
		node, _, err := c.Put(k, v)
		if err != nil {
			continue // the deposed leader may still answer for a moment
		}
		if !slices.Contains(majority, node) {
			t.Fatalf("write acknowledged by node %d on the minority side", node)
		}
		h.add(k, v, node)
	}
	if len(h.acked) == 0 {
		t.Fatalf("the majority (leader %d) acknowledged no write", nl)
	}
	c.Heal()
	settled(t, c, h, "after healing")
}

// settled waits for every live node to apply the same log, then checks
// that each acknowledged write is on every node and that the stored logs
// agree.
func settled(t *testing.T, c *Cluster, h *history, when string) {
	t.Helper()
	if err := c.WaitConverged(20 * time.Second); err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	h.checkAll(t, c)
	if err := c.CheckLogs(); err != nil {
		t.Fatalf("%s: %v", when, err)
	}
}

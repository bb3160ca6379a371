package qemu

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"toolstackd/internal/xenops/qemu/qmp"

	"toolstackd/internal/nbd"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// Disk mirrors (backend.DiskMirrorer) with QMP: the target export is
// opened as an "nbd" block node (blockdev-add), or a target image on
// this host as a disk's image is (its format node over the file), and
// blockdev-mirror runs a job from the disk's top node to it. The job is made with
// auto-dismiss off, so that QEMU keeps a job that ended on its own (and
// its error) until CompleteMirror or CancelMirror dismisses it: the
// state of a mirror is QEMU's, read back with query-block-jobs, and a
// restarted daemon sees it as it was.
//
// Names, per disk: job "mirror-vbd<device>", target nodes
// "vbd<device>-mirror<n>" (a new n for each mirror, as a pivoted disk
// keeps its target node as its own).
//
// A pivot (block-job-complete) makes the target node the disk's: the
// journal then records it as the disk's only node (Overlays), with the
// target's path, format and VDI, so that unplugging, snapshotting,
// mirroring again and a restarted daemon all find the disk the domain
// uses. A local target is held by QEMU itself; an NBD one only as long
// as its server lives.

var _ backend.DiskMirrorer = (*QEMU)(nil)

// mirrorJob names a disk's mirror job.
func mirrorJob(device string) string { return "mirror-" + devID(device) }

// mirrorNodes lists a disk's mirror target nodes that are not the disk's
// own (after a pivot, its node is a former target): those of a mirror
// that runs or that a dead daemon left. free is a name for a new one.
func mirrorNodes(ctx context.Context, mon *qmp.Conn, disk backend.Disk) (stale []string, free string, err error) {
	nodes, err := qmp.Run(ctx, mon, qmp.QueryNamedBlockNodes{Flat: true})
	if err != nil {
		return nil, "", err
	}
	prefix := devID(disk.Device) + "-mirror"
	taken := map[string]bool{}
	for _, n := range nodes {
		taken[n.NodeName] = true
		if strings.HasPrefix(n.NodeName, prefix) && !slices.Contains(disk.Overlays, n.NodeName) && !slices.Contains(stale, n.NodeName) {
			stale = append(stale, n.NodeName)
		}
	}
	for i := 1; ; i++ {
		if free = prefix + strconv.Itoa(i); !taken[free] && !slices.Contains(disk.Overlays, free) {
			return stale, free, nil
		}
	}
}

// dropMirrorNodes removes a disk's mirror target nodes that are not its
// own.
func dropMirrorNodes(ctx context.Context, mon *qmp.Conn, disk backend.Disk) {
	stale, _, err := mirrorNodes(ctx, mon, disk)
	if err != nil {
		return
	}
	for _, n := range stale {
		dropBlockNode(ctx, mon, n)
	}
}

// Bounds on the waits that have no deadline of the caller's.
const (
	mirrorHandshakeTimeout = 30 * time.Second
	mirrorEndTimeout       = 60 * time.Second
	mirrorPoll             = 500 * time.Millisecond
)

// mirrorFailed is the XenAPI error for a disk's mirror, with why.
func mirrorFailed(disk backend.Disk, why error) error {
	return fmt.Errorf("%w: disk %s: %w", xerr.New(xerr.MirrorFailed, disk.VDI), disk.Device, why)
}

// mirrorDisk finds a running domain's disk that can be mirrored.
func (q *QEMU) mirrorDisk(uuid, device string) (*qemuDomain, *qmp.Conn, backend.Disk, error) {
	d, mon, err := q.live(uuid)
	if err != nil {
		return nil, nil, backend.Disk{}, err
	}
	disk, ok := d.disk(device)
	if !ok {
		return nil, nil, backend.Disk{}, fmt.Errorf("qemu: VM %s has no disk %s", uuid, device)
	}
	if disk.CD || disk.Path == "" {
		return nil, nil, backend.Disk{}, fmt.Errorf("qemu: VM %s disk %s has no image to mirror", uuid, device)
	}
	return d, mon, disk, nil
}

// topNode is the node the domain's disk reads and writes: the last
// live-snapshot overlay, or the disk's own node.
func topNode(disk backend.Disk) string {
	if n := len(disk.Overlays); n > 0 {
		return disk.Overlays[n-1]
	}
	return nodeName(disk.Device)
}

// StartMirror implements backend.DiskMirrorer.
func (q *QEMU) StartMirror(ctx context.Context, uuid, device string, t backend.MirrorTarget) error {
	d, mon, disk, err := q.mirrorDisk(uuid, device)
	if err != nil {
		return err
	}
	local := t.URI == "" && t.Path != ""
	var u nbd.URI
	if !local {
		if u, err = nbd.ParseURI(t.URI); err != nil {
			return mirrorFailed(disk, err)
		}
	}
	sync := t.Sync
	if sync == "" {
		sync = backend.MirrorFull
	}
	if sync != backend.MirrorFull && sync != backend.MirrorTop {
		return mirrorFailed(disk, fmt.Errorf("unknown sync mode %q", sync))
	}
	if t.Bandwidth < 0 {
		return mirrorFailed(disk, errors.New("negative bandwidth"))
	}
	if j, ok, err := findJob(ctx, mon, mirrorJob(device)); err != nil {
		return err
	} else if ok {
		return mirrorFailed(disk, fmt.Errorf("a mirror is already %s", j.Status))
	}
	// QEMU opens the target in its main loop, where a server that never
	// answers would hold the monitor: shake hands with it first, within
	// a deadline, and check that it can take the disk.
	size, err := nodeSize(ctx, mon, topNode(disk))
	if err != nil {
		return err
	}
	if !local {
		hctx, cancel := context.WithTimeout(ctx, mirrorHandshakeTimeout)
		c, err := nbd.Dial(hctx, u)
		cancel()
		if err != nil {
			return mirrorFailed(disk, fmt.Errorf("target %s: %w", t.URI, err))
		}
		tsize, ro := c.Size(), c.ReadOnly()
		_ = c.Close()
		switch {
		case ro:
			return mirrorFailed(disk, fmt.Errorf("target %s is read-only", t.URI))
		case tsize < size:
			return mirrorFailed(disk, fmt.Errorf("target %s has %d bytes, the disk %d", t.URI, tsize, size))
		}
	}

	dropMirrorNodes(context.WithoutCancel(ctx), mon, disk) // leftovers of a daemon that died mid-way
	_, node, err := mirrorNodes(ctx, mon, disk)
	if err != nil {
		return err
	}
	add := map[string]any{"driver": "nbd", "export": u.Export, "server": u.QEMUServer()}
	h := live(ctx, d, mon, node)
	switch {
	case local:
		// The image is opened as a disk's is; its size is known once
		// it is open.
		add, err = blockdevFor(h, backend.Disk{Device: device, Path: t.Path, Format: t.Format})
	case h != nil:
		add, err = handedNode(h, t.URI, false, diskOpaque(device))
	}
	if err == nil {
		add["node-name"] = node
		err = qmp.Do(ctx, mon, qmp.BlockdevAdd(add))
	}
	if err != nil {
		return mirrorFailed(disk, fmt.Errorf("opening the target: %w", err))
	}
	if local {
		tsize, err := nodeSize(ctx, mon, node)
		if err == nil && tsize < size {
			err = fmt.Errorf("target %s has %d bytes, the disk %d", t.Path, tsize, size)
		}
		if err != nil {
			dropBlockNode(context.WithoutCancel(ctx), mon, node)
			return mirrorFailed(disk, err)
		}
	}
	autoDismiss := false
	mirror := qmp.BlockdevMirror{
		JobID: mirrorJob(device), Device: topNode(disk), Target: node, Sync: string(sync),
		AutoDismiss: &autoDismiss, OnSourceError: "stop", OnTargetError: "report",
		BufSize: 64 << 20, Speed: max(0, t.Bandwidth),
	}
	if t.WriteBlocking {
		mirror.CopyMode = "write-blocking"
	}
	if err := qmp.Do(ctx, mon, mirror); err != nil {
		dropBlockNode(context.WithoutCancel(ctx), mon, node)
		return mirrorFailed(disk, err)
	}
	targets.put(d, device, t)
	q.log.Info("qemu: disk mirror started", "vm", uuid, "device", device, "target", cmp.Or(t.URI, t.Path), "sync", sync)
	return nil
}

// nodeSize is a block node's virtual size.
func nodeSize(ctx context.Context, mon *qmp.Conn, node string) (int64, error) {
	nodes, err := qmp.Run(ctx, mon, qmp.QueryNamedBlockNodes{Flat: true})
	if err != nil {
		return 0, err
	}
	for _, n := range nodes {
		if n.NodeName == node {
			return n.Image.VirtualSize, nil
		}
	}
	return 0, fmt.Errorf("qemu: no block node %s", node)
}

// findJob reads one block job from QEMU.
func findJob(ctx context.Context, mon *qmp.Conn, id string) (qmp.BlockJobInfo, bool, error) {
	jobs, err := qmp.Run(ctx, mon, qmp.QueryBlockJobs{})
	if err != nil {
		return qmp.BlockJobInfo{}, false, err
	}
	for _, j := range jobs {
		if j.Device == id {
			return j, true, nil
		}
	}
	return qmp.BlockJobInfo{}, false, nil
}

// jobEvent matches the events of job id: its status changes and the
// block job events.
func jobEvent(id string) func(qmp.Event) bool {
	return func(ev qmp.Event) bool {
		var data struct {
			ID     string `json:"id"`
			Device string `json:"device"`
		}
		switch ev.Event {
		case "JOB_STATUS_CHANGE":
			_ = json.Unmarshal(ev.Data, &data) // malformed data matches nothing
			return data.ID == id
		case "BLOCK_JOB_READY", "BLOCK_JOB_COMPLETED", "BLOCK_JOB_CANCELLED", "BLOCK_JOB_ERROR":
			_ = json.Unmarshal(ev.Data, &data)
			return data.Device == id
		}
		return false
	}
}

func statusOf(j qmp.BlockJobInfo, ok bool) backend.MirrorStatus {
	if !ok {
		return backend.MirrorStatus{}
	}
	s := backend.MirrorStatus{Active: true, Ready: j.Ready && j.Status == "ready", Done: j.Offset, Total: j.Len, Error: j.Error}
	if s.Error == "" && j.Status == "concluded" {
		s.Error = "the mirror ended"
	}
	return s
}

// MirrorStatus implements backend.DiskMirrorer.
func (q *QEMU) MirrorStatus(ctx context.Context, uuid, device string) (backend.MirrorStatus, error) {
	_, mon, _, err := q.mirrorDisk(uuid, device)
	if err != nil {
		return backend.MirrorStatus{}, err
	}
	j, ok, err := findJob(ctx, mon, mirrorJob(device))
	if err != nil {
		return backend.MirrorStatus{}, err
	}
	return statusOf(j, ok), nil
}

// WaitMirrorReady implements backend.DiskMirrorer.
func (q *QEMU) WaitMirrorReady(ctx context.Context, uuid, device string, progress func(float64)) error {
	d, mon, disk, err := q.mirrorDisk(uuid, device)
	if err != nil {
		return err
	}
	id := mirrorJob(device)
	for {
		w := d.waitEvent(jobEvent(id)) // before the query, so no change is missed
		j, ok, err := findJob(ctx, mon, id)
		if err != nil {
			d.dropWaiter(w)
			return err
		}
		st := statusOf(j, ok)
		switch {
		case !ok:
			d.dropWaiter(w)
			return mirrorFailed(disk, errors.New("no mirror is running"))
		case st.Error != "":
			d.dropWaiter(w)
			return mirrorFailed(disk, errors.New(st.Error))
		case st.Ready:
			d.dropWaiter(w)
			if progress != nil {
				progress(1)
			}
			return nil
		}
		if progress != nil {
			progress(st.Progress())
		}
		t := time.NewTimer(mirrorPoll)
		select {
		case <-w.ch:
		case <-t.C:
		case <-d.exited:
			t.Stop()
			d.dropWaiter(w)
			return mirrorFailed(disk, errors.New("the emulator exited"))
		case <-ctx.Done():
			t.Stop()
			d.dropWaiter(w)
			return ctx.Err()
		}
		t.Stop()
		d.dropWaiter(w)
	}
}

// waitConcluded waits until job id has ended (or is gone), within ctx
// or mirrorEndTimeout when ctx has no deadline.
func waitConcluded(ctx context.Context, d *qemuDomain, mon *qmp.Conn, id string) (qmp.BlockJobInfo, bool, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, mirrorEndTimeout)
		defer cancel()
	}
	for {
		w := d.waitEvent(jobEvent(id))
		j, ok, err := findJob(ctx, mon, id)
		if err != nil || !ok || j.Status == "concluded" || j.Status == "null" {
			d.dropWaiter(w)
			return j, ok, err
		}
		t := time.NewTimer(mirrorPoll)
		select {
		case <-w.ch:
		case <-t.C:
		case <-d.exited:
			t.Stop()
			d.dropWaiter(w)
			return j, false, errors.New("the emulator exited")
		case <-ctx.Done():
			t.Stop()
			d.dropWaiter(w)
			return j, true, fmt.Errorf("the mirror did not end (%s): %w", j.Status, ctx.Err())
		}
		t.Stop()
		d.dropWaiter(w)
	}
}

// CompleteMirror implements backend.DiskMirrorer.
func (q *QEMU) CompleteMirror(ctx context.Context, uuid, device string, pivot bool) error {
	d, mon, disk, err := q.mirrorDisk(uuid, device)
	if err != nil {
		return err
	}
	id := mirrorJob(device)
	j, ok, err := findJob(ctx, mon, id)
	if err != nil {
		return err
	}
	if st := statusOf(j, ok); !st.Ready {
		why := "the mirror is not in sync"
		switch {
		case !ok:
			why = "no mirror is running"
		case st.Error != "":
			why = st.Error
		}
		return mirrorFailed(disk, errors.New(why))
	}
	if pivot {
		err = qmp.Do(ctx, mon, qmp.BlockJobComplete{Device: id})
	} else {
		// Cancelling a mirror in sync is QEMU's way to end it without a
		// pivot: it first writes what is in flight to the target.
		err = qmp.Do(ctx, mon, qmp.BlockJobCancel{Device: id})
	}
	if err != nil {
		return mirrorFailed(disk, err)
	}
	j, ok, err = waitConcluded(ctx, d, mon, id)
	if err != nil {
		return mirrorFailed(disk, err)
	}
	if ok && j.Error != "" {
		return mirrorFailed(disk, errors.New(j.Error))
	}
	if ok {
		_ = qmp.Do(context.WithoutCancel(ctx), mon, qmp.JobDismiss{ID: id})
	}
	if !pivot {
		targets.take(d, device)
		dropMirrorNodes(context.WithoutCancel(ctx), mon, disk)
		q.log.Info("qemu: disk mirror completed", "vm", uuid, "device", device)
		return nil
	}
	// The device now writes to the target node: the old chain is
	// unused. The journal keeps the target as the disk's only node.
	stale, _, err := mirrorNodes(context.WithoutCancel(ctx), mon, disk)
	if err != nil || len(stale) != 1 {
		return mirrorFailed(disk, fmt.Errorf("after the pivot the disk's node is unknown (%v, %v)", stale, err))
	}
	target := stale[0]
	for i := len(disk.Overlays) - 1; i >= 0; i-- {
		dropBlockNode(context.WithoutCancel(ctx), mon, disk.Overlays[i])
	}
	dropBlockNode(context.WithoutCancel(ctx), mon, nodeName(device))
	q.log.Info("qemu: disk mirror completed; the disk is the target now", "vm", uuid, "device", device)
	tg, known := targets.take(d, device)
	return q.record(d, func(jl *qemuJournal) {
		i := jl.diskIndex(device)
		if i < 0 {
			return
		}
		jl.Disks[i].Overlays = []string{target}
		switch {
		case known && tg.URI == "" && tg.Path != "":
			jl.Disks[i].Path, jl.Disks[i].Format = tg.Path, blockdevArg(backend.Disk{Format: tg.Format})["driver"].(string)
		case known && tg.URI != "":
			jl.Disks[i].Path, jl.Disks[i].Format = tg.URI, "raw"
		default:
			jl.Disks[i].Format = "raw"
			jl.Disks[i].Path = targetURI(ctx, mon, target, jl.Disks[i].Path)
		}
		if known && tg.VDI != "" {
			jl.Disks[i].VDI = tg.VDI
		}
	})
}

// targetURI is the NBD URI a target node was opened with, as QEMU
// reports it (its filename), or old when it cannot be read.
func targetURI(ctx context.Context, mon *qmp.Conn, node, old string) string {
	nodes, err := qmp.Run(context.WithoutCancel(ctx), mon, qmp.QueryNamedBlockNodes{Flat: true})
	if err != nil {
		return old
	}
	for _, n := range nodes {
		if n.NodeName == node && nbd.IsURI(n.File) {
			if _, err := nbd.ParseURI(n.File); err == nil {
				return n.File
			}
		}
	}
	return old
}

// CancelMirror implements backend.DiskMirrorer.
func (q *QEMU) CancelMirror(ctx context.Context, uuid, device string) error {
	d, mon, disk, err := q.mirrorDisk(uuid, device)
	if err != nil {
		return err
	}
	id := mirrorJob(device)
	j, ok, err := findJob(ctx, mon, id)
	if err != nil {
		return err
	}
	if ok && j.Status != "concluded" && j.Status != "null" {
		err := qmp.Do(ctx, mon, qmp.BlockJobCancel{Device: id, Force: true})
		var qe *qmp.Error
		if err != nil && !(errors.As(err, &qe) && qe.Class == "DeviceNotActive") {
			return mirrorFailed(disk, err)
		}
		if j, ok, err = waitConcluded(ctx, d, mon, id); err != nil {
			return mirrorFailed(disk, err)
		}
	}
	if ok {
		if err := qmp.Do(ctx, mon, qmp.JobDismiss{ID: id}); err != nil {
			return mirrorFailed(disk, err)
		}
	}
	dropMirrorNodes(context.WithoutCancel(ctx), mon, disk)
	targets.take(d, device)
	if ok {
		q.log.Info("qemu: disk mirror cancelled", "vm", uuid, "device", device)
	}
	return nil
}

// mirrorTargets remembers the target of each running mirror, per disk of
// a live domain, for CompleteMirror to record as the disk after a pivot
// (QEMU knows the node, not the VDI). A mirror outlives the daemon in
// QEMU, not here: a restarted daemon cancels it rather than pivots.
type mirrorTargets struct {
	mu sync.Mutex
	m  map[*qemuDomain]map[string]backend.MirrorTarget
}

var targets mirrorTargets

func (t *mirrorTargets) put(d *qemuDomain, device string, tg backend.MirrorTarget) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[*qemuDomain]map[string]backend.MirrorTarget{}
	}
	for x := range t.m { // forget the domains that are gone
		select {
		case <-x.exited:
			delete(t.m, x)
		default:
		}
	}
	if t.m[d] == nil {
		t.m[d] = map[string]backend.MirrorTarget{}
	}
	t.m[d][device] = tg
}

func (t *mirrorTargets) take(d *qemuDomain, device string) (backend.MirrorTarget, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tg, ok := t.m[d][device]
	delete(t.m[d], device)
	if len(t.m[d]) == 0 {
		delete(t.m, d)
	}
	return tg, ok
}

package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"

	"toolstackd/internal/atomicfile"
	"toolstackd/internal/safepath"
	"toolstackd/internal/storage/imageformat"
	"toolstackd/internal/xerr"
)

// The file driver keeps an SR in a directory (device_config "location")
// and each VDI in it as a qcow2 image managed with qemu-img:
//
//	<uuid>.qcow2        a VDI (always a leaf: nothing is backed by it)
//	<uuid>.base.qcow2   an immutable interior node of a snapshot tree
//	.toolstackd-sr.json the SR's uuid, name and per-VDI metadata
//	.toolstackd-sr.lock serialises metadata changes between hosts
//	.toolstackd-sr.journal  an unfinished snapshot or clone, undone at attach
//	.locks/<key>        per-VDI attach locks (shared SRs)
//
// Snapshot and clone never copy data: the VDI's image is renamed to a new
// base, and the VDI and the new VDI become empty overlays on it, so both
// take constant time whatever the size. Deleting a VDI leaves its base
// with fewer children; a base with none is deleted and a base with one is
// coalesced into it (qemu-img commit or rebase, whichever moves less
// data) by the SR's garbage collector.
//
// Other image files put in the directory are picked up by SR.scan: files
// named *.qcow2 (qcow2) and *.raw, *.img, *.iso (raw), keyed by their
// names. A scanned image that is another image's backing file is reported
// read-only.
//
// The "sharedfs" type is the same driver on a directory every host of a
// pool mounts (NFS, CephFS, GlusterFS...): the SR is shared, metadata
// changes take an flock on .toolstackd-sr.lock, and attaching a VDI takes
// an flock on .locks/<key> (shared for read-only, exclusive for
// read-write), so two hosts never write one VDI.
//
// The directory may hold files that are not the SR's: SR.destroy deletes
// only the volumes the SR made (marked "created" in its metadata), the
// bases nothing left depends on, and its own files (the names above and
// temporary files named .tmp-*); images it merely found stay, as do any
// other files. A location inside the daemon's state or in a system
// directory is refused (see locationPolicy).

const (
	srMetaFile  = ".toolstackd-sr.json"
	srLockFile  = ".toolstackd-sr.lock"
	srJournal   = ".toolstackd-sr.journal"
	oldJournal  = ".journal" // the journal's name before it had the prefix
	srLocksDir  = ".locks"
	baseSuffix  = ".base.qcow2"
	qcowSuffix  = ".qcow2"
	tmpPrefix   = ".tmp-"
	fileSRFlags = os.O_RDWR | os.O_CREATE
)

type fileDriver struct {
	typ    string
	shared bool
	log    *slog.Logger
	policy *locationPolicy // where SRs may live; nil: system directories only
}

// NewFileDriver returns the local-directory driver (type "file").
func NewFileDriver(log *slog.Logger) Driver { return &fileDriver{typ: "file", log: orDefault(log)} }

// NewSharedFSDriver returns the driver for a directory on a mount every
// host shares (type "sharedfs").
func NewSharedFSDriver(log *slog.Logger) Driver {
	return &fileDriver{typ: "sharedfs", shared: true, log: orDefault(log)}
}

func orDefault(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}

func (d *fileDriver) Info() DriverInfo {
	desc := "VDIs as qcow2 files in a local directory"
	name := "Local qcow2 directory"
	if d.shared {
		desc = "VDIs as qcow2 files in a directory on a filesystem every host mounts (NFS, CephFS...)"
		name = "Shared qcow2 directory"
	}
	return DriverInfo{
		Type: d.typ, Name: name, Description: desc, Vendor: "toolstackd", Copyright: "toolstackd authors", Version: "1.0",
		Configuration: map[string]string{"location": "absolute path of an existing, writable directory"},
		Capabilities: []string{"SR_PROBE", "SR_UPDATE", "SR_METADATA", "SR_TRIM", "VDI_CREATE", "VDI_DELETE", "VDI_ATTACH", "VDI_DETACH",
			"VDI_ACTIVATE", "VDI_DEACTIVATE", "VDI_CLONE", "VDI_SNAPSHOT", "VDI_RESIZE", "VDI_INTRODUCE", "VDI_UPDATE",
			"VDI_GENERATE_CONFIG", "VDI_RESET_ON_BOOT/2", "THIN_PROVISIONING"},
		Shared: d.shared, Formats: []string{"qcow2", "raw"}, Filename: "(built in)",
	}
}

// location validates device_config:location: an absolute path to an
// existing directory this host can write, outside the daemon's state and
// the system directories. A refused place is INVALID_VALUE
// [device_config:location, value]: the argument's value is what is
// wrong, which is what that code (documented in errors.json with those
// two parameters) says; SR_BACKEND_FAILURE_<n> numbers belong to SM's
// own checks. Why it was refused goes to the log.
func (d *fileDriver) location(cfg map[string]string) (string, error) {
	loc, ok := cfg["location"]
	if !ok || loc == "" {
		return "", BackendError(smConfigLocationMissing, "The request is missing the location parameter")
	}
	if !filepath.IsAbs(loc) {
		return "", BackendError(smInvalidArg, fmt.Sprintf("location %q is not an absolute path", loc))
	}
	loc = filepath.Clean(loc)
	if err := d.policy.check(loc); err != nil {
		d.log.Warn("refusing a file SR location", "location", loc, "why", err)
		return "", xerr.New(xerr.InvalidValue, "device_config:location", cfg["location"])
	}
	st, err := os.Stat(loc)
	if err != nil {
		return "", BackendError(smSRUnavailable, fmt.Sprintf("location %s does not exist or cannot be reached: %v", loc, unwrapPathErr(err)))
	}
	if !st.IsDir() {
		return "", BackendError(smSRUnavailable, fmt.Sprintf("location %s is not a directory", loc))
	}
	probe, err := os.CreateTemp(loc, tmpPrefix+"probe-")
	if err != nil {
		return "", BackendError(smFileSRCreate, fmt.Sprintf("location %s is not writable: %v", loc, unwrapPathErr(err)))
	}
	_ = probe.Close()
	_ = os.Remove(probe.Name())
	return loc, nil
}

func unwrapPathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// srMeta is the SR's own record of itself, kept in the SR directory so
// that an SR forgotten and introduced again (or seen by another host)
// keeps its VDIs' names and snapshot relations.
type srMeta struct {
	UUID        string             `json:"uuid"`
	Type        string             `json:"type"`
	Name        string             `json:"name"`
	Description string             `json:"description"`
	Volumes     map[string]volMeta `json:"volumes"`
}

type volMeta struct {
	UUID         string    `json:"uuid,omitempty"`
	Name         string    `json:"name,omitempty"`
	Description  string    `json:"description,omitempty"`
	Type         string    `json:"type,omitempty"`
	Sharable     bool      `json:"sharable,omitempty"`
	IsSnapshot   bool      `json:"is_snapshot,omitempty"`
	SnapshotOf   string    `json:"snapshot_of,omitempty"`
	SnapshotTime time.Time `json:"snapshot_time,omitzero"`
	// ResetBase is the base an on_boot=reset VDI returns to at each
	// activation.
	ResetBase string `json:"reset_base,omitempty"`
	// Created marks a volume this SR made (VDI.create, snapshot, clone):
	// SR.destroy deletes those and nothing it merely found.
	Created bool `json:"created,omitempty"`
}

// created reports whether the SR made the volume under key. Metadata
// written before the flag existed has the volume's uuid as its key only
// for volumes the SR made.
func (v volMeta) created(key string) bool {
	return v.Created || (isUUID(key) && v.UUID == key)
}

func readMeta(dir string) (*srMeta, error) {
	b, err := os.ReadFile(filepath.Join(dir, srMetaFile)) //nolint:gosec // the SR's directory and a fixed name
	if err != nil {
		return nil, err
	}
	var m srMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", srMetaFile, err)
	}
	if m.Volumes == nil {
		m.Volumes = map[string]volMeta{}
	}
	return &m, nil
}

// writeFileAtomic replaces a file with new contents, durably; the
// temporary file is one the SR's scans skip (tmpPrefix).
func writeFileAtomic(path string, data []byte) error {
	return atomicfile.Write(path, 0o600, tmpPrefix, atomicfile.Data(data))
}

func writeMeta(dir string, m *srMeta) error {
	b, err := json.MarshalIndent(m, "", " ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, srMetaFile), b)
}

func (d *fileDriver) Probe(ctx context.Context, cfg map[string]string) ([]ProbeResult, error) {
	loc, err := d.location(cfg)
	if err != nil {
		return nil, err
	}
	m, err := readMeta(loc)
	if errors.Is(err, fs.ErrNotExist) {
		return []ProbeResult{}, nil
	}
	if err != nil {
		return nil, BackendError(smSRScan, err.Error())
	}
	return []ProbeResult{{UUID: m.UUID, Name: m.Name, Description: m.Description, DeviceConfig: map[string]string{"location": loc}}}, nil
}

func (d *fileDriver) Create(ctx context.Context, sr SRSpec) (map[string]string, error) {
	loc, err := d.location(sr.DeviceConfig)
	if err != nil {
		return nil, err
	}
	if m, err := readMeta(loc); err == nil {
		return nil, BackendError(smSRExists, fmt.Sprintf("%s already holds SR %s: use SR.introduce, PBD.create and PBD.plug to attach it", loc, m.UUID))
	}
	m := &srMeta{UUID: sr.UUID, Type: d.typ, Name: sr.Name, Description: sr.Description, Volumes: map[string]volMeta{}}
	if err := writeMeta(loc, m); err != nil {
		return nil, BackendError(smFileSRCreate, err.Error())
	}
	return map[string]string{"location": loc}, nil
}

func (d *fileDriver) Attach(ctx context.Context, sr SRSpec) (SR, error) {
	loc, err := d.location(sr.DeviceConfig)
	if err != nil {
		return nil, err
	}
	s := &fileSR{d: d, uuid: sr.UUID, dir: loc, attached: map[string]*fileAttach{}, busy: map[string]bool{}, gcKick: make(chan struct{}, 1), stop: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	err = s.withMeta(func(m *srMeta) (bool, error) {
		switch {
		case m.UUID == "":
			m.UUID, m.Type, m.Name, m.Description = sr.UUID, d.typ, sr.Name, sr.Description
			return true, nil
		case m.UUID != sr.UUID:
			return false, BackendError(smSRUnavailable, fmt.Sprintf("%s holds SR %s, not %s", loc, m.UUID, sr.UUID))
		}
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	if err := s.recover(); err != nil {
		return nil, BackendError(smSRUnavailable, "recovering an unfinished operation: "+err.Error())
	}
	if d.shared {
		_ = os.MkdirAll(filepath.Join(loc, srLocksDir), 0o700) // tryLock makes it again, and reports
	}
	s.wg.Add(1)
	go s.gcLoop() //nolint:gosec // the SR's collector lives as long as the SR, not the request that attached it; stopped by s.stop
	s.kickGC()
	return s, nil
}

type fileAttach struct {
	readonly bool
	lock     *os.File // shared SRs: the flock held while attached
}

type fileSR struct {
	d    *fileDriver
	uuid string
	dir  string

	mu       sync.Mutex // metadata changes in this process
	cond     *sync.Cond // busy keys going idle
	attached map[string]*fileAttach
	busy     map[string]bool // keys being coalesced

	gcKick   chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
	gcMu     sync.Mutex // one collection at a time
}

// withMeta runs fn on the SR metadata under the SR lock (an flock, so
// that hosts sharing the directory take turns), writing it back if fn
// says it changed.
func (s *fileSR) withMeta(fn func(m *srMeta) (bool, error)) error {
	lf, err := os.OpenFile(filepath.Join(s.dir, srLockFile), fileSRFlags, 0o600)
	if err != nil {
		return err
	}
	defer func(c func() error) { _ = c() }(lf.Close)
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	m, err := readMeta(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		m, err = &srMeta{Volumes: map[string]volMeta{}}, nil
	}
	if err != nil {
		return err
	}
	changed, err := fn(m)
	if err != nil || !changed {
		return err
	}
	return writeMeta(s.dir, m)
}

func (s *fileSR) meta() *srMeta {
	m, err := readMeta(s.dir)
	if err != nil {
		return &srMeta{Volumes: map[string]volMeta{}}
	}
	return m
}

// journal records a snapshot or clone in progress.
type journal struct {
	Op   string `json:"op"`
	Key  string `json:"key"`  // the VDI whose image became the base
	Path string `json:"path"` // its file name
	Base string `json:"base"` // the base's file name
	New  string `json:"new"`  // the new VDI's file name
}

// recover finishes what a crash interrupted: a journalled snapshot or
// clone is rolled back unless the VDI already runs on its new overlay
// (then only the half-made new VDI goes), and temporary files go.
func (s *fileSR) recover() error {
	for _, name := range []string{oldJournal, srJournal} {
		if err := s.recoverJournal(filepath.Join(s.dir, name)); err != nil {
			return err
		}
	}
	ents, _ := os.ReadDir(s.dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			_ = os.Remove(filepath.Join(s.dir, e.Name()))
		}
	}
	return atomicfile.SyncDir(s.dir)
}

// recoverJournal rolls back the operation a journal at jp records.
func (s *fileSR) recoverJournal(jp string) error {
	if b, err := os.ReadFile(jp); err == nil { //nolint:gosec // the SR's directory and a fixed journal name
		j, ok := parseJournal(b)
		if !ok {
			// Not a journal this driver wrote: not ours to act on or
			// delete.
			s.d.log.Warn("ignoring a journal file this driver did not write", "sr", s.uuid, "file", jp)
		} else {
			base, err1 := safepath.JoinName(s.dir, j.Base)
			leaf, err2 := safepath.JoinName(s.dir, j.Path)
			if err := errors.Join(err1, err2); err != nil {
				return err
			}
			if j.New != "" {
				if p, err := safepath.JoinName(s.dir, j.New); err == nil {
					_ = os.Remove(p)
				}
			}
			if _, err := os.Stat(leaf); errors.Is(err, fs.ErrNotExist) {
				if _, err := os.Stat(base); err == nil {
					if err := os.Rename(base, leaf); err != nil {
						return err
					}
				}
			}
			_ = os.Remove(jp)
		}
	}
	return nil
}

// parseJournal reads a journal this driver wrote; ok is false for
// anything else.
func parseJournal(b []byte) (journal, bool) {
	var j journal
	if err := json.Unmarshal(b, &j); err != nil || (j.Op != "snapshot" && j.Op != "clone") || j.Base == "" || j.Path == "" {
		return j, false
	}
	return j, true
}

// isOwnBase reports whether a file name is one the SR gives its bases.
func isOwnBase(name string) bool {
	k, ok := strings.CutSuffix(name, baseSuffix)
	return ok && isUUID(k)
}

func (s *fileSR) Detach(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop) })
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, a := range s.attached {
		if a.lock != nil {
			_ = a.lock.Close()
		}
		delete(s.attached, k)
	}
	return nil
}

// Destroy deletes what the SR made and nothing else: the volumes its
// metadata marks as created, then the bases (<uuid>.base.qcow2) that
// nothing left in the directory is backed by, its lock files, its
// journal, temporary files and metadata. Images found in the directory
// and other files stay; their VDI records go with the SR's (forgotten,
// not deleted).
func (s *fileSR) Destroy(ctx context.Context) error {
	if _, err := s.Scan(ctx); err != nil {
		return err
	}
	_ = s.Detach(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := readMeta(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		m, err = &srMeta{Volumes: map[string]volMeta{}}, nil
	}
	if err != nil {
		return BackendError(smFileSRDelete, "reading the SR metadata: "+err.Error())
	}
	var errs []error
	remove := func(dir, name string) {
		p, err := safepath.JoinName(dir, name)
		if err != nil {
			errs = append(errs, err)
			return
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	keys := map[string]bool{}
	for key, vm := range m.Volumes {
		keys[key] = true
		if !vm.created(key) {
			continue
		}
		if p, _, err := s.pathOf(key); err == nil {
			remove(s.dir, filepath.Base(p))
		}
	}
	// Bases left without children, until none is.
	for range 1000 {
		nodes, kids, err := s.graph()
		if err != nil {
			break
		}
		removed := false
		for name := range nodes {
			if isOwnBase(name) && len(kids[name]) == 0 {
				remove(s.dir, name)
				removed = true
			}
			if k := keyOf(name); k != "" {
				keys[k] = true
			}
		}
		if !removed {
			break
		}
	}
	ents, _ := os.ReadDir(s.dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) && e.Type().IsRegular() {
			remove(s.dir, e.Name())
		}
	}
	if s.d.shared {
		locks := filepath.Join(s.dir, srLocksDir)
		for k := range keys {
			if safepath.Name(k) == nil {
				_ = os.Remove(filepath.Join(locks, k))
			}
		}
		_ = os.Remove(locks) // only if empty
	}
	for _, name := range []string{oldJournal, srJournal} {
		if b, err := os.ReadFile(filepath.Join(s.dir, name)); err == nil { //nolint:gosec // the SR's directory and a fixed journal name
			if _, ok := parseJournal(b); ok {
				_ = os.Remove(filepath.Join(s.dir, name))
			}
		}
	}
	for _, f := range []string{srMetaFile, srLockFile} {
		_ = os.Remove(filepath.Join(s.dir, f))
	}
	if len(errs) > 0 {
		return BackendError(smFileSRDelete, errors.Join(errs...).Error())
	}
	return atomicfile.SyncDir(s.dir)
}

func (s *fileSR) localDir() string { return s.dir }

func (s *fileSR) Stat(ctx context.Context) (SRStat, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.dir, &st); err != nil {
		return SRStat{}, BackendError(smSRUnavailable, err.Error())
	}
	total := int64(st.Blocks) * st.Bsize
	free := int64(st.Bavail) * st.Bsize
	m := s.meta()
	return SRStat{PhysicalSize: total, PhysicalUtilisation: total - free, FreeSpace: free, Name: m.Name, Description: m.Description}, nil
}

func (s *fileSR) SetName(ctx context.Context, name, description string) error {
	return s.withMeta(func(m *srMeta) (bool, error) {
		m.Name, m.Description = name, description
		return true, nil
	})
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	_, err := uuid.Parse(s)
	return err == nil
}

// pathOf maps a key to its image file and format. Keys are VDI uuids for
// images this driver made, or the file names of images found by scan.
func (s *fileSR) pathOf(key string) (string, string, error) {
	notOurs := BackendError(smVDIMissing, fmt.Sprintf("%q is not a volume of this SR", clip(key, 200)))
	if isUUID(key) {
		p, err := safepath.JoinName(s.dir, key+qcowSuffix)
		if err != nil {
			return "", "", notOurs
		}
		return p, "qcow2", nil
	}
	if safepath.Name(key) != nil || strings.HasPrefix(key, ".") || strings.HasSuffix(key, baseSuffix) {
		return "", "", notOurs
	}
	if f := imageformat.FormatOfName(key); f != "" {
		p, err := safepath.JoinName(s.dir, key)
		if err != nil {
			return "", "", notOurs
		}
		return p, f, nil
	}
	return "", "", BackendError(smVDIMissing, fmt.Sprintf("%q is not a volume of this SR", key))
}

// keyOf maps a directory entry to a volume key, or "" for files that are
// not volumes.
func keyOf(name string) string {
	if strings.HasPrefix(name, ".") || strings.HasSuffix(name, baseSuffix) {
		return ""
	}
	if k, ok := strings.CutSuffix(name, qcowSuffix); ok && isUUID(k) {
		return k
	}
	if imageformat.FormatOfName(name) != "" {
		return name
	}
	return ""
}

// node is one image file of the SR and its parent.
type node struct {
	name    string // file name
	format  string
	header  *imageformat.Qcow2Header // nil for raw
	parent  string                   // backing file name, if it is in this directory
	backing string                   // backing file as written
}

// graph reads every image's header: name -> node, parent -> children.
func (s *fileSR) graph() (map[string]*node, map[string][]string, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, nil, BackendError(smSRScan, err.Error())
	}
	nodes := map[string]*node{}
	kids := map[string][]string{}
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || strings.HasPrefix(name, ".") {
			continue
		}
		var n *node
		switch {
		case strings.HasSuffix(name, ".qcow2"):
			h, err := imageformat.ReadQcow2Header(filepath.Join(s.dir, name))
			if err != nil {
				s.d.log.Warn("skipping unreadable image", "sr", s.uuid, "file", name, "err", err)
				continue
			}
			n = &node{name: name, format: "qcow2", header: h, backing: h.BackingFile}
			if b := h.BackingFile; b != "" && !strings.Contains(b, "/") {
				n.parent = b
			} else if b != "" && filepath.Dir(b) == s.dir {
				n.parent = filepath.Base(b)
			}
		case imageformat.FormatOfName(name) == "raw":
			n = &node{name: name, format: "raw"}
		default:
			continue
		}
		nodes[name] = n
	}
	for _, n := range nodes {
		if n.parent != "" {
			kids[n.parent] = append(kids[n.parent], n.name)
		}
	}
	for _, k := range kids {
		sort.Strings(k)
	}
	return nodes, kids, nil
}

func fileBlocks(path string) int64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

func (s *fileSR) volume(key string, n *node, kids map[string][]string, m *srMeta) Volume {
	p := filepath.Join(s.dir, n.name)
	v := Volume{Key: key, PhysicalUtilisation: fileBlocks(p), Format: n.format}
	if n.header != nil {
		v.VirtualSize = int64(n.header.Size)
	} else if st, err := os.Stat(p); err == nil { //nolint:gosec // a volume file of this SR: names are checked volume keys (checkVolumeKey, safepath)
		v.VirtualSize = st.Size()
	}
	// An image something is backed by must never change.
	v.ReadOnly = len(kids[n.name]) > 0 || strings.HasSuffix(n.name, ".iso")
	if vm, ok := m.Volumes[key]; ok {
		v.UUID, v.Name, v.Description, v.Type = vm.UUID, vm.Name, vm.Description, vm.Type
		v.Sharable, v.IsSnapshot, v.SnapshotOf, v.SnapshotTime = vm.Sharable, vm.IsSnapshot, vm.SnapshotOf, vm.SnapshotTime
	}
	if v.UUID == "" && isUUID(key) {
		v.UUID = key
	}
	if v.Name == "" && !isUUID(key) {
		v.Name = key
	}
	return v
}

func (s *fileSR) Scan(ctx context.Context) ([]Volume, error) {
	s.mu.Lock()
	nodes, kids, err := s.graph()
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	m := s.meta()
	var out []Volume
	for name, n := range nodes {
		if key := keyOf(name); key != "" {
			out = append(out, s.volume(key, n, kids, m))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	s.kickGC()
	return out, nil
}

func (s *fileSR) VolumeStat(ctx context.Context, key string) (Volume, error) {
	p, _, err := s.pathOf(key)
	if err != nil {
		return Volume{}, err
	}
	s.mu.Lock()
	nodes, kids, err := s.graph()
	s.mu.Unlock()
	if err != nil {
		return Volume{}, err
	}
	n := nodes[filepath.Base(p)]
	if n == nil {
		return Volume{}, BackendError(smVDIMissing, fmt.Sprintf("volume %s: no image %s in %s", key, filepath.Base(p), s.dir))
	}
	return s.volume(key, n, kids, s.meta()), nil
}

func (s *fileSR) VolumeIntroduce(ctx context.Context, key string) (Volume, error) {
	return s.VolumeStat(ctx, key)
}

// waitIdle waits, with s.mu held, until no coalesce works on key.
func (s *fileSR) waitIdle(ctx context.Context, key string) error {
	if !s.busy[key] {
		return nil
	}
	stop := context.AfterFunc(ctx, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer stop()
	for s.busy[key] {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.cond.Wait()
	}
	return nil
}

func (s *fileSR) VolumeCreate(ctx context.Context, v VolumeSpec) (Volume, error) {
	key := v.UUID
	if !isUUID(key) {
		key = uuid.NewString()
	}
	if v.Size < 0 || v.Size > imageformat.MaxVirtualSize {
		return Volume{}, BackendError(smVDISize, fmt.Sprintf("virtual size %d is out of range (0 to %d)", v.Size, imageformat.MaxVirtualSize))
	}
	p := filepath.Join(s.dir, key+qcowSuffix)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := imageformat.CreateQcow2(p, v.Size, "", ""); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return Volume{}, BackendError(smVDIExists, "volume "+key+" already exists")
		}
		return Volume{}, BackendError(smVDICreate, err.Error())
	}
	if err := s.putMeta(key, v); err != nil {
		_ = os.Remove(p)
		return Volume{}, BackendError(smVDICreate, err.Error())
	}
	if err := atomicfile.SyncDir(s.dir); err != nil {
		return Volume{}, BackendError(smVDICreate, err.Error())
	}
	return s.statLocked(key)
}

func (s *fileSR) putMeta(key string, v VolumeSpec) error {
	return s.withMeta(func(m *srMeta) (bool, error) {
		m.Volumes[key] = volMeta{UUID: v.UUID, Name: v.Name, Description: v.Description, Type: v.Type, Sharable: v.Sharable,
			IsSnapshot: v.IsSnapshot, SnapshotOf: v.SnapshotOf, SnapshotTime: v.Time, Created: true}
		return true, nil
	})
}

func (s *fileSR) statLocked(key string) (Volume, error) {
	p, _, err := s.pathOf(key)
	if err != nil {
		return Volume{}, err
	}
	n, kids, err := s.nodeOf(key, p)
	if err != nil {
		return Volume{}, err
	}
	return s.volume(key, n, kids, s.meta()), nil
}

// nodeOf is the image of volume key, at p, in the SR's backing graph,
// and the graph's children. The caller holds s.mu.
func (s *fileSR) nodeOf(key, p string) (*node, map[string][]string, error) {
	nodes, kids, err := s.graph()
	if err != nil {
		return nil, nil, err
	}
	n := nodes[filepath.Base(p)]
	if n == nil {
		return nil, nil, BackendError(smVDIMissing, "volume "+key+" is missing")
	}
	return n, kids, nil
}

func (s *fileSR) VolumeSetName(ctx context.Context, key, name, description string) error {
	return s.withMeta(func(m *srMeta) (bool, error) {
		vm := m.Volumes[key]
		vm.Name, vm.Description = name, description
		m.Volumes[key] = vm
		return true, nil
	})
}

func (s *fileSR) VolumeDestroy(ctx context.Context, key string) error {
	p, _, err := s.pathOf(key)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.waitIdle(ctx, key); err != nil {
		return err
	}
	if s.attached[key] != nil {
		return BackendError(smVDIInUse, "volume "+key+" is attached")
	}
	if s.d.shared {
		l, err := s.tryLock(key, true)
		if err != nil {
			return err
		}
		defer func(c func() error) { _ = c() }(l.Close)
	}
	_, kids, err := s.graph()
	if err != nil {
		return err
	}
	if len(kids[filepath.Base(p)]) > 0 {
		return BackendError(smVDIRemove, fmt.Sprintf("volume %s is the backing file of %s", key, strings.Join(kids[filepath.Base(p)], ", ")))
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return BackendError(smVDIRemove, err.Error())
	}
	if s.d.shared {
		if lp, err := safepath.JoinName(filepath.Join(s.dir, srLocksDir), key); err == nil {
			_ = os.Remove(lp)
		}
	}
	if err := s.withMeta(func(m *srMeta) (bool, error) {
		_, had := m.Volumes[key]
		delete(m.Volumes, key)
		return had, nil
	}); err != nil {
		return BackendError(smVDIRemove, err.Error())
	}
	if err := atomicfile.SyncDir(s.dir); err != nil {
		return BackendError(smVDIRemove, err.Error())
	}
	s.kickGC()
	return nil
}

func (s *fileSR) VolumeResize(ctx context.Context, key string, size int64) (Volume, error) {
	p, format, err := s.pathOf(key)
	if err != nil {
		return Volume{}, err
	}
	if size > imageformat.MaxVirtualSize {
		return Volume{}, BackendError(smVDISize, fmt.Sprintf("virtual size %d is over the maximum %d", size, imageformat.MaxVirtualSize))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.waitIdle(ctx, key); err != nil {
		return Volume{}, err
	}
	if s.attached[key] != nil {
		return Volume{}, BackendError(smVDIInUse, "volume "+key+" is attached; resize it offline")
	}
	size = imageformat.RoundUp(size, 512)
	if _, err := qemuImg(ctx, "resize", "-f", format, p, fmt.Sprint(size)); err != nil {
		return Volume{}, BackendError(smVDIResize, err.Error())
	}
	return s.statLocked(key)
}

func (s *fileSR) VolumeSnapshot(ctx context.Context, key string, meta VolumeSpec, live LiveSwitch) (Volume, error) {
	meta.IsSnapshot = true
	return s.branch(ctx, "snapshot", key, meta, live)
}

func (s *fileSR) VolumeClone(ctx context.Context, key string, meta VolumeSpec, live LiveSwitch) (Volume, error) {
	return s.branch(ctx, "clone", key, meta, live)
}

// branch makes a new volume with the content key has now, without copying
// data (except for raw images, which are copied into a new qcow2).
func (s *fileSR) branch(ctx context.Context, op, key string, meta VolumeSpec, live LiveSwitch) (Volume, error) {
	code := smVDIClone
	if op == "snapshot" {
		code = smVDISnapshot
	}
	p, format, err := s.pathOf(key)
	if err != nil {
		return Volume{}, err
	}
	newKey := meta.UUID
	if !isUUID(newKey) {
		newKey = uuid.NewString()
		meta.UUID = newKey
	}
	newName := newKey + qcowSuffix
	newPath := filepath.Join(s.dir, newName)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.waitIdle(ctx, key); err != nil {
		return Volume{}, err
	}
	n, kids, err := s.nodeOf(key, p)
	if err != nil {
		return Volume{}, err
	}
	fail := func(err error) (Volume, error) { return Volume{}, asBackend(err, code) }
	a := s.attached[key]
	writing := a != nil && !a.readonly
	if s.d.shared && a == nil {
		// Nobody else may write it while it changes shape (when this host
		// holds it, its lock already keeps other hosts' writers out).
		l, err := s.tryLock(key, true)
		if err != nil {
			return Volume{}, err
		}
		defer func(c func() error) { _ = c() }(l.Close)
	}
	switch {
	case n.format == "raw":
		// No overlay can make a raw image immutable in place: copy.
		if _, err := qemuImg(ctx, "convert", "-U", "-f", "raw", "-O", "qcow2", p, newPath); err != nil {
			_ = os.Remove(newPath)
			return fail(err)
		}
	case len(kids[n.name]) > 0:
		// Already immutable (something is backed by it): a new overlay on
		// it is a copy.
		if err := imageformat.CreateQcow2(newPath, int64(n.header.Size), n.name, format); err != nil {
			return fail(err)
		}
	case n.parent != "" && !writing && isEmptyImage(p):
		// The volume has nothing of its own: share its parent.
		if err := imageformat.CreateQcow2(newPath, int64(n.header.Size), n.parent, "qcow2"); err != nil {
			return fail(err)
		}
	default:
		if err := s.splitUnderBase(ctx, op, key, p, n, newName, writing, live); err != nil {
			return fail(err)
		}
	}
	if meta.Time.IsZero() {
		meta.Time = time.Now().UTC()
	}
	if op == "snapshot" {
		meta.SnapshotOf = key
	}
	if err := s.putMeta(newKey, meta); err != nil {
		_ = os.Remove(newPath)
		_ = os.Remove(filepath.Join(s.dir, srJournal))
		return fail(err)
	}
	_ = os.Remove(filepath.Join(s.dir, srJournal))
	if err := atomicfile.SyncDir(s.dir); err != nil {
		return fail(err)
	}
	return s.statLocked(newKey)
}

// splitUnderBase branches a volume with data of its own: its image n at p
// becomes a read-only base, a fresh overlay on the base takes its place
// (and, when it is attached for writing, live switches the running
// writer onto it), and a second overlay on the base, newName, is the new
// volume. The SR journal covers the steps until the caller removes it;
// a failure before the volume runs on its overlay puts the image back.
// A reset-on-boot VDI keeps its reset point. The caller holds s.mu.
func (s *fileSR) splitUnderBase(ctx context.Context, op, key, p string, n *node, newName string, writing bool, live LiveSwitch) error {
	newPath := filepath.Join(s.dir, newName)
	base := uuid.NewString() + baseSuffix
	basePath := filepath.Join(s.dir, base)
	j, _ := json.Marshal(journal{Op: op, Key: key, Path: n.name, Base: base, New: newName})
	if err := writeFileAtomic(filepath.Join(s.dir, srJournal), j); err != nil {
		return err
	}
	undo := func() {
		_ = os.Remove(newPath)
		_ = os.Remove(p)
		if err := os.Rename(basePath, p); err != nil {
			// The journal stays: recovery puts the base back at the
			// next attach.
			s.d.log.Error("rolling back a branch: left to the journal", "sr", s.uuid, "err", err)
			return
		}
		_ = os.Remove(filepath.Join(s.dir, srJournal))
		_ = atomicfile.SyncDir(s.dir) // the rollback is complete either way
	}
	if err := os.Rename(p, basePath); err != nil {
		_ = os.Remove(filepath.Join(s.dir, srJournal))
		return err
	}
	if err := imageformat.CreateQcow2(p, int64(n.header.Size), base, "qcow2"); err != nil {
		undo()
		return err
	}
	if err := atomicfile.SyncDir(s.dir); err != nil {
		undo()
		return err
	}
	if live != nil && writing {
		if err := live(ctx, Datapath{Kind: "file", Path: p, Format: "qcow2"}); err != nil {
			undo()
			return err
		}
	}
	if err := imageformat.CreateQcow2(newPath, int64(n.header.Size), base, "qcow2"); err != nil {
		// The VDI now runs on its new overlay: keep that, lose the new
		// volume only.
		_ = os.Remove(filepath.Join(s.dir, srJournal))
		return err
	}
	return nil
}

func isEmptyImage(p string) bool {
	e, err := imageformat.Qcow2IsEmpty(p)
	return err == nil && e
}

// tryLock takes the attach lock of a key without waiting.
func (s *fileSR) tryLock(key string, exclusive bool) (*os.File, error) {
	_ = os.MkdirAll(filepath.Join(s.dir, srLocksDir), 0o700) //nolint:gosec // the SR's own lock dir; the OpenFile below reports a failure
	lp, err := safepath.JoinName(filepath.Join(s.dir, srLocksDir), key)
	if err != nil {
		return nil, BackendError(smVDIUnavailable, err.Error())
	}
	f, err := os.OpenFile(lp, fileSRFlags, 0o600) //nolint:gosec // lp is safepath.JoinName'd above
	if err != nil {
		return nil, BackendError(smVDIUnavailable, err.Error())
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	if err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, xerr.New(xerr.VDIInUse, key, "attached on another host")
		}
		return nil, BackendError(smVDIUnavailable, err.Error())
	}
	return f, nil
}

func (s *fileSR) VolumeAttach(ctx context.Context, key string, readonly bool) (Datapath, error) {
	p, format, err := s.pathOf(key)
	if err != nil {
		return Datapath{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.waitIdle(ctx, key); err != nil {
		return Datapath{}, err
	}
	if _, err := os.Stat(p); err != nil { //nolint:gosec // a volume file of this SR: names are checked volume keys (checkVolumeKey, safepath)
		return Datapath{}, BackendError(smVDIUnavailable, fmt.Sprintf("volume %s: %v", key, unwrapPathErr(err)))
	}
	if err := s.checkChain(p, format); err != nil {
		return Datapath{}, BackendError(smVDIUnavailable, fmt.Sprintf("volume %s: %v", key, err))
	}
	if !readonly {
		if _, kids, err := s.graph(); err == nil && len(kids[filepath.Base(p)]) > 0 {
			return Datapath{}, xerr.New(xerr.VDIReadonly, key)
		}
	}
	a := &fileAttach{readonly: readonly}
	if s.d.shared {
		// Going from read-only to read-write: let go of the shared lock
		// first (a second open file would conflict with it), and take it
		// back if the exclusive one cannot be had.
		old := s.attached[key]
		if old != nil && old.lock != nil {
			_ = old.lock.Close()
			old.lock = nil
		}
		if a.lock, err = s.tryLock(key, !readonly); err != nil {
			if old != nil {
				old.lock, _ = s.tryLock(key, !old.readonly)
			}
			return Datapath{}, err
		}
	} else if old := s.attached[key]; old != nil && old.lock != nil {
		_ = old.lock.Close()
	}
	s.attached[key] = a
	return Datapath{Kind: "file", Path: p, Format: format, ReadOnly: readonly}, nil
}

func (s *fileSR) VolumeActivate(ctx context.Context, key string, readonly bool) error {
	if readonly {
		return nil
	}
	m := s.meta()
	vm := m.Volumes[key]
	if vm.ResetBase == "" {
		return nil
	}
	// on_boot=reset: start from the reset point every time.
	p, _, err := s.pathOf(key)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	h, err := imageformat.ReadQcow2Header(p)
	if err != nil {
		return BackendError(smVDIUnavailable, err.Error())
	}
	if isEmptyImage(p) && h.BackingFile == vm.ResetBase {
		return nil
	}
	if !isOwnBase(vm.ResetBase) {
		return BackendError(smVDIUnavailable, fmt.Sprintf("volume %s: reset point %q is not a base of this SR", key, clip(vm.ResetBase, 200)))
	}
	tmp := filepath.Join(s.dir, tmpPrefix+filepath.Base(p))
	_ = os.Remove(tmp) //nolint:gosec // a volume file of this SR: names are checked volume keys (checkVolumeKey, safepath)
	if err := imageformat.CreateQcow2(tmp, int64(h.Size), vm.ResetBase, "qcow2"); err != nil {
		return BackendError(smVDIUnavailable, err.Error())
	}
	if err := os.Rename(tmp, p); err != nil { //nolint:gosec // a volume file of this SR: names are checked volume keys (checkVolumeKey, safepath)
		_ = os.Remove(tmp) //nolint:gosec // a volume file of this SR: names are checked volume keys (checkVolumeKey, safepath)
		return BackendError(smVDIUnavailable, err.Error())
	}
	return atomicfile.SyncDir(s.dir)
}

func (s *fileSR) VolumeDeactivate(ctx context.Context, key string) error { return nil }

func (s *fileSR) VolumeDetach(ctx context.Context, key string) error {
	s.mu.Lock()
	if a := s.attached[key]; a != nil {
		if a.lock != nil {
			_ = a.lock.Close()
		}
		delete(s.attached, key)
	}
	s.mu.Unlock()
	s.kickGC()
	return nil
}

func (s *fileSR) SetResetOnBoot(ctx context.Context, key string, reset bool) error {
	p, format, err := s.pathOf(key)
	if err != nil {
		return err
	}
	if format != "qcow2" {
		return xerr.New(xerr.VDIIncompatibleType, key, format)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !reset {
		return s.withMeta(func(m *srMeta) (bool, error) {
			vm := m.Volumes[key]
			vm.ResetBase = ""
			m.Volumes[key] = vm
			return true, nil
		})
	}
	// Freeze the current content as the reset point.
	h, err := imageformat.ReadQcow2Header(p)
	if err != nil {
		return BackendError(smVDIUnavailable, err.Error())
	}
	base := uuid.NewString() + baseSuffix
	basePath := filepath.Join(s.dir, base)
	if err := os.Rename(p, basePath); err != nil {
		return BackendError(smVDIUnavailable, err.Error())
	}
	if err := imageformat.CreateQcow2(p, int64(h.Size), base, "qcow2"); err != nil {
		if rerr := os.Rename(basePath, p); rerr != nil {
			err = fmt.Errorf("%w; and the volume is left at %s: %v", err, basePath, rerr)
		}
		return BackendError(smVDIUnavailable, err.Error())
	}
	return s.withMeta(func(m *srMeta) (bool, error) {
		vm := m.Volumes[key]
		vm.ResetBase = base
		m.Volumes[key] = vm
		return true, nil
	})
}

// checkChain makes sure that what QEMU will open for an image stays in
// the SR: every backing file (links followed) inside the SR directory and
// no external data file, whose name the image's header would choose. An
// image found in the directory, or written by another host of a shared
// SR, could otherwise hand any host file to a VM.
func (s *fileSR) checkChain(p, format string) error {
	paths, formats, err := imageformat.Chain(p, format)
	if err != nil {
		return err
	}
	for i, q := range paths {
		if !safepath.Contains(s.dir, q) {
			return fmt.Errorf("its backing file %s is outside the SR", q)
		}
		if formats[i] == "qcow2" {
			h, err := imageformat.ReadQcow2Header(q)
			if err != nil {
				return err
			}
			if h.ExternalDataFile {
				return fmt.Errorf("%s has an external data file", filepath.Base(q))
			}
		}
	}
	return nil
}

// volImage is a volume's image file and its backing chain (chain's paths).
type volImage struct {
	path, format string
	chain        []string
}

// imagePair reads the images of volumes key and baseKey.
func (s *fileSR) imagePair(key, baseKey string) (k, b volImage, err error) {
	for _, x := range []struct {
		key string
		to  *volImage
	}{{key, &k}, {baseKey, &b}} {
		p, f, err := s.pathOf(x.key)
		if err != nil {
			return k, b, err
		}
		c, _, err := imageformat.Chain(p, f)
		if err != nil {
			return k, b, err
		}
		*x.to = volImage{path: p, format: f, chain: c}
	}
	return k, b, nil
}

// ChangedExtents finds where key differs from baseKey using their shared
// backing chain: what was written on either side since they parted.
func (s *fileSR) ChangedExtents(ctx context.Context, key, baseKey string) ([]Extent, error) {
	k, b, err := s.imagePair(key, baseKey)
	if err != nil {
		return nil, err
	}
	p, f, ck := k.path, k.format, k.chain
	bp, bf, cb := b.path, b.format, b.chain
	ik, ib := -1, -1
	for i, x := range ck {
		if j := slicesIndex(cb, x); j >= 0 {
			ik, ib = i, j
			break
		}
	}
	if ik < 0 {
		return nil, errNoCommonHistory
	}
	hk, err := imageSize(p, f)
	if err != nil {
		return nil, err
	}
	hb, err := imageSize(bp, bf)
	if err != nil {
		return nil, err
	}
	mk, err := imageMap(ctx, p, f, hk)
	if err != nil {
		return nil, err
	}
	mb, err := imageMap(ctx, bp, bf, hb)
	if err != nil {
		return nil, err
	}
	var changed []Extent
	for _, e := range mk {
		if e.Present && e.Depth < ik {
			changed = append(changed, Extent{Offset: e.Start, Length: e.Length})
		}
	}
	for _, e := range mb {
		if e.Present && e.Depth < ib && e.Start < hk {
			changed = append(changed, Extent{Offset: e.Start, Length: min(e.Length, hk-e.Start)})
		}
	}
	if hk > hb {
		changed = append(changed, Extent{Offset: hb, Length: hk - hb})
	}
	return annotateZero(imageformat.MergeExtents(changed), mk), nil
}

var errNoCommonHistory = errors.New("the volumes share no backing image")

func slicesIndex(list []string, x string) int {
	for i, y := range list {
		if y == x {
			return i
		}
	}
	return -1
}

func imageSize(path, format string) (int64, error) {
	if format == "qcow2" {
		h, err := imageformat.ReadQcow2Header(path)
		if err != nil {
			return 0, err
		}
		return int64(h.Size), nil
	}
	st, err := os.Stat(path) //nolint:gosec // a volume file of this SR: names are checked volume keys (checkVolumeKey, safepath)
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// annotateZero splits ranges at the map's boundaries and marks the parts
// that read as zeroes.
func annotateZero(ranges []Extent, m []extent) []Extent {
	var out []Extent
	i := 0
	for _, r := range ranges {
		off, end := r.Offset, r.Offset+r.Length
		for off < end {
			for i < len(m) && m[i].Start+m[i].Length <= off {
				i++
			}
			if i >= len(m) {
				out = append(out, Extent{Offset: off, Length: end - off})
				break
			}
			e := m[i]
			stop := min(end, e.Start+e.Length)
			zero := e.Zero && !e.Data || !e.Present
			if n := len(out); n > 0 && out[n-1].Offset+out[n-1].Length == off && out[n-1].Zero == zero {
				out[n-1].Length += stop - off
			} else {
				out = append(out, Extent{Offset: off, Length: stop - off, Zero: zero})
			}
			off = stop
		}
	}
	return out
}

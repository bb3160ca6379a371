package rrdd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"toolstackd/internal/rrd"
	"toolstackd/internal/rrd/plugin"
)

// Step is the length of one primary data point: rrdd samples every 5 s.
const Step = 5 * time.Second

// Bounds on what samplers may make the service keep.
const (
	// MaxSourcesPerOwner bounds the data sources one host, VM or SR may
	// have; readings for more are dropped.
	MaxSourcesPerOwner = 2048
	// MaxOwners bounds the VMs and SRs kept in memory at once.
	MaxOwners = 100_000
)

// Reading is one data source's value at one tick, with the source's
// description (name, owner, type, bounds, whether it is recorded by
// default) in the plugin protocol's terms, which are xapi's.
type Reading struct {
	Source plugin.Source
	Value  rrd.Value
}

// Sampler gives the readings of one part of the host at each tick: the
// host's counters, the running VMs', the attached SRs', one plugin's.
// Sample is called from the service's loop only, never concurrently with
// itself, and should return before ctx's deadline.
type Sampler interface {
	Sample(ctx context.Context, now time.Time) ([]Reading, error)
}

// SamplerFunc adapts a function to Sampler.
type SamplerFunc func(ctx context.Context, now time.Time) ([]Reading, error)

// Sample calls f.
func (f SamplerFunc) Sample(ctx context.Context, now time.Time) ([]Reading, error) {
	return f(ctx, now)
}

// Named is a sampler with the name the log uses for it.
type Named struct {
	Name string
	Sampler
}

// Config configures a Service.
type Config struct {
	// Dir holds the archives, one <uuid>.gz per host, VM and SR.
	Dir string
	// HostUUID names this host's RRD.
	HostUUID string
	// Samplers are asked for readings at every tick, in order.
	Samplers []Named
	// Exists says whether a VM or SR is one the database knows; readings
	// for others are dropped (a plugin may name any uuid). Nil accepts
	// all.
	Exists func(o plugin.Owner) bool
	// MinMax says whether new VM and SR RRDs get MIN and MAX archives
	// (the pool's other_config:create_min_max_in_new_VM_RRDs).
	MinMax func() bool
	// SampleTimeout bounds each sampler at each tick (default 4 s).
	SampleTimeout time.Duration
	// ArchiveEvery is how often every RRD in memory is written to Dir
	// (default 10 minutes); they are also written when an owner stops
	// reporting and on Close.
	ArchiveEvery time.Duration
	Log          *slog.Logger
}

// Service keeps this host's RRDs: the host's, and those of the VMs and
// SRs it reports on. Its methods are safe for concurrent use.
type Service struct {
	cfg Config
	log *slog.Logger

	mu   sync.Mutex
	host *series
	// owned holds the VMs' and SRs' series in memory; an owner that
	// stops reporting is archived and dropped after missedLimit ticks.
	owned map[plugin.Owner]*series
	// loggedSampler remembers which samplers' errors were logged, so a
	// sampler that keeps failing logs once until it recovers.
	loggedSampler map[string]bool
	lastArchive   time.Time
	// dropped counts readings refused since the last log of it.
	dropped int
	// afterTick run after each tick (OnTick).
	afterTick []func(now time.Time)
	// ticks counts the ticks done (the watchdog's sign of progress).
	ticks atomic.Uint64
	// backup is host.backup_rrds's pending archiving, due at backupDue.
	backup    *time.Timer
	backupDue time.Time
}

// OnTick adds a function called after each tick with the tick's time
// (the database publisher). Call it before Run.
func (s *Service) OnTick(f func(now time.Time)) { s.afterTick = append(s.afterTick, f) }

// Ticks is the number of ticks done so far.
func (s *Service) Ticks() uint64 { return s.ticks.Load() }

// series is one owner's RRD with what rrdd knows of its sources.
type series struct {
	owner plugin.Owner
	rrd   *rrd.RRD
	// live are the sources reported lately, by name; a source is enabled
	// (recorded) when the RRD has it.
	live map[string]plugin.Source
	// missed counts the ticks since the owner last reported.
	missed int
	// fresh says the next update starts a new series (the owner just
	// came back): DERIVE sources take their first reading as a base.
	fresh bool
}

// missedLimit is how many ticks a VM or SR may go without readings
// before its RRD is archived and dropped from memory (a VM that stopped,
// or a sampler that failed for a while).
const missedLimit = 3

// New opens the service: it makes Dir and loads the host's archive.
func New(cfg Config) (*Service, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.SampleTimeout <= 0 {
		cfg.SampleTimeout = 4 * time.Second
	}
	if cfg.ArchiveEvery <= 0 {
		cfg.ArchiveEvery = 10 * time.Minute
	}
	if cfg.MinMax == nil {
		cfg.MinMax = func() bool { return false }
	}
	if err := validUUID(cfg.HostUUID); err != nil {
		return nil, fmt.Errorf("rrdd: host: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("rrdd: %w", err)
	}
	s := &Service{cfg: cfg, log: cfg.Log, owned: map[plugin.Owner]*series{}, loggedSampler: map[string]bool{}}
	host := plugin.Owner{Kind: plugin.Host}
	s.host = &series{owner: host, live: map[string]plugin.Source{}, fresh: true}
	r, err := s.loadArchive(cfg.HostUUID)
	switch {
	case err == nil:
		s.host.rrd = r
	case !errors.Is(err, os.ErrNotExist):
		s.log.Warn("the host's metrics archive does not load; starting a new one", "err", err)
	}
	return s, nil
}

// Run ticks every Step until ctx ends, then archives every RRD.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(Step)
	defer t.Stop()
	s.lastArchive = time.Now()
	for {
		select {
		case <-ctx.Done():
			if err := s.ArchiveAll(); err != nil {
				s.log.Warn("archiving metrics", "err", err)
			}
			return
		case now := <-t.C:
			s.Tick(ctx, now)
			if now.Sub(s.lastArchive) >= s.cfg.ArchiveEvery {
				s.lastArchive = now
				if err := s.ArchiveAll(); err != nil {
					s.log.Warn("archiving metrics", "err", err)
				}
				if err := s.Prune(); err != nil {
					s.log.Warn("pruning metrics archives", "err", err)
				}
			}
		}
	}
}

// Tick asks every sampler for readings and records them as taken at now.
func (s *Service) Tick(ctx context.Context, now time.Time) {
	var all []Reading
	for _, n := range s.cfg.Samplers {
		sctx, cancel := context.WithTimeout(ctx, s.cfg.SampleTimeout)
		rs, err := n.Sample(sctx, now)
		cancel()
		s.noteSampler(n.Name, err)
		if err == nil {
			all = append(all, rs...)
		}
	}
	s.record(now, all)
	for _, f := range s.afterTick {
		f(now)
	}
	s.ticks.Add(1)
}

// noteSampler logs a sampler's failure once, and its recovery.
func (s *Service) noteSampler(name string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err != nil && !s.loggedSampler[name]:
		s.loggedSampler[name] = true
		s.log.Warn("metrics: a sampler failed; its readings are skipped until it recovers", "sampler", name, "err", err)
	case err == nil && s.loggedSampler[name]:
		delete(s.loggedSampler, name)
		s.log.Info("metrics: a sampler recovered", "sampler", name)
	}
}

// record applies one tick's readings to the RRDs.
func (s *Service) record(now time.Time, readings []Reading) {
	byOwner := map[plugin.Owner][]Reading{}
	// accepted holds each owner's verdict, asked once per tick (an owner
	// has many readings).
	accepted := map[plugin.Owner]bool{}
	for _, r := range readings {
		o := r.Source.Owner
		if o.Kind != plugin.Host {
			o.UUID = strings.ToLower(o.UUID)
			ok, seen := accepted[o]
			if !seen {
				ok = validUUID(o.UUID) == nil && (s.cfg.Exists == nil || s.cfg.Exists(o))
				accepted[o] = ok
			}
			if !ok {
				s.dropped++
				continue
			}
		} else {
			o.UUID = ""
		}
		r.Source.Owner = o
		byOwner[o] = append(byOwner[o], r)
	}
	var toArchive []*series
	s.mu.Lock()
	for o, rs := range byOwner {
		se := s.host
		if o.Kind != plugin.Host {
			se = s.owned[o]
			if se == nil {
				if len(s.owned) >= MaxOwners {
					s.dropped += len(rs)
					continue
				}
				se = &series{owner: o, live: map[string]plugin.Source{}, fresh: true}
				if r, err := s.loadArchive(o.UUID); err == nil {
					se.rrd = r
				}
				s.owned[o] = se
			}
		}
		s.update(se, now, rs)
	}
	for o, se := range s.owned {
		if _, ok := byOwner[o]; ok {
			continue
		}
		if se.missed++; se.missed >= missedLimit {
			delete(s.owned, o)
			toArchive = append(toArchive, se)
		}
	}
	if s.dropped > 0 {
		s.log.Debug("metrics: readings dropped (unknown owner, bad uuid, or over a bound)", "count", s.dropped)
		s.dropped = 0
	}
	s.mu.Unlock()
	for _, se := range toArchive {
		if err := s.saveArchive(se.owner, se.rrd); err != nil {
			s.log.Warn("archiving metrics", "owner", se.owner.UUID, "err", err)
		}
	}
}

// update applies one owner's readings; s.mu is held.
func (s *Service) update(se *series, now time.Time, rs []Reading) {
	se.missed = 0
	for _, r := range rs {
		if _, ok := se.live[r.Source.Name]; !ok && len(se.live) >= MaxSourcesPerOwner {
			s.dropped++
			continue
		}
		se.live[r.Source.Name] = r.Source
	}
	if se.rrd == nil {
		var dss []rrd.DS
		for _, r := range rs {
			if r.Source.Default && len(dss) < MaxSourcesPerOwner && !slices.ContainsFunc(dss, func(d rrd.DS) bool { return d.Name == r.Source.Name }) {
				dss = append(dss, dsOf(r.Source))
			}
		}
		rr, err := rrd.New(int64(Step/time.Second), now.Add(-Step), dss, s.layout(se.owner.Kind))
		if err != nil {
			s.log.Warn("metrics: cannot make an RRD", "owner", se.owner.UUID, "err", err)
			return
		}
		se.rrd = rr
	}
	if float64(now.UnixNano())/1e9 <= se.rrd.LastUpdated() {
		return // a clock that went back; rrdd skips such a reading
	}
	// Every source of the RRD gets a reading: the one given, or unknown.
	// A default source that appeared since the RRD was made is added
	// first, as rrdd merges new default sources into existing RRDs.
	n := len(se.rrd.DSs())
	values := make([]rrd.Value, n, n+1)
	for _, r := range rs {
		i := se.rrd.DSIndex(r.Source.Name)
		if i < 0 && r.Source.Default && len(values) < MaxSourcesPerOwner && se.rrd.AddDS(now, dsOf(r.Source)) == nil {
			values = append(values, rrd.UnknownValue())
			i = len(values) - 1
		}
		if i >= 0 {
			values[i] = r.Value
		}
	}
	if err := se.rrd.UpdateSome(now, nil, values, se.fresh); err != nil {
		s.log.Debug("metrics: update refused", "owner", se.owner.UUID, "err", err)
		return
	}
	se.fresh = false
}

// layout is the archive list for a new RRD of this kind of owner.
func (s *Service) layout(k plugin.OwnerKind) []rrd.RRAConfig {
	switch k {
	case plugin.Host:
		return rrd.HostArchives()
	case plugin.SR:
		return rrd.SRArchives(s.cfg.MinMax())
	default:
		return rrd.VMArchives(s.cfg.MinMax())
	}
}

// dsOf is the RRD data source for a reading's source, with rrdd's
// heartbeat.
func dsOf(src plugin.Source) rrd.DS {
	lo, hi := src.Min, src.Max
	if math.IsNaN(lo) {
		lo = math.Inf(-1)
	}
	if math.IsNaN(hi) {
		hi = math.Inf(1)
	}
	return rrd.DS{Name: src.Name, Type: src.Type, Min: lo, Max: hi, Heartbeat: rrd.DefaultHeartbeat}
}

// ErrNoRRD is returned for an owner this host keeps no RRD for.
var ErrNoRRD = errors.New("rrdd: no RRD for this owner")

// DataSource describes a data source as get_data_sources lists it.
type DataSource struct {
	Name, Description, Units string
	// Enabled says the source is being recorded; Standard that it is
	// recorded by default.
	Enabled, Standard bool
	Min, Max          float64
}

// series returns the owner's series in memory, or one made from its
// archive (not kept in memory); s.mu is held.
func (s *Service) lookup(o plugin.Owner) (*series, bool) {
	if o.Kind == plugin.Host {
		return s.host, s.host.rrd != nil || len(s.host.live) > 0
	}
	if se, ok := s.owned[o]; ok {
		return se, true
	}
	if validUUID(o.UUID) != nil {
		return nil, false
	}
	r, err := s.loadArchive(o.UUID)
	if err != nil {
		return nil, false
	}
	return &series{owner: o, rrd: r, live: map[string]plugin.Source{}}, true
}

// DataSources lists an owner's data sources as rrdd's
// query_possible_dss does: every source reported lately (enabled when it
// is recorded) and every source recorded but no longer reported
// (disabled, with no description), sorted by name. An owner with no RRD
// has none.
func (s *Service) DataSources(o plugin.Owner) []DataSource {
	s.mu.Lock()
	defer s.mu.Unlock()
	se, ok := s.lookup(o)
	if !ok {
		return nil
	}
	out := make([]DataSource, 0, len(se.live))
	for _, src := range se.live {
		out = append(out, DataSource{Name: src.Name, Description: src.Description, Units: src.Units,
			Enabled: se.rrd != nil && se.rrd.DSIndex(src.Name) >= 0, Standard: src.Default, Min: src.Min, Max: src.Max})
	}
	if se.rrd != nil {
		for _, d := range se.rrd.DSs() {
			if _, ok := se.live[d.Name]; !ok {
				out = append(out, DataSource{Name: d.Name, Description: "description not available", Units: "unknown",
					Min: d.Min, Max: d.Max})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// MissingError is rrdd's Datasource_missing: the owner or the source
// asked for is not there.
type MissingError struct{ What string }

func (e *MissingError) Error() string {
	return fmt.Sprintf("Rrd_interface.Rrdd_error(Datasource_missing(%q))", e.What)
}

// Record starts recording a source the owner reports (rrdd's add_ds).
func (s *Service) Record(o plugin.Owner, name string, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	se, ok := s.lookupLive(o)
	if !ok {
		return &MissingError{What: ownerName(o)}
	}
	src, ok := se.live[name]
	if !ok {
		return &MissingError{What: name}
	}
	if se.rrd == nil {
		return &MissingError{What: ownerName(o)}
	}
	if len(se.rrd.DSs()) >= MaxSourcesPerOwner {
		return fmt.Errorf("rrdd: %s records %d data sources already", ownerName(o), MaxSourcesPerOwner)
	}
	return se.rrd.AddDS(now, dsOf(src))
}

// lookupLive is the owner's series in memory only; s.mu is held.
func (s *Service) lookupLive(o plugin.Owner) (*series, bool) {
	if o.Kind == plugin.Host {
		return s.host, true
	}
	se, ok := s.owned[o]
	return se, ok
}

// Forget stops recording a source and drops what was recorded of it
// (rrdd's forget_*_ds). Forgetting what is not recorded does nothing.
func (s *Service) Forget(o plugin.Owner, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if se, ok := s.lookupLive(o); ok {
		if se.rrd != nil {
			se.rrd.RemoveDS(name)
		}
		return nil
	}
	// A VM or SR not reporting here: forget in its archive.
	r, err := s.loadArchive(o.UUID)
	if err != nil {
		return nil //nolint:nilerr // no archive: nothing recorded to forget, as rrdd
	}
	if r.DSIndex(name) < 0 {
		return nil
	}
	r.RemoveDS(name)
	return s.saveArchive(o, r)
}

// Query is the newest AVERAGE value of a recorded source (rrdd's
// query_*_ds).
func (s *Service) Query(o plugin.Owner, name string, now time.Time) (float64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	se, ok := s.lookupLive(o)
	if !ok || se.rrd == nil {
		return 0, &MissingError{What: ownerName(o)}
	}
	v, err := se.rrd.Query(name, now)
	if err != nil {
		return 0, &MissingError{What: name}
	}
	return v, nil
}

// Snapshot is a copy of the owner's RRD, from memory or from its archive.
func (s *Service) Snapshot(o plugin.Owner) (*rrd.RRD, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	se, ok := s.lookup(o)
	if !ok || se.rrd == nil {
		return nil, ErrNoRRD
	}
	if se == s.host || s.owned[o] == se {
		return se.rrd.Clone(), nil
	}
	return se.rrd, nil // loaded from the archive for this call: ours alone
}

// Put replaces an owner's RRD with one received (PUT /rrd: a VM's RRD
// following it from another host). A VM or SR reporting here continues
// from it; one that is not is archived.
func (s *Service) Put(o plugin.Owner, r *rrd.RRD) error {
	if o.Kind != plugin.Host {
		if err := validUUID(o.UUID); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if o.Kind == plugin.Host {
		s.host.rrd, s.host.fresh = r, true
		return nil
	}
	if se, ok := s.owned[o]; ok {
		se.rrd, se.fresh = r, true
		return nil
	}
	// Archived under the lock: a tick that begins to record the owner
	// (a migrated VM's first reading here) loads this archive, not
	// nothing, and does not start a fresh RRD over it.
	return s.saveArchive(o, r)
}

// Export is the /rrd_updates answer: the host's RRD when host is set and
// the VMs' and SRs' RRDs in memory that the selections take, sorted by
// uuid after the host, from start (Unix seconds; negative: relative to
// the last update) with rows of at least interval seconds.
func (s *Service) Export(host bool, vms, srs rrd.Selection, start, interval int64, cf rrd.CF) (*rrd.Xport, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var srcs []rrd.Source
	if host && s.host.rrd != nil {
		srcs = append(srcs, rrd.Source{Prefix: "host:" + s.cfg.HostUUID + ":", RRD: s.host.rrd})
	}
	var owned []*series
	for o, se := range s.owned {
		if se.rrd == nil {
			continue
		}
		if (o.Kind == plugin.VM && vms.Has(o.UUID)) || (o.Kind == plugin.SR && srs.Has(o.UUID)) {
			owned = append(owned, se)
		}
	}
	sort.Slice(owned, func(i, j int) bool {
		if owned[i].owner.Kind != owned[j].owner.Kind {
			return owned[i].owner.Kind < owned[j].owner.Kind
		}
		return owned[i].owner.UUID < owned[j].owner.UUID
	})
	for _, se := range owned {
		prefix := "vm:"
		if se.owner.Kind == plugin.SR {
			prefix = "sr:"
		}
		srcs = append(srcs, rrd.Source{Prefix: prefix + se.owner.UUID + ":", RRD: se.rrd})
	}
	return rrd.Export(srcs, start, interval, cf)
}

// Latest is the rate a recorded source had at the last tick, from the
// first archive (rrdd's query); ok is false when it is not recorded or
// unknown.
func (s *Service) Latest(o plugin.Owner, name string) (float64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	se, ok := s.lookupLive(o)
	if !ok || se.rrd == nil {
		return 0, false
	}
	i := se.rrd.DSIndex(name)
	if i < 0 {
		return 0, false
	}
	v, err := se.rrd.Row(0, i, 0)
	if err != nil || math.IsNaN(v) {
		return 0, false
	}
	return v, true
}

// EachLatest calls fn with the newest 5 s value of every recorded data
// source kept in memory (unknown values are left out), the host's first.
// fn must not call the service.
func (s *Service) EachLatest(fn func(o plugin.Owner, name string, v float64)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	each := func(se *series) {
		if se.rrd == nil {
			return
		}
		for i, d := range se.rrd.DSs() {
			if v, err := se.rrd.Row(0, i, 0); err == nil && !math.IsNaN(v) {
				fn(se.owner, d.Name, v)
			}
		}
	}
	each(s.host)
	for _, se := range s.owned {
		each(se)
	}
}

// Owners lists the VMs and SRs whose RRDs are in memory.
func (s *Service) Owners() []plugin.Owner {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]plugin.Owner, 0, len(s.owned))
	for o := range s.owned {
		out = append(out, o)
	}
	return out
}

// MemoryBytes is roughly what the RRDs in memory take.
func (s *Service) MemoryBytes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	if s.host.rrd != nil {
		n += s.host.rrd.MemoryBytes()
	}
	for _, se := range s.owned {
		if se.rrd != nil {
			n += se.rrd.MemoryBytes()
		}
	}
	return n
}

// ownerName is how errors name an owner, as rrdd does.
func ownerName(o plugin.Owner) string {
	switch o.Kind {
	case plugin.VM:
		return "VM: " + o.UUID
	case plugin.SR:
		return "SR: " + o.UUID
	}
	return "No host datasource!"
}

// validUUID accepts the canonical 8-4-4-4-12 hex form only: a uuid makes
// a file name.
func validUUID(u string) error {
	if len(u) != 36 {
		return fmt.Errorf("not a uuid: %.40q", u)
	}
	for i, c := range u {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return fmt.Errorf("not a uuid: %q", u)
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return fmt.Errorf("not a uuid: %q", u)
			}
		}
	}
	return nil
}

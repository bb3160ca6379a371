package rrdd

import (
	"errors"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/rrd/plugin"
	"toolstackd/internal/xerr"
)

// Register adds the data-source messages of host, VM and SR and the
// metrics HTTP endpoints. The forwarding table sends each message to the
// host that keeps the RRD (the host itself, the VM's resident host, the
// SR's master), so a handler answers from this host's RRDs.
func Register(srv *api.Server, r *mux.Router, s *Service) {
	s.routes(r, srv)
	host := func(c *api.Call, ref dm.HostRef) (plugin.Owner, error) {
		if _, err := c.Lookup(dm.Host.Class, string(ref)); err != nil {
			return plugin.Owner{}, err
		}
		return plugin.Owner{Kind: plugin.Host}, nil
	}
	vm := func(c *api.Call, ref dm.VMRef) (plugin.Owner, error) {
		row, err := c.Lookup(dm.VM.Class, string(ref))
		if err != nil {
			return plugin.Owner{}, err
		}
		return plugin.Owner{Kind: plugin.VM, UUID: strings.ToLower(row.UUID())}, nil
	}
	sr := func(c *api.Call, ref dm.SRRef) (plugin.Owner, error) {
		row, err := c.Lookup(dm.SR.Class, string(ref))
		if err != nil {
			return plugin.Owner{}, err
		}
		return plugin.Owner{Kind: plugin.SR, UUID: strings.ToLower(row.UUID())}, nil
	}

	api.Register(srv, func(c *api.Call, a dm.HostGetDataSourcesArgs) (any, error) {
		return withOwner(c, a.Host, host, func(o plugin.Owner) (any, error) { return s.records(o), nil })
	})
	api.Register(srv, func(c *api.Call, a dm.HostRecordDataSourceArgs) (dm.Void, error) {
		return void(withOwner(c, a.Host, host, func(o plugin.Owner) (any, error) { return nil, s.Record(o, a.DataSource, time.Now()) }))
	})
	api.Register(srv, func(c *api.Call, a dm.HostQueryDataSourceArgs) (float64, error) {
		return float(withOwner(c, a.Host, host, func(o plugin.Owner) (any, error) { return s.Query(o, a.DataSource, time.Now()) }))
	})
	api.Register(srv, func(c *api.Call, a dm.HostForgetDataSourceArchivesArgs) (dm.Void, error) {
		return void(withOwner(c, a.Host, host, func(o plugin.Owner) (any, error) { return nil, s.Forget(o, a.DataSource) }))
	})

	api.Register(srv, func(c *api.Call, a dm.HostBackupRrdsArgs) (dm.Void, error) {
		if _, err := c.Lookup(dm.Host.Class, string(a.Host)); err != nil {
			return dm.Void{}, err
		}
		delay := 0.0 // NaN and negative delays: now
		if a.Delay > 0 {
			delay = min(a.Delay, maxBackupDelay.Seconds())
		}
		s.BackupAfter(time.Duration(delay * float64(time.Second)))
		return dm.Void{}, nil
	})

	api.Register(srv, func(c *api.Call, a dm.VMGetDataSourcesArgs) (any, error) {
		return withOwner(c, a.Self, vm, func(o plugin.Owner) (any, error) { return s.records(o), nil })
	})
	api.Register(srv, func(c *api.Call, a dm.VMRecordDataSourceArgs) (dm.Void, error) {
		return void(withOwner(c, a.Self, vm, func(o plugin.Owner) (any, error) { return nil, s.Record(o, a.DataSource, time.Now()) }))
	})
	api.Register(srv, func(c *api.Call, a dm.VMQueryDataSourceArgs) (float64, error) {
		return float(withOwner(c, a.Self, vm, func(o plugin.Owner) (any, error) { return s.Query(o, a.DataSource, time.Now()) }))
	})
	api.Register(srv, func(c *api.Call, a dm.VMForgetDataSourceArchivesArgs) (dm.Void, error) {
		return void(withOwner(c, a.Self, vm, func(o plugin.Owner) (any, error) { return nil, s.Forget(o, a.DataSource) }))
	})

	api.Register(srv, func(c *api.Call, a dm.SRGetDataSourcesArgs) (any, error) {
		return withOwner(c, a.SR, sr, func(o plugin.Owner) (any, error) { return s.records(o), nil })
	})
	api.Register(srv, func(c *api.Call, a dm.SRRecordDataSourceArgs) (dm.Void, error) {
		return void(withOwner(c, a.SR, sr, func(o plugin.Owner) (any, error) { return nil, s.Record(o, a.DataSource, time.Now()) }))
	})
	api.Register(srv, func(c *api.Call, a dm.SRQueryDataSourceArgs) (float64, error) {
		return float(withOwner(c, a.SR, sr, func(o plugin.Owner) (any, error) { return s.Query(o, a.DataSource, time.Now()) }))
	})
	api.Register(srv, func(c *api.Call, a dm.SRForgetDataSourceArchivesArgs) (dm.Void, error) {
		return void(withOwner(c, a.SR, sr, func(o plugin.Owner) (any, error) { return nil, s.Forget(o, a.DataSource) }))
	})
}

// withOwner resolves the object a message names and runs fn for its
// owner, turning rrdd's errors into XenAPI ones.
func withOwner[R any](c *api.Call, ref R, resolve func(*api.Call, R) (plugin.Owner, error), fn func(plugin.Owner) (any, error)) (any, error) {
	o, err := resolve(c, ref)
	if err != nil {
		return nil, err
	}
	v, err := fn(o)
	return v, apiError(err)
}

func void(_ any, err error) (dm.Void, error) { return dm.Void{}, err }

func float(v any, err error) (float64, error) {
	f, _ := v.(float64)
	return f, err
}

// apiError is how rrdd's errors reach a XenAPI client: as in xapi, an
// error of the metrics daemon is an INTERNAL_ERROR carrying its text.
func apiError(err error) error {
	if err == nil {
		return nil
	}
	var m *MissingError
	if errors.As(err, &m) {
		return xerr.New(xerr.InternalError, m.Error())
	}
	return xerr.From(err)
}

// records is get_data_sources's answer: a set of data_source records
// (value is always 0, as xapi fills it).
func (s *Service) records(o plugin.Owner) []any {
	dss := s.DataSources(o)
	out := make([]any, 0, len(dss))
	for _, d := range dss {
		r := dm.DataSourceRecord{NameLabel: d.Name, NameDescription: d.Description, Enabled: d.Enabled,
			Standard: d.Standard, Units: d.Units, Min: d.Min, Max: d.Max}
		out = append(out, r.Map())
	}
	return out
}

// Package rrdd is the metrics module of a host, what xcp-rrdd is to xapi:
// every 5 s it asks its samplers for readings, keeps them in round-robin
// databases (package rrd) for the host, each VM it runs and each SR it
// has attached, archives them to disk, and serves them.
//
// # Samplers
//
// A Sampler returns Readings: a data source's description (name, owner,
// type, bounds, whether it is recorded by default: the fields of xapi's
// Ds.ds, as the plugin protocol carries them) and its value. The daemon
// wires four:
//
//   - the host (HostSampler over internal/rrdd/hoststat): cpu<n>,
//     cpu_avg, memory_total_kib, memory_free_kib, loadavg,
//     pif_<device>_rx/_tx (and _errors), pif_aggr_rx/_tx, and
//     disk_<device>_read/_write for its physical disks (toolstackd's own);
//   - the running VMs (VMSampler over the VM backends' counters, package
//     stats): cpu<n>, memory, memory_target, memory_internal_free when
//     known, vbd_<device>_read/_write/_iops_*/_iowait, vif_<n>_rx/_tx;
//     and on the host, each SR's traffic from the VM disks on it, as
//     xapi's iostat plugin names it (read_<sr>, write_<sr>,
//     io_throughput_*_<sr>, iops_*_<sr>; <sr> the uuid's first 8
//     characters; VMSRSampler);
//   - the attached SRs (SRSampler): size, physical_utilisation,
//     virtual_allocation;
//   - the plugins (PluginSampler): every file of protocol v2 in a
//     directory, as xcp-rrdd reads /dev/shm/metrics.
//
// Names, types, units and defaults are xapi's (names.go lists them),
// because clients match on them. A sampler that fails, or does not
// answer within Config.SampleTimeout, is skipped for that tick and
// logged once until it recovers; the others still count.
//
// # Recording
//
// A new RRD gets the owner's default sources, with the archive layout
// of rrd.HostArchives, rrd.VMArchives or rrd.SRArchives (MIN and MAX for
// VMs and SRs when the pool's other_config:create_min_max_in_new_VM_RRDs
// is "true"). A default source that appears later is added; the others
// are listed by DataSources as disabled until Record adds them, and
// Forget removes a source and its history. Every recorded source gets a
// reading at each tick: the value sampled, or unknown.
//
// Readings for a VM or SR the database does not know, or with an owner
// uuid that is not a uuid, are dropped (a plugin may write anything), and
// an owner may have at most MaxSourcesPerOwner sources.
//
// # Archives
//
// Each RRD is written to Dir/<uuid>.gz (the gzip of its XML dump, as
// xapi's /var/lib/xcp/blobs/rrds) atomically: every Config.ArchiveEvery,
// when a VM or SR stops reporting for three ticks (its RRD then leaves
// memory, so a host's memory holds only what runs on it), and when the
// service stops. A VM that starts again continues its archive. Remove
// deletes one (VM.destroy). Put replaces one with an RRD received
// (PUT /rrd: a VM's history following it to another host).
//
// # Serving
//
// Register adds host/VM/SR get_data_sources, record_data_source,
// query_data_source and forget_data_source_archives (errors as xapi
// gives them: INTERNAL_ERROR carrying rrdd's Datasource_missing), and the
// HTTP handlers /rrd_updates, /host_rrd, /vm_rrd, /sr_rrd and PUT /rrd.
// EachLatest feeds the Prometheus exporter; Publisher copies
// VM_metrics.memory_actual and VCPUs_utilisation into the database.
package rrdd

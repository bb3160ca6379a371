package ovs

import (
	"reflect"

	"github.com/ovn-kubernetes/libovsdb/model"
)

// The rows of the two databases this package reads and writes, as
// libovsdb models: only the columns used (libovsdb checks each against
// the server's schema when it connects, so a column missing from an
// installed Open vSwitch or OVN is an error at start-up, not later).

// Database names.
const (
	vswitchDB = "Open_vSwitch"
	nbDB      = "OVN_Northbound"
)

// ovsRoot is the Open_vSwitch table's single row.
type ovsRoot struct {
	UUID          string            `ovsdb:"_uuid"`
	Bridges       []string          `ovsdb:"bridges"`
	NextCfg       int               `ovsdb:"next_cfg"`
	CurCfg        int               `ovsdb:"cur_cfg"`
	DatapathTypes []string          `ovsdb:"datapath_types"`
	OtherConfig   map[string]string `ovsdb:"other_config"`
}

type bridgeRow struct {
	UUID         string            `ovsdb:"_uuid"`
	Name         string            `ovsdb:"name"`
	Ports        []string          `ovsdb:"ports"`
	DatapathType string            `ovsdb:"datapath_type"`
	ExternalIDs  map[string]string `ovsdb:"external_ids"`
}

type portRow struct {
	UUID        string            `ovsdb:"_uuid"`
	Name        string            `ovsdb:"name"`
	Interfaces  []string          `ovsdb:"interfaces"`
	ExternalIDs map[string]string `ovsdb:"external_ids"`
}

type ifaceRow struct {
	UUID        string            `ovsdb:"_uuid"`
	Name        string            `ovsdb:"name"`
	Type        string            `ovsdb:"type"`
	ExternalIDs map[string]string `ovsdb:"external_ids"`
	MTURequest  *int              `ovsdb:"mtu_request"`
	OFPort      *int              `ovsdb:"ofport"`
	Error       *string           `ovsdb:"error"`
}

var vswitchTables = map[string]model.Model{
	"Open_vSwitch": &ovsRoot{}, "Bridge": &bridgeRow{}, "Port": &portRow{}, "Interface": &ifaceRow{},
}

func vswitchModel() (model.ClientDBModel, error) {
	return model.NewClientDBModel(vswitchDB, vswitchTables)
}

// columnsOf is the columns of a model (its ovsdb tags but _uuid), the
// ones monitored.
func columnsOf(m model.Model) []string {
	t := reflect.TypeOf(m).Elem()
	var out []string
	for i := range t.NumField() {
		if c := t.Field(i).Tag.Get("ovsdb"); c != "" && c != "_uuid" {
			out = append(out, c)
		}
	}
	return out
}

type logicalSwitch struct {
	UUID        string            `ovsdb:"_uuid"`
	Name        string            `ovsdb:"name"`
	Ports       []string          `ovsdb:"ports"`
	ExternalIDs map[string]string `ovsdb:"external_ids"`
}

type logicalSwitchPort struct {
	UUID         string            `ovsdb:"_uuid"`
	Name         string            `ovsdb:"name"`
	Addresses    []string          `ovsdb:"addresses"`
	PortSecurity []string          `ovsdb:"port_security"`
	Enabled      *bool             `ovsdb:"enabled"`
	ExternalIDs  map[string]string `ovsdb:"external_ids"`
}

var nbTables = map[string]model.Model{"Logical_Switch": &logicalSwitch{}, "Logical_Switch_Port": &logicalSwitchPort{}}

func nbModel() (model.ClientDBModel, error) { return model.NewClientDBModel(nbDB, nbTables) }

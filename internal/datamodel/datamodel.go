// Package datamodel is the XenAPI datamodel as Go: the schema.Model built
// from the published datamodel, typed records, refs and enums. Files named
// zz_*.go are generated from datamodel.json and overlay.json by `go
// generate`; this file and conv.go are written by hand.
package datamodel

//go:generate go run ./gen -in datamodel.json -overlay overlay.json -out . -docs ../../docs/api

import "toolstackd/internal/schema"

// Model is the datamodel every other package reads. It is built once at
// start-up and never changed.
var Model = mustBuild()

func mustBuild() *schema.Model {
	m, err := schema.Build(SchemaMajor, SchemaMinor, classSpecs, enumSpecs, relationSpecs)
	if err != nil {
		panic("datamodel: " + err.Error())
	}
	return m
}

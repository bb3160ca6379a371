package rrd_test

import (
	"fmt"
	"math"
	"os"
	"time"

	"toolstackd/internal/rrd"
)

// A VM's RRD in rrdd's layout, fed a CPU-time counter every 5 s and read
// back through /rrd_updates.
func Example() {
	t0 := time.Unix(1_700_000_000, 0)
	cpu := rrd.DS{Name: "cpu0", Type: rrd.Derive, Min: 0, Max: 1, Heartbeat: rrd.DefaultHeartbeat}
	vm, err := rrd.New(rrd.DefaultStep, t0, []rrd.DS{cpu}, rrd.VMArchives(false))
	if err != nil {
		panic(err)
	}
	// Seconds of CPU time used so far: a quarter of a second per second.
	for i := 1; i <= 3; i++ {
		t := t0.Add(time.Duration(i) * 5 * time.Second)
		if err := vm.Update(t, []rrd.Value{rrd.FloatValue(1.25 * float64(i))}); err != nil {
			panic(err)
		}
	}
	x, err := rrd.Export([]rrd.Source{{Prefix: "vm:0b9c:", RRD: vm}}, 1_700_000_010, 0, rrd.ParseCFQuery("AVERAGE"))
	if err != nil {
		panic(err)
	}
	_ = x.WriteXML(os.Stdout)
	fmt.Println()
	v, _ := vm.Query("cpu0", t0.Add(15*time.Second))
	fmt.Println(v, math.IsNaN(v))
	// Output:
	// <?xml version="1.0" encoding="UTF-8"?>
	// <xport><meta><start>1700000015</start><step>5</step><end>1700000015</end><rows>2</rows><columns>1</columns><legend><entry>AVERAGE:vm:0b9c:cpu0</entry></legend></meta><data><row><t>1700000015</t><v>0.25</v></row><row><t>1700000010</t><v>0.25</v></row></data></xport>
	// 0.25 false
}

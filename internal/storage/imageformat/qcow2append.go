package imageformat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"
)

// Appender fills an empty, self-contained qcow2 image from data that
// arrives in guest order (an upload, a copy), writing clusters straight
// to the file instead of through qemu-nbd: one copy of the data, no
// per-request round trips. Zero clusters stay unallocated.
//
// New clusters (data, then L2 tables, then refcount blocks) are appended
// after the image's existing ones; the L1 table, which makes them
// visible, is written last, after a sync. An interrupted fill therefore
// leaves either the empty image (with leaked clusters) or the data up to
// the last L2 table committed: always a consistent image.
type Appender struct {
	f        *os.File
	h        *Qcow2Header
	size     int64
	first    int64 // first cluster this appender allocated
	next     int64 // next free host cluster
	l1       map[int64]int64
	cur      int64    // guest L2 table being filled, or -1
	l2       []uint64 // its entries
	pos      int64    // guest bytes consumed
	partial  []byte   // the start of the guest cluster at pos, if pos is inside one
	refTable []uint64
	kicked   int64 // host bytes handed to writeback so far
	origSize int64 // the file's size before the appender wrote
}

// Size is the image's virtual size: the most it takes.
func (a *Appender) Size() int64 { return a.size }

// kickWriteback starts writeback of what was appended since the last
// kick once there is enough of it, so that the disk works while data
// still arrives and the final sync finds little to do.
func (a *Appender) kickWriteback() {
	end := a.next * ClusterSize
	if end-a.kicked < 32<<20 {
		return
	}
	if a.kicked == 0 {
		a.kicked = a.first * ClusterSize
	}
	const syncFileRangeWrite = 2
	_ = syscall.SyncFileRange(int(a.f.Fd()), a.kicked, end-a.kicked, syncFileRangeWrite) // a write-behind hint; the final fsync is checked
	a.kicked = end
}

// Appendable reports whether an image can be filled by an appender:
// qcow2 v3 as toolstackd makes them (64 KiB clusters, 16-bit refcounts),
// no backing file, snapshot, encryption or feature it does not know, and
// nothing allocated yet.
func Appendable(path string) bool {
	h, err := ReadQcow2Header(path)
	if err != nil || h.Version != 3 || h.ClusterBits != qcowClusterBits || h.RefcountOrder != qcowRefcountOrder ||
		h.BackingFile != "" || h.ExternalDataFile || h.CryptMethod != 0 || h.NbSnapshots != 0 || h.IncompatibleFeatures != 0 {
		return false
	}
	if h.Size > 8<<40 || h.RefcountTableClusters < 1 || h.RefcountTableClusters > 64 {
		return false
	}
	empty, err := Qcow2IsEmpty(path)
	return err == nil && empty
}

// OpenAppender opens an image Appendable accepts for filling.
func OpenAppender(path string) (*Appender, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0) //nolint:gosec // volume paths come from the SR driver, inside its directory
	if err != nil {
		return nil, err
	}
	h, err := ReadQcow2HeaderFrom(f)
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	rt := make([]byte, int64(h.RefcountTableClusters)*ClusterSize)
	if _, err := f.ReadAt(rt, int64(h.RefcountTableOffset)); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("reading the refcount table: %w", err)
	}
	a := &Appender{f: f, h: h, size: int64(h.Size), l1: map[int64]int64{}, cur: -1, origSize: st.Size()}
	for i := 0; i < len(rt); i += 8 {
		a.refTable = append(a.refTable, binary.BigEndian.Uint64(rt[i:]))
	}
	a.next = (st.Size() + ClusterSize - 1) / ClusterSize
	a.first = a.next
	return a, nil
}

func (a *Appender) alloc(n int64) int64 {
	c := a.next
	a.next += n
	return c
}

// Write takes the guest bytes at off, which must not be before what was
// written already; a gap reads as zeroes.
func (a *Appender) Write(off int64, p []byte) error {
	const cs = ClusterSize
	if off < a.pos {
		return errors.New("qcow2 appender: writes must come in order")
	}
	if int64(len(p)) > a.size-off { // off >= a.pos >= 0: no overflow
		return TooBigError{Size: a.size}
	}
	if off > a.pos {
		// Zeroes up to off: finish the partial cluster, skip the rest.
		if a.partial != nil {
			n := min(off-a.pos, cs-int64(len(a.partial)))
			a.partial = append(a.partial, make([]byte, n)...)
			a.pos += n
			if len(a.partial) == cs {
				if err := a.clusters(a.pos-cs, a.partial); err != nil {
					return err
				}
				a.partial = nil
			}
		}
		if off > a.pos {
			a.pos = off
			if rem := off % cs; rem != 0 {
				a.partial = make([]byte, rem, cs)
			}
		}
	}
	// Complete a partial cluster.
	if a.partial != nil {
		n := min(len(p), cs-len(a.partial))
		a.partial = append(a.partial, p[:n]...)
		p, a.pos = p[n:], a.pos+int64(n)
		if len(a.partial) < cs {
			return nil
		}
		if err := a.clusters(a.pos-cs, a.partial); err != nil {
			return err
		}
		a.partial = nil
	}
	whole := len(p) / cs * cs
	if whole > 0 {
		if err := a.clusters(a.pos, p[:whole]); err != nil {
			return err
		}
		a.pos += int64(whole)
	}
	if rest := p[whole:]; len(rest) > 0 {
		a.partial = append(make([]byte, 0, cs), rest...)
		a.pos += int64(len(rest))
	}
	return nil
}

// clusters stores whole clusters at a cluster-aligned guest offset: runs
// of non-zero clusters each in one write.
func (a *Appender) clusters(off int64, p []byte) error {
	const cs = ClusterSize
	for i := 0; i < len(p); {
		if IsZero(p[i : i+cs]) {
			i += cs
			continue
		}
		j := i + cs
		for j < len(p) && !IsZero(p[j:j+cs]) && (off+int64(j))/cs/qcowL2Entries == (off+int64(i))/cs/qcowL2Entries {
			j += cs
		}
		g := (off + int64(i)) / cs
		if err := a.table(g / qcowL2Entries); err != nil {
			return err
		}
		host := a.alloc(int64(j-i) / cs)
		if _, err := a.f.WriteAt(p[i:j], host*cs); err != nil {
			return err
		}
		for k := int64(0); k < int64(j-i)/cs; k++ {
			a.l2[(g+k)%qcowL2Entries] = uint64((host+k)*cs) | qcowOflagCopied
		}
		a.kickWriteback()
		i = j
	}
	return nil
}

// table makes guest L2 table t the current one, writing out the previous.
func (a *Appender) table(t int64) error {
	if t == a.cur {
		return nil
	}
	if err := a.flushTable(); err != nil {
		return err
	}
	a.cur, a.l2 = t, make([]uint64, qcowL2Entries)
	return nil
}

func (a *Appender) flushTable() error {
	if a.cur < 0 {
		return nil
	}
	buf := make([]byte, ClusterSize)
	for i, e := range a.l2 {
		binary.BigEndian.PutUint64(buf[8*i:], e)
	}
	host := a.alloc(1)
	if _, err := a.f.WriteAt(buf, host*ClusterSize); err != nil {
		return err
	}
	a.l1[a.cur] = host * ClusterSize
	a.cur, a.l2 = -1, nil
	return nil
}

// Abort drops everything the appender wrote and closes the file. Until
// commit, the appender only writes past the image's original end, so
// cutting the file back to its old size leaves the image exactly as it
// was (empty).
func (a *Appender) Abort() error {
	err := a.f.Truncate(a.origSize)
	if err == nil {
		err = a.f.Sync()
	}
	if cerr := a.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Commit writes what is pending, the refcounts and then the L1 table,
// syncing in between, and closes the file.
func (a *Appender) Commit() (err error) {
	const cs = ClusterSize
	defer func() {
		if cerr := a.f.Close(); err == nil {
			err = cerr
		}
	}()
	if a.partial != nil {
		a.partial = append(a.partial, make([]byte, cs-len(a.partial))...)
		if err := a.clusters(a.pos/cs*cs, a.partial); err != nil {
			return err
		}
		a.partial = nil
	}
	if err := a.flushTable(); err != nil {
		return err
	}
	if a.next == a.first {
		return nil // nothing written
	}
	// Refcount blocks for every new cluster, the blocks included.
	perBlock := int64(cs / 2)
	var newBlocks []int64
	for {
		need := (a.next + perBlock - 1) / perBlock
		if need > int64(len(a.refTable)) {
			return errors.New("qcow2 appender: the refcount table is too small")
		}
		grew := false
		for b := int64(0); b < need; b++ {
			if a.refTable[b] == 0 {
				a.refTable[b] = uint64(a.alloc(1) * cs)
				newBlocks = append(newBlocks, b)
				grew = true
			}
		}
		if !grew {
			break
		}
	}
	isNew := map[int64]bool{}
	for _, b := range newBlocks {
		isNew[b] = true
	}
	buf := make([]byte, cs)
	for b := a.first / perBlock; b*perBlock < a.next; b++ {
		off := int64(a.refTable[b])
		if isNew[b] {
			clear(buf)
		} else if _, err := a.f.ReadAt(buf, off); err != nil {
			return err
		}
		for c := max(b*perBlock, a.first); c < min((b+1)*perBlock, a.next); c++ {
			binary.BigEndian.PutUint16(buf[2*(c-b*perBlock):], 1)
		}
		if _, err := a.f.WriteAt(buf, off); err != nil {
			return err
		}
	}
	for _, b := range newBlocks {
		var e [8]byte
		binary.BigEndian.PutUint64(e[:], a.refTable[b])
		if _, err := a.f.WriteAt(e[:], int64(a.h.RefcountTableOffset)+8*b); err != nil {
			return err
		}
	}
	if err := a.f.Sync(); err != nil {
		return err
	}
	// Now the data becomes visible.
	for t, off := range a.l1 {
		if t >= int64(a.h.L1Size) {
			return errors.New("qcow2 appender: L1 table too small")
		}
		var e [8]byte
		binary.BigEndian.PutUint64(e[:], uint64(off)|qcowOflagCopied)
		if _, err := a.f.WriteAt(e[:], int64(a.h.L1TableOffset)+8*t); err != nil {
			return err
		}
	}
	return a.f.Sync()
}

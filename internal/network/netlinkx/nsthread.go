package netlinkx

import (
	"errors"
	"runtime"
	"unsafe"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// nsThread is an OS thread that entered a network namespace for the
// two things that must be done from inside one: opening /dev/net/tun
// and opening a socket for ethtool ioctls. The goroutine running it
// keeps the thread locked while it is in the namespace, and returns it
// to its namespace before unlocking it.
type nsThread struct {
	reqs chan func()
	done chan struct{}
	// sock is a datagram socket made in the namespace, for ethtool.
	sock int
}

func startThread(ns netns.NsHandle) (*nsThread, error) {
	w := &nsThread{reqs: make(chan func()), done: make(chan struct{}), sock: -1}
	ready := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer close(w.done)
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ready <- err
			return
		}
		defer func() { _ = orig.Close() }()
		// Back to where the thread was, or, failing that, keep it
		// locked so that the runtime ends it instead of running other
		// goroutines in the wrong namespace. (The main thread cannot be
		// ended, only parked, hence the attempt to restore first.)
		defer func() {
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
		}()
		if err := netns.Set(ns); err != nil {
			ready <- err
			return
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			ready <- err
			return
		}
		w.sock = fd
		ready <- nil
		for f := range w.reqs {
			f()
		}
	}()
	if err := <-ready; err != nil {
		<-w.done
		return nil, err
	}
	return w, nil
}

// do runs f on the thread in the namespace.
func (w *nsThread) do(f func() error) error {
	errc := make(chan error, 1)
	w.reqs <- func() { errc <- f() }
	return <-errc
}

func (w *nsThread) stop() {
	close(w.reqs)
	<-w.done
	if w.sock >= 0 {
		_ = unix.Close(w.sock)
		w.sock = -1
	}
}

// ethtoolCmd is struct ethtool_cmd (ETHTOOL_GSET) of linux/ethtool.h.
type ethtoolCmd struct {
	Cmd           uint32
	Supported     uint32
	Advertising   uint32
	Speed         uint16
	Duplex        uint8
	Port          uint8
	PhyAddress    uint8
	Transceiver   uint8
	Autoneg       uint8
	MdioSupport   uint8
	Maxtxpkt      uint32
	Maxrxpkt      uint32
	SpeedHi       uint16
	EthTpMdix     uint8
	EthTpMdixCtrl uint8
	LpAdvertising uint32
	Reserved      [2]uint32
}

// ifreqPtr is struct ifreq with ifr_data.
type ifreqPtr struct {
	Name [unix.IFNAMSIZ]byte
	Data unsafe.Pointer
	_    [16]byte
}

const ethtoolGSET = 0x1

// ethtoolIoctl issues SIOCETHTOOL for the link name with data (a
// struct of linux/ethtool.h starting with its command) on the socket
// made in the namespace; a socket's ioctls act in the namespace it was
// made in, so this needs no thread switch.
func (w *nsThread) ethtoolIoctl(name string, data unsafe.Pointer) error {
	if w.sock < 0 {
		return errClosed
	}
	if len(name) >= unix.IFNAMSIZ {
		return unix.ENODEV
	}
	req := &ifreqPtr{Data: data}
	copy(req.Name[:], name)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(w.sock), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(req))) // #nosec G103 -- ethtool ABI
	runtime.KeepAlive(req)
	if errno != 0 {
		return errno
	}
	return nil
}

// ethtool reads a link's speed (Mbit/s, 0 when unknown) and duplex
// through the socket made in the namespace; a socket's ioctls act in the
// namespace it was made in, so this needs no thread switch.
func (w *nsThread) ethtool(name string) (int, string) {
	if w.sock < 0 || len(name) >= unix.IFNAMSIZ {
		return 0, "unknown"
	}
	cmd := &ethtoolCmd{Cmd: ethtoolGSET}
	if w.ethtoolIoctl(name, unsafe.Pointer(cmd)) != nil { // #nosec G103 -- ethtool ABI
		return 0, "unknown"
	}
	speed := int(cmd.SpeedHi)<<16 | int(cmd.Speed)
	if speed == 0xffff || speed == 0xffffffff {
		speed = 0
	}
	switch cmd.Duplex {
	case 0:
		return speed, "half"
	case 1:
		return speed, "full"
	}
	return speed, "unknown"
}

var errClosed = errors.New("netlinkx: closed")

package transport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// FaultSpec describes the faults a Faults injects. Drop, Dup, Delay, Jitter
// and Reorder apply to packets sent through the wrapped connection; DropIn to
// packets received; Cut to both (a partition). To fault both directions of a
// client-server path, wrap both sides or use Drop and DropIn together.
type FaultSpec struct {
	Drop    float64       // probability a sent packet is lost
	DropIn  float64       // probability a received packet is lost
	Dup     float64       // probability a sent packet is sent twice
	Reorder float64       // probability a sent packet is held back so later ones overtake it
	Delay   time.Duration // added to every sent packet
	Jitter  time.Duration // uniform extra delay in [0, Jitter)
	Cut     bool          // drop everything, both directions
}

// FaultStats counts what a Faults did.
type FaultStats struct {
	Sent, Dropped, Duplicated, Delayed, Reordered, Received, DroppedIn uint64
}

// Faults injects packet faults under quic-go. It is safe for concurrent use
// and can be changed at run time; random choices come from one seeded source.
// Wrapping costs quic-go its batched socket I/O, most of its throughput,
// so pass a nil *Faults unless faults are wanted.
type Faults struct {
	mu   sync.Mutex
	spec FaultSpec
	rng  *rand.Rand
	st   FaultStats
	cut  atomic.Bool // read on every packet without the lock
	// active is false while the spec is all zero, so an unfaulted wrapper
	// costs one atomic load per packet.
	active atomic.Bool
}

// NewFaults returns a Faults with no faults switched on.
func NewFaults(seed uint64) *Faults {
	return &Faults{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Set replaces the fault spec.
func (f *Faults) Set(s FaultSpec) {
	f.mu.Lock()
	f.spec = s
	f.cut.Store(s.Cut)
	f.active.Store(s != FaultSpec{})
	f.mu.Unlock()
}

// Spec returns the current spec.
func (f *Faults) Spec() FaultSpec {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.spec
}

// Cut switches the partition on or off, leaving the other faults as they are.
func (f *Faults) Cut(on bool) {
	f.mu.Lock()
	s := f.spec
	s.Cut = on
	f.mu.Unlock()
	f.Set(s)
}

// Stats returns counters since creation.
func (f *Faults) Stats() FaultStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}

func (f *Faults) String() string { return f.Spec().String() }

// String formats the spec as ParseFaultSpec reads it ("none" when empty).
func (s FaultSpec) String() string {
	var parts []string
	num := func(k string, v float64) {
		if v != 0 {
			parts = append(parts, k+"="+strconv.FormatFloat(v, 'g', -1, 64))
		}
	}
	dur := func(k string, v time.Duration) {
		if v != 0 {
			parts = append(parts, k+"="+v.String())
		}
	}
	num("drop", s.Drop)
	num("dropin", s.DropIn)
	num("dup", s.Dup)
	dur("delay", s.Delay)
	dur("jitter", s.Jitter)
	num("reorder", s.Reorder)
	if s.Cut {
		parts = append(parts, "cut")
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// ParseFaultSpec parses "drop=0.2,dropin=0.1,dup=0.2,delay=5ms,jitter=2ms,reorder=0.1,cut"
// (any subset, any order; "" or "none" is no faults).
func ParseFaultSpec(str string) (FaultSpec, error) {
	var s FaultSpec
	str = strings.TrimSpace(str)
	if str == "" || str == "none" {
		return s, nil
	}
	for _, item := range strings.Split(str, ",") {
		k, v, hasV := strings.Cut(strings.TrimSpace(item), "=")
		prob := func(dst *float64) error {
			p, err := strconv.ParseFloat(v, 64)
			if err != nil || !hasV || p < 0 || p > 1 {
				return fmt.Errorf("transport: faults: %s wants a probability in [0,1], got %q", k, v)
			}
			*dst = p
			return nil
		}
		durv := func(dst *time.Duration) error {
			d, err := time.ParseDuration(v)
			if err != nil || !hasV || d < 0 {
				return fmt.Errorf("transport: faults: %s wants a duration such as 5ms, got %q", k, v)
			}
			*dst = d
			return nil
		}
		var err error
		switch k {
		case "drop":
			err = prob(&s.Drop)
		case "dropin":
			err = prob(&s.DropIn)
		case "dup":
			err = prob(&s.Dup)
		case "reorder":
			err = prob(&s.Reorder)
		case "delay":
			err = durv(&s.Delay)
		case "jitter":
			err = durv(&s.Jitter)
		case "cut":
			if hasV {
				if s.Cut, err = strconv.ParseBool(v); err != nil {
					err = fmt.Errorf("transport: faults: cut wants true or false, got %q", v)
				}
			} else {
				s.Cut = true
			}
		default:
			err = fmt.Errorf("transport: faults: unknown fault %q (want drop, dropin, dup, delay, jitter, reorder, cut)", k)
		}
		if err != nil {
			return FaultSpec{}, err
		}
	}
	return s, nil
}

// ParseFaults makes a Faults from a spec string, for a hidden command-line
// flag; "seed=N" in the string picks the seed (default 1).
func ParseFaults(str string) (*Faults, error) {
	seed := uint64(1)
	var rest []string
	for _, item := range strings.Split(str, ",") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(item), "seed="); ok {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("transport: faults: bad seed %q", v)
			}
			seed = n
			continue
		}
		rest = append(rest, item)
	}
	s, err := ParseFaultSpec(strings.Join(rest, ","))
	if err != nil {
		return nil, err
	}
	f := NewFaults(seed)
	f.Set(s)
	return f, nil
}

// Wrap returns pc with faults injected. Only the plain net.PacketConn
// methods (and buffer sizing) are exposed, so quic-go takes its generic path
// rather than type-asserting the *net.UDPConn for batched I/O, whose writes
// would bypass the faults.
func (f *Faults) Wrap(pc net.PacketConn) net.PacketConn {
	fc := &faultConn{PacketConn: pc, f: f}
	if _, ok := pc.(syscallConner); ok {
		return &faultSysConn{fc}
	}
	return fc
}

type syscallConner interface {
	SyscallConn() (syscall.RawConn, error)
}

type faultConn struct {
	net.PacketConn
	f *Faults
}

// sendPlan is what happens to one sent packet: copies (0 = dropped) each
// after its delay.
type sendPlan struct {
	copies int
	delay  [2]time.Duration
}

func (f *Faults) planSend() sendPlan {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &f.spec
	f.st.Sent++
	if s.Cut || (s.Drop > 0 && f.rng.Float64() < s.Drop) {
		f.st.Dropped++
		return sendPlan{}
	}
	p := sendPlan{copies: 1}
	if s.Dup > 0 && f.rng.Float64() < s.Dup {
		f.st.Duplicated++
		p.copies = 2
	}
	for i := range p.copies {
		d := s.Delay
		if s.Jitter > 0 {
			d += time.Duration(f.rng.Int64N(int64(s.Jitter)))
		}
		if s.Reorder > 0 && f.rng.Float64() < s.Reorder {
			// held back long enough for the next packets to overtake it
			f.st.Reordered++
			d += max(2*s.Delay+s.Jitter, time.Millisecond)
		}
		if d > 0 {
			f.st.Delayed++
		}
		p.delay[i] = d
	}
	return p
}

func (f *Faults) dropIn() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.Received++
	if f.spec.Cut || (f.spec.DropIn > 0 && f.rng.Float64() < f.spec.DropIn) {
		f.st.DroppedIn++
		return true
	}
	return false
}

func (c *faultConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	if !c.f.active.Load() {
		return c.PacketConn.WriteTo(b, addr)
	}
	p := c.f.planSend()
	for i := range p.copies {
		if p.delay[i] == 0 {
			if _, err := c.PacketConn.WriteTo(b, addr); err != nil {
				return 0, err
			}
			continue
		}
		buf := append([]byte(nil), b...) // quic-go reuses b after we return
		time.AfterFunc(p.delay[i], func() {
			// a partition switched on meanwhile also stops packets in flight
			if !c.f.cut.Load() {
				c.PacketConn.WriteTo(buf, addr)
			}
		})
	}
	// A lost packet looks sent, as on a real network.
	return len(b), nil
}

func (c *faultConn) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		n, addr, err := c.PacketConn.ReadFrom(b)
		if err != nil || !c.f.active.Load() || !c.f.dropIn() {
			return n, addr, err
		}
	}
}

// SetReadBuffer and SetWriteBuffer let quic-go size the socket buffers.
func (c *faultConn) SetReadBuffer(n int) error {
	if s, ok := c.PacketConn.(interface{ SetReadBuffer(int) error }); ok {
		return s.SetReadBuffer(n)
	}
	return nil
}

func (c *faultConn) SetWriteBuffer(n int) error {
	if s, ok := c.PacketConn.(interface{ SetWriteBuffer(int) error }); ok {
		return s.SetWriteBuffer(n)
	}
	return nil
}

// faultSysConn is a faultConn over a socket. SyscallConn lets quic-go check
// buffer sizes and set the don't-fragment bit (needed for path MTU
// discovery); reads and writes still go through the faults.
type faultSysConn struct{ *faultConn }

func (c *faultSysConn) SyscallConn() (syscall.RawConn, error) {
	return c.PacketConn.(syscallConner).SyscallConn()
}

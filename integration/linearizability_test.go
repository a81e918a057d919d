package integration

import (
	"cmp"
	le "encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

type regInput struct {
	write bool
	value uint64
}

// registerModel is one 8-byte register per file: a read returns the last
// write's value.
var registerModel = porcupine.Model{
	Init: func() any { return uint64(0) },
	Step: func(state, input, output any) (bool, any) {
		in := input.(regInput)
		if in.write {
			return true, in.value
		}
		return output.(uint64) == state.(uint64), state
	},
	Equal: func(a, b any) bool { return a == b },
}

// TestLinearizable: several writers and readers on two mounts for a while;
// every read must be explained by some order of the completed writes
// (porcupine checks the recorded history).
func TestLinearizable(t *testing.T) { onServerAndCluster(t, testLinearizable) }

func testLinearizable(t *testing.T, a, b *mount) {
	const files = 3
	for f := 0; f < files; f++ {
		must(t, os.WriteFile(filepath.Join(a.dir, "reg"+itoa(f)), make([]byte, 8), 0o644))
	}
	var mu sync.Mutex
	histories := make([][]porcupine.Operation, files)
	start := time.Now()
	deadline := start.Add(4 * time.Second)
	var wg sync.WaitGroup
	worker := 0
	for _, m := range []*mount{a, b} {
		for role := 0; role < 3; role++ { // one writer and two readers per mount and file
			for f := 0; f < files; f++ {
				wg.Add(1)
				id := worker
				worker++
				go func(dir string, write bool, f, id int) {
					defer wg.Done()
					path := filepath.Join(dir, "reg"+itoa(f))
					flags := os.O_RDONLY
					if write {
						flags = os.O_RDWR
					}
					fh, err := os.OpenFile(path, flags, 0)
					if err != nil {
						t.Error(err)
						return
					}
					defer fh.Close()
					buf := make([]byte, 8)
					for n := uint64(1); time.Now().Before(deadline); n++ {
						op := porcupine.Operation{ClientId: id}
						call := time.Since(start).Nanoseconds()
						if write {
							v := uint64(id)<<32 | n
							le.LittleEndian.PutUint64(buf, v)
							if _, err := fh.WriteAt(buf, 0); err != nil {
								t.Error(err)
								return
							}
							op.Input = regInput{write: true, value: v}
						} else {
							if _, err := fh.ReadAt(buf, 0); err != nil {
								t.Error(err)
								return
							}
							op.Input = regInput{}
							op.Output = le.LittleEndian.Uint64(buf)
						}
						op.Call, op.Return = call, time.Since(start).Nanoseconds()
						mu.Lock()
						histories[f] = append(histories[f], op)
						mu.Unlock()
					}
				}(m.dir, role == 0, f, id)
			}
		}
	}
	wg.Wait()
	for f, h := range histories {
		if len(h) < 50 {
			t.Fatalf("file %d: only %d operations recorded", f, len(h))
		}
		res := porcupine.CheckOperationsTimeout(registerModel, h, 30*time.Second)
		if res != porcupine.Ok {
			explainStale(t, h)
			explainZones(t, h)
			t.Fatalf("file %d: history of %d operations is %v", f, len(h), res)
		}
		t.Logf("file %d: %d operations, linearizable", f, len(h))
	}
}

func explainStale(t *testing.T, h []porcupine.Operation) {
	if p := os.Getenv("LEASEFS_HISTORY"); p != "" {
		f, _ := os.Create(p)
		for _, op := range h {
			in := op.Input.(regInput)
			v := in.value
			if !in.write {
				v = op.Output.(uint64)
			}
			fmt.Fprintf(f, "%d %d %d %v %x\n", op.Call, op.Return, op.ClientId, in.write, v)
		}
		f.Close()
	}
	writes := map[uint64]porcupine.Operation{}
	var ws []porcupine.Operation
	for _, op := range h {
		if in := op.Input.(regInput); in.write {
			writes[in.value] = op
			ws = append(ws, op)
		}
	}
	n := 0
	for _, r := range h {
		if r.Input.(regInput).write {
			continue
		}
		v := r.Output.(uint64)
		wv, ok := writes[v]
		if v != 0 && !ok {
			t.Logf("read by %d returned unknown %x", r.ClientId, v)
			continue
		}
		if ok && wv.Call > r.Return {
			t.Logf("read by %d [%d,%d] returned future %x (write by %d [%d,%d])", r.ClientId, r.Call, r.Return, v, wv.ClientId, wv.Call, wv.Return)
			n++
		}
		for _, w2 := range ws {
			if w2.Input.(regInput).value == v {
				continue
			}
			if (v == 0 || wv.Return < w2.Call) && w2.Return < r.Call {
				t.Logf("stale read by %d [%d,%d] got %x (written by %d [%d,%d]) but %x by %d [%d,%d] was complete", r.ClientId, r.Call, r.Return, v, wv.ClientId, wv.Call, wv.Return, w2.Input.(regInput).value, w2.ClientId, w2.Call, w2.Return)
				n++
				break
			}
		}
		if n > 10 {
			return
		}
	}
	// Flip-flops: reads that follow one another return a, then b, then a.
	type span struct{ firstRet, lastCall, firstBy, lastBy int64 }
	spans := map[uint64]*span{}
	for _, op := range h {
		if op.Input.(regInput).write {
			continue
		}
		v := op.Output.(uint64)
		sp := spans[v]
		if sp == nil {
			sp = &span{op.Return, op.Call, int64(op.ClientId), int64(op.ClientId)}
			spans[v] = sp
		}
		if op.Return < sp.firstRet {
			sp.firstRet, sp.firstBy = op.Return, int64(op.ClientId)
		}
		if op.Call > sp.lastCall {
			sp.lastCall, sp.lastBy = op.Call, int64(op.ClientId)
		}
	}
	for _, r := range h {
		if r.Input.(regInput).write {
			continue
		}
		for v, sp := range spans {
			if v != r.Output.(uint64) && r.Call > sp.firstRet && r.Return < sp.lastCall {
				t.Logf("flip-flop: read by %d [%d,%d] got %x between reads of %x (first returned %d by %d, last called %d by %d)",
					r.ClientId, r.Call, r.Return, r.Output, v, sp.firstRet, sp.firstBy, sp.lastCall, sp.lastBy)
				n++
				break
			}
		}
		if n > 10 {
			return
		}
	}
	// Inversions: a read that follows another returns a value older than it.
	var reads []porcupine.Operation
	for _, op := range h {
		if !op.Input.(regInput).write {
			reads = append(reads, op)
		}
	}
	for i, r1 := range reads {
		w1, ok := writes[r1.Output.(uint64)]
		if !ok {
			continue
		}
		for _, r2 := range reads[i+1:] {
			w2, ok := writes[r2.Output.(uint64)]
			if !ok && r2.Output.(uint64) != 0 {
				continue
			}
			if r1.Return < r2.Call && (r2.Output.(uint64) == 0 || w2.Return < w1.Call) {
				t.Logf("inversion: read by %d [%d,%d] got %x (w by %d [%d,%d]); later read by %d [%d,%d] got older %x (w by %d [%d,%d])",
					r1.ClientId, r1.Call, r1.Return, r1.Output, w1.ClientId, w1.Call, w1.Return,
					r2.ClientId, r2.Call, r2.Return, r2.Output, w2.ClientId, w2.Call, w2.Return)
				n++
				break
			}
		}
		if n > 10 {
			return
		}
	}
}

// explainZones names what makes h illegal when no read is stale by
// itself. A value's zone runs between the earliest return and the latest
// call among its write and its reads (Gibbons and Korach): when the
// return comes first (a forward zone) the value must be the register's
// all along it, so two forward zones cannot overlap, nor a backward zone
// (a write nobody read, say) lie inside a forward one.
func explainZones(t *testing.T, h []porcupine.Operation) {
	type zone struct {
		v           uint64
		first, last porcupine.Operation // returned first, called last
	}
	initial := porcupine.Operation{ClientId: -1, Call: -1, Return: -1, Input: regInput{write: true}}
	zones := map[uint64]*zone{0: {v: 0, first: initial, last: initial}}
	for _, op := range h {
		v := op.Input.(regInput).value
		if !op.Input.(regInput).write {
			v = op.Output.(uint64)
		}
		z := zones[v]
		if z == nil {
			z = &zone{v: v, first: op, last: op}
			zones[v] = z
		}
		if op.Return < z.first.Return {
			z.first = op
		}
		if op.Call > z.last.Call {
			z.last = op
		}
	}
	what := func(op porcupine.Operation) string {
		if op.ClientId < 0 {
			return "the initial value"
		}
		kind := "read"
		if op.Input.(regInput).write {
			kind = "write"
		}
		return fmt.Sprintf("%s by %d [%d,%d]", kind, op.ClientId, op.Call, op.Return)
	}
	var fwd, bwd []*zone
	for _, z := range zones {
		if z.first.Return < z.last.Call {
			fwd = append(fwd, z)
		} else {
			bwd = append(bwd, z)
		}
	}
	slices.SortFunc(fwd, func(a, b *zone) int { return cmp.Compare(a.first.Return, b.first.Return) })
	n := 0
	slices.SortFunc(bwd, func(a, b *zone) int { return cmp.Compare(a.last.Call, b.last.Call) })
	report := func(kind string, a, b *zone) {
		t.Logf("%s: %x must hold from %d (%s) to %d (%s), but %x's zone is [%d,%d] (%s; %s)",
			kind, a.v, a.first.Return, what(a.first), a.last.Call, what(a.last),
			b.v, min(b.first.Return, b.last.Call), max(b.first.Return, b.last.Call), what(b.first), what(b.last))
		n++
	}
	for i, a := range fwd {
		for _, b := range fwd[i+1:] {
			if b.first.Return >= a.last.Call || n > 5 {
				break
			}
			report("overlapping zones", a, b)
		}
	}
	for _, b := range bwd {
		for _, a := range fwd {
			if n > 10 {
				return
			}
			if a.first.Return < b.last.Call && b.first.Return < a.last.Call {
				report("a write inside another value's zone", a, b)
				break
			}
		}
	}
}

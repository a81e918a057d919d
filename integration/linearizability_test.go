package integration

import (
	le "encoding/binary"
	"os"
	"path/filepath"
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
func TestLinearizable(t *testing.T) {
	a, b := twoMounts(t)
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
			t.Fatalf("file %d: history of %d operations is %v", f, len(h), res)
		}
		t.Logf("file %d: %d operations, linearizable", f, len(h))
	}
}

package main

import "testing"

// TestCPUPolicy: the server takes all its CPUs at once when data moves in
// bulk or one CPU is nearly busy, and goes back to one only after
// cpuQuietTicks ticks with neither.
func TestCPUPolicy(t *testing.T) {
	p := &cpuPolicy{max: 4, cur: 4}
	steps := []struct {
		bytes int64
		cpu   float64
		want  int
	}{
		{0, 0.1, 4}, {0, 0.1, 4}, {0, 0.1, 4}, {0, 0.1, 4}, {0, 0.1, 1}, // quiet: one CPU
		{0, 0.5, 1},                                                                    // light load stays on one
		{cpuBulkBytes + 1, 0.2, 4},                                                     // bulk data: all
		{0, 0.1, 4}, {0, 0.1, 4}, {0, 0.1, 4}, {0, 0.1, 4}, {cpuBulkBytes + 1, 0.1, 4}, // bulk again: quiet restarts
		{0, 0.1, 4}, {0, 0.1, 4}, {0, 0.1, 4}, {0, 0.1, 4}, {0, 0.1, 1},
		{0, 0.95, 4}, // one CPU nearly busy: all
		{0, 1.2, 4},  // busy on all stays
	}
	for i, st := range steps {
		if got := p.next(st.bytes, st.cpu); got != st.want {
			t.Fatalf("step %d (%d bytes, cpu %.2f): %d CPUs, want %d", i, st.bytes, st.cpu, got, st.want)
		}
	}
}

package telemetry

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
)

// BenchmarkStoreWrite measures the writer alone: batches of 1024 rows, half
// calls and half attempts, in one transaction each (ns/op is per row):
//
//	go test -run '^$' -bench StoreWrite -benchmem ./telemetry/
func BenchmarkStoreWrite(b *testing.B) {
	st, err := openSQLite(context.Background(), filepath.Join(b.TempDir(), "t.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.close()
	batch := make([]record, 0, batchSize)
	n := 0
	flush := func() {
		if err := st.write(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
		batch = batch[:0]
	}
	for b.Loop() {
		n++
		id := "c-0123456789ab-" + strconv.Itoa(n/2)
		if n%2 == 0 {
			batch = append(batch, record{kind: kindCall, callID: id, scope: "chat", started: int64(n), ended: int64(n) + 1000,
				result: "done", attempts: 1, productive: 1000, tokens: 100})
		} else {
			batch = append(batch, record{kind: kindAttempt, callID: id, number: 1, scope: "chat", source: "primary",
				permit: "p-0123456789ab-" + strconv.Itoa(n), settled: int64(n), latency: 1000, outcome: "success", httpStatus: 200,
				tokens: 100, actual: -1, effect: "applied", state: "closed", next: "done", backoff: -1})
		}
		if len(batch) == batchSize {
			flush()
		}
	}
	flush()
}

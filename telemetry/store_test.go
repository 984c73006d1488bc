package telemetry

import (
	"path/filepath"
	"strconv"
	"testing"
)

// testBatch is calls calls and as many attempts, interleaved, with ids from first.
func testBatch(first, calls int) []record {
	var b []record
	for i := first; i < first+calls; i++ {
		id := "c-" + strconv.Itoa(i)
		b = append(b,
			record{kind: kindCall, callID: id, scope: "chat", result: "done", failure: "", attempts: 1, actual: -1, backoff: -1},
			record{kind: kindAttempt, callID: id, number: 1, scope: "chat", source: "primary", permit: "p-" + strconv.Itoa(i),
				outcome: "success", httpStatus: 200, actual: -1, effect: "applied", state: "closed", next: "done", backoff: -1})
	}
	return b
}

// TestStoreWrite writes batches around rowsPerInsert (whole statements, the
// rest row by row), writes one again (rows already there are ignored), and
// makes the second table's insert fail (nothing of the batch is written).
func TestStoreWrite(t *testing.T) {
	st, err := openSQLite(ctx(t), filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	count := func() (calls, attempts int) {
		t.Helper()
		if err := st.db.QueryRowContext(ctx(t), "SELECT (SELECT count(*) FROM calls), (SELECT count(*) FROM attempts)").Scan(&calls, &attempts); err != nil {
			t.Fatal(err)
		}
		return calls, attempts
	}
	total, next := 0, 0
	for _, n := range []int{0, 1, rowsPerInsert - 1, rowsPerInsert, rowsPerInsert + 1, 2*rowsPerInsert + 5} {
		if err := st.write(ctx(t), testBatch(next, n)); err != nil {
			t.Fatalf("batch of %d calls: %v", n, err)
		}
		total, next = total+n, next+n
		if c, a := count(); c != total || a != total {
			t.Fatalf("after a batch of %d calls: %d calls and %d attempts, want %d of each", n, c, a, total)
		}
	}
	if err := st.write(ctx(t), testBatch(0, rowsPerInsert+1)); err != nil {
		t.Fatalf("writing rows again: %v", err)
	}
	if c, a := count(); c != total || a != total {
		t.Fatalf("rows written twice: %d calls and %d attempts, want %d of each", c, a, total)
	}
	if _, err := st.db.ExecContext(ctx(t), `CREATE TRIGGER refuse BEFORE INSERT ON attempts BEGIN SELECT RAISE(ABORT, 'refused'); END`); err != nil {
		t.Fatal(err)
	}
	if err := st.write(ctx(t), testBatch(next, 3)); err == nil {
		t.Fatal("a refused insert was not reported")
	}
	if c, a := count(); c != total || a != total {
		t.Fatalf("a failed batch left %d calls and %d attempts, want %d of each", c, a, total)
	}
}

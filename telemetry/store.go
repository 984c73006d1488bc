package telemetry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	_ "modernc.org/sqlite" // the pure-Go "sqlite" driver
)

// schemaVersion is stored in PRAGMA user_version.
const schemaVersion = 1

// Schema is the database's layout. Times are Unix nanoseconds and durations
// nanoseconds, so that for every call that ended with a decision
// ended_ns − started_ns = productive_ns + waiting_ns holds exactly, and
// productive_ns is the sum of latency_ns over its attempts that were not
// rate limited. The views give the same in seconds.
const Schema = `
CREATE TABLE IF NOT EXISTS calls (
	call_id          TEXT PRIMARY KEY,
	scope            TEXT NOT NULL,
	started_ns       INTEGER NOT NULL, -- the call's first Pick (Unix ns)
	ended_ns         INTEGER NOT NULL, -- its last decision, or when it was abandoned
	result           TEXT NOT NULL,    -- done | failure | expired | interrupted (a cancelled call: failure, cancelled)
	failure_reason   TEXT,             -- result = failure: circuit_open, quota_exhausted, stalled, retry_exhausted, non_retryable, deadline_exceeded, cancelled
	attempts         INTEGER NOT NULL, -- attempts granted
	charged_attempts INTEGER NOT NULL, -- attempts charged to max_attempts (429s are not)
	productive_ns    INTEGER NOT NULL, -- attempts from grant to outcome, 429s excluded
	waiting_ns       INTEGER NOT NULL, -- the rest: waits, backoffs, 429 attempts
	estimated_tokens INTEGER NOT NULL  -- the estimate charged to TPM per attempt
);
CREATE INDEX IF NOT EXISTS calls_ended ON calls (ended_ns);

CREATE TABLE IF NOT EXISTS attempts (
	call_id             TEXT NOT NULL,
	attempt             INTEGER NOT NULL, -- from 1, in the call
	scope               TEXT NOT NULL,
	source              TEXT NOT NULL,
	permit_id           TEXT NOT NULL,
	probe               INTEGER NOT NULL, -- 1: the breaker's HALF_OPEN probe
	epoch               INTEGER NOT NULL, -- the breaker epoch that fenced the outcome
	settled_ns          INTEGER NOT NULL, -- when the outcome was recorded (Unix ns)
	latency_ns          INTEGER NOT NULL, -- from grant to outcome
	outcome             TEXT NOT NULL,    -- success | transient | rate_limited | source_dead | client_error | cancelled
	http_status         INTEGER,          -- NULL: none reported
	estimated_tokens    INTEGER NOT NULL,
	actual_tokens       INTEGER,          -- NULL: not reported
	retry_after_hint_ns INTEGER NOT NULL, -- the upstream's Retry-After, 0: none
	breaker_effect      TEXT NOT NULL,    -- applied | no_verdict | stale | ignored
	breaker_state       TEXT NOT NULL,    -- after the outcome: closed | open | half_open
	next_action         TEXT NOT NULL,    -- done | retry | failure
	backoff_ns          INTEGER,          -- next_action = retry: the backoff
	failure_reason      TEXT,             -- next_action = failure: why
	detail              TEXT,
	PRIMARY KEY (call_id, attempt)
);
CREATE INDEX IF NOT EXISTS attempts_settled ON attempts (settled_ns);

CREATE VIEW IF NOT EXISTS call_summary AS
SELECT call_id, scope, result, failure_reason, attempts, charged_attempts,
       strftime('%Y-%m-%dT%H:%M:%fZ', started_ns / 1e9, 'unixepoch') AS started,
       (ended_ns - started_ns) / 1e9 AS wall_s,
       productive_ns / 1e9 AS productive_s,
       waiting_ns / 1e9 AS waiting_s
FROM calls;
`

// Columns of the two tables, in the order write binds them.
var (
	callColumns = []string{"call_id", "scope", "started_ns", "ended_ns", "result", "failure_reason", "attempts",
		"charged_attempts", "productive_ns", "waiting_ns", "estimated_tokens"}
	attemptColumns = []string{"call_id", "attempt", "scope", "source", "permit_id", "probe", "epoch", "settled_ns",
		"latency_ns", "outcome", "http_status", "estimated_tokens", "actual_tokens", "retry_after_hint_ns", "breaker_effect",
		"breaker_state", "next_action", "backoff_ns", "failure_reason", "detail"}
)

// rowsPerInsert is how many rows one INSERT statement writes when a batch
// has that many of a table; statements cost more than rows.
const rowsPerInsert = 32

// insert is an INSERT of n rows into table, ignoring rows already there.
func insert(table string, columns []string, n int) string {
	row := "(" + strings.TrimSuffix(strings.Repeat("?,", len(columns)), ",") + ")"
	return "INSERT INTO " + table + " (" + strings.Join(columns, ", ") + ") VALUES " +
		strings.TrimSuffix(strings.Repeat(row+",", n), ",") + " ON CONFLICT DO NOTHING"
}

// store is where batches go; the SQLite store in production, a failing one
// in tests.
type store interface {
	write(ctx context.Context, batch []record) error
	// prune deletes rows that ended before cutoff (Unix ns) and returns how many.
	prune(ctx context.Context, cutoff int64) (int64, error)
	close() error
}

// sqliteStore writes to one SQLite database, the writer on a connection of
// its own.
type sqliteStore struct {
	db             *sql.DB
	conn           *sql.Conn // the writer's
	args           []any     // reused by write
	pruneChunkRows int
}

// openSQLite opens (creating if needed) the database at path, in WAL mode
// so that readers never block the writer.
func openSQLite(ctx context.Context, path string, pragmas ...string) (*sqliteStore, error) {
	if strings.ContainsRune(path, '?') {
		return nil, fmt.Errorf("telemetry database path %q: must not contain '?'", path)
	}
	dsn := path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	for _, p := range pragmas {
		dsn += "&_pragma=" + p
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(2) // the writer's, and one for pruning and tests
	s := &sqliteStore{db: db, pruneChunkRows: 5000, args: make([]any, 0, rowsPerInsert*len(attemptColumns))}
	if err := s.init(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("telemetry database %s: %w", path, err)
	}
	return s, nil
}

func (s *sqliteStore) init(ctx context.Context) error {
	var version int
	if err := s.db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return err
	}
	if version > schemaVersion {
		return fmt.Errorf("schema version %d is newer than this sidecar's %d", version, schemaVersion)
	}
	if _, err := s.db.ExecContext(ctx, Schema); err != nil {
		return err
	}
	if _, err := s.db.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", schemaVersion)); err != nil {
		return err
	}
	var err error
	s.conn, err = s.db.Conn(ctx)
	return err
}

// nullable maps "no value" to NULL.
func nullable[T comparable](v, none T) any {
	if v == none {
		return nil
	}
	return v
}

// tables are where records go, in the order write writes them.
var tables = []struct {
	kind    kind
	name    string
	columns []string
}{{kindCall, "calls", callColumns}, {kindAttempt, "attempts", attemptColumns}}

// write inserts a batch in one transaction: all of it or none of it. Each
// table's rows go rowsPerInsert to a statement, the rest one by one, through
// statements prepared once per transaction.
//
// The transaction ends with ctx; its statements run on the background
// context because the driver watches a cancellable one with a goroutine per
// statement (busy_timeout bounds every wait, and ctx is checked between
// tables).
func (s *sqliteStore) write(ctx context.Context, batch []record) (err error) {
	tx, err := s.conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, tx.Rollback())
		}
	}()
	for _, t := range tables {
		if err := s.writeTable(tx, t.kind, t.name, t.columns, batch); err != nil {
			return fmt.Errorf("writing %s: %w", t.name, err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// writeTable inserts the batch's records of kind k into table. Statements
// prepared in tx are closed with it.
func (s *sqliteStore) writeTable(tx *sql.Tx, k kind, table string, columns []string, batch []record) error {
	bg := context.Background() // see write
	var many, one *sql.Stmt
	exec := func(st **sql.Stmt, rows int, args []any) error {
		if *st == nil {
			var err error
			if *st, err = tx.PrepareContext(bg, insert(table, columns, rows)); err != nil {
				return err
			}
		}
		_, err := (*st).ExecContext(bg, args...)
		return err
	}
	args, n := s.args[:0], 0
	defer func() { clear(args[:cap(args)]) }() // let go of the strings
	for i := range batch {
		if batch[i].kind != k {
			continue
		}
		args = batch[i].bind(args)
		if n++; n == rowsPerInsert {
			if err := exec(&many, rowsPerInsert, args); err != nil {
				return err
			}
			args, n = args[:0], 0
		}
	}
	for width, rest := len(columns), args; len(rest) > 0; rest = rest[width:] {
		if err := exec(&one, 1, rest[:width]); err != nil {
			return err
		}
	}
	return nil
}

// bind appends the record's values, in the order of its table's columns.
func (r *record) bind(args []any) []any {
	switch r.kind {
	case kindCall:
		return append(args, r.callID, r.scope, r.started, r.ended, r.result, nullable(r.failure, ""),
			int64(r.attempts), int64(r.charged), r.productive, r.waiting, r.tokens)
	case kindAttempt:
		return append(args, r.callID, int64(r.number), r.scope, r.source, r.permit, r.probe, int64(r.epoch),
			r.settled, r.latency, r.outcome, nullable(int64(r.httpStatus), 0), r.tokens, nullable(r.actual, -1),
			r.retryAfter, r.effect, r.state, r.next, nullable(r.backoff, -1), nullable(r.failure, ""),
			nullable(r.detail, ""))
	}
	return args
}

// prune deletes, in chunks so that no transaction grows large, the attempts
// settled and the calls ended before cutoff.
func (s *sqliteStore) prune(ctx context.Context, cutoff int64) (int64, error) {
	var total int64
	for _, q := range []string{
		`DELETE FROM attempts WHERE rowid IN (SELECT rowid FROM attempts WHERE settled_ns < ? LIMIT ?)`,
		`DELETE FROM calls WHERE rowid IN (SELECT rowid FROM calls WHERE ended_ns < ? LIMIT ?)`,
	} {
		for {
			res, err := s.db.ExecContext(ctx, q, cutoff, s.pruneChunkRows)
			if err != nil {
				return total, err
			}
			n, err := res.RowsAffected()
			if err != nil {
				return total, err
			}
			total += n
			if n < int64(s.pruneChunkRows) {
				break
			}
		}
	}
	return total, nil
}

func (s *sqliteStore) close() error {
	return errors.Join(s.conn.Close(), s.db.Close())
}

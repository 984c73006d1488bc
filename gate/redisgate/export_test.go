package redisgate

// SourceKey is the key of a source's state hash (suffix "") or of its
// minute's log or data ("log", "data"), for tests that look at what is
// stored.
func (b *Backend) SourceKey(scope, source, suffix string) string {
	keys := appendSourceKeys(nil, b.tag(scope), source)
	for i, n := range sourceKeys.names {
		if n == suffix || (suffix == "" && n == "state") {
			return keys[i]
		}
	}
	panic("no source key " + suffix)
}

// StateField is the state hash's field of the breaker record.
const StateField = "b"

// DecodeBreaker reads the breaker record stored in StateField by name:
// int64 numbers and strings.
func DecodeBreaker(s string) (map[string]any, error) { return stateRecord.decode(s) }

var _ = func() bool {
	if stateRecord.field != StateField {
		panic("StateField is not the breaker record's field")
	}
	return true
}()

// Package redistest starts real redis-server processes (a standalone server or
// a three-master cluster) in temporary directories for tests, and stops them
// when the test ends.
package redistest

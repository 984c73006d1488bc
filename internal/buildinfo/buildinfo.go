// Package buildinfo names the running binary: the version and revision a
// release build stamps with -ldflags, else what the go command recorded.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// version and revision are stamped by `make build` and `make release` (and
// the Dockerfile, through them):
//
//	-ldflags "-X github.com/polygate/polygate/internal/buildinfo.version=v1.2.3 -X github.com/polygate/polygate/internal/buildinfo.revision=COMMIT"
//
// Stamping does not depend on -buildvcs, which GOFLAGS=-buildvcs=false and
// a build outside a git work tree (a Docker context without .git) turn off.
// Left empty, they come from runtime/debug.ReadBuildInfo: the main module's
// version ("(devel)" for a build from a checkout) and the vcs.revision the
// go command stamps when it builds inside a git work tree (with "-dirty"
// when vcs.modified says the tree had changes).
var version, revision string

// Build names a binary: its version, VCS revision and Go version.
type Build struct {
	Version, Revision, GoVersion string
}

// Read returns what the build recorded, with the -ldflags stamps over it.
func Read() Build {
	info, _ := debug.ReadBuildInfo()
	return read(info, version, revision)
}

func read(info *debug.BuildInfo, version, revision string) Build {
	b := Build{Version: "(devel)", Revision: "unknown", GoVersion: runtime.Version()}
	if info != nil {
		if v := info.Main.Version; v != "" {
			b.Version = v
		}
		var dirty bool
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Revision = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if dirty && b.Revision != "unknown" {
			b.Revision += "-dirty"
		}
	}
	if version != "" {
		b.Version = version
	}
	if revision != "" {
		b.Revision = revision
	}
	return b
}

// Line is what --version prints: "NAME VERSION revision REVISION GOVERSION".
func (b Build) Line(name string) string {
	return name + " " + b.Version + " revision " + b.Revision + " " + b.GoVersion
}

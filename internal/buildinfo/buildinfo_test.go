package buildinfo

import (
	"runtime/debug"
	"testing"
)

// TestStampsOverWhatTheBuildRecorded: the -ldflags stamps win over the
// module version and vcs settings; without them the vcs settings name the
// revision (dirty when modified), and without those it is unknown.
func TestStampsOverWhatTheBuildRecorded(t *testing.T) {
	vcs := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"},
	}}
	for _, tc := range []struct {
		name              string
		info              *debug.BuildInfo
		version, revision string
		want              string
	}{
		{"stamped", vcs, "v1.2.3", "0123abcd", "polygate v1.2.3 revision 0123abcd"},
		{"vcs only", vcs, "", "", "polygate (devel) revision abc123-dirty"},
		{"nothing recorded (-buildvcs=false)", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "", "", "polygate (devel) revision unknown"},
		{"no build info", nil, "v2.0.0", "", "polygate v2.0.0 revision unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := read(tc.info, tc.version, tc.revision)
			if got := b.Line("polygate"); got != tc.want+" "+b.GoVersion {
				t.Errorf("%q, want %q", got, tc.want+" "+b.GoVersion)
			}
		})
	}
}

// Command frag reads a heap dump that scripts/heldprobe wrote
// (HELD_PROBE_DUMP=1: debug.WriteHeapDump after two GCs, the sidecar run
// with GODEBUG=memprofilerate=1) and prints, for the size classes with the
// most free slots, the spans in use, the live bytes, the free slots and the
// allocation sites of the live objects there: which objects keep spans
// partly empty.
//
//	go run ./scripts/heldprobe/frag /tmp/probe.<pid>.dump
//
// A span is taken as the span-sized run of memory its object's address falls
// in: exact for the classes of one-page spans (every class up to 1 280 B), an
// approximation above.
package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

type reader struct {
	r   *bufio.Reader
	err error
}

func (d *reader) uint() uint64 {
	v, err := binary.ReadUvarint(d.r)
	if err != nil && d.err == nil {
		d.err = err
	}
	return v
}

func (d *reader) bytes(keep bool) []byte {
	n := d.uint()
	if !keep {
		if _, err := d.r.Discard(int(n)); err != nil && d.err == nil {
			d.err = err
		}
		return nil
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(d.r, b); err != nil && d.err == nil {
		d.err = err
	}
	return b
}

func (d *reader) str() string { return string(d.bytes(true)) }

func (d *reader) fields() {
	for {
		k := d.uint()
		if k == 0 || d.err != nil {
			return
		}
		d.uint()
	}
}

type class struct {
	size, spanBytes uint64
}

// classes reads the size classes from the Go tree's table.
func classes() []class {
	root := os.Getenv("GOROOT")
	if root == "" {
		out, err := exec.Command("go", "env", "GOROOT").Output()
		if err != nil {
			fail(fmt.Errorf("go env GOROOT: %w", err))
		}
		root = strings.TrimSpace(string(out))
	}
	src, err := os.ReadFile(filepath.Join(root, "src", "internal", "runtime", "gc", "sizeclasses.go"))
	if err != nil {
		fail(err)
	}
	re := regexp.MustCompile(`(?m)^//\s+(\d+)\s+(\d+)\s+(\d+)\s+`)
	var out []class
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		size, _ := strconv.ParseUint(m[2], 10, 64)
		span, _ := strconv.ParseUint(m[3], 10, 64)
		out = append(out, class{size, span})
	}
	return out
}

func main() {
	if len(os.Args) != 2 {
		fail(fmt.Errorf("usage: frag DUMP"))
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fail(err)
	}
	defer f.Close()
	d := &reader{r: bufio.NewReaderSize(f, 1<<20)}
	hdr := make([]byte, len("go1.7 heap dump\n"))
	if _, err := io.ReadFull(d.r, hdr); err != nil || string(hdr) != "go1.7 heap dump\n" {
		fail(fmt.Errorf("%s: not a heap dump", os.Args[1]))
	}
	type obj struct{ addr, size uint64 }
	var objs []obj
	buckets := map[uint64]string{}
	sample := map[uint64]uint64{} // addr -> bucket
	for d.err == nil {
		tag := d.uint()
		switch tag {
		case 0:
			goto done
		case 1:
			a := d.uint()
			n := d.uint()
			if _, err := d.r.Discard(int(n)); err != nil && d.err == nil {
				d.err = err
			}
			d.fields()
			objs = append(objs, obj{a, n})
		case 2:
			d.bytes(false)
			d.uint()
		case 3:
			d.uint()
			d.uint()
			d.bytes(false)
			d.uint()
		case 4:
			for range 5 {
				d.uint()
			}
			d.uint()
			d.uint()
			d.uint()
			d.bytes(false)
			for range 4 {
				d.uint()
			}
		case 5:
			d.uint()
			d.uint()
			d.uint()
			d.bytes(false)
			d.uint()
			d.uint()
			d.uint()
			d.bytes(false)
			d.fields()
		case 6:
			d.uint()
			d.uint()
			d.uint()
			d.uint()
			d.bytes(false)
			d.bytes(false)
			d.uint()
		case 7, 11:
			for range 5 {
				d.uint()
			}
		case 8:
			d.uint()
			d.uint()
		case 9:
			for range 3 {
				d.uint()
			}
		case 10:
			for range 281 {
				d.uint()
			}
		case 12, 13:
			d.uint()
			d.bytes(false)
			d.fields()
		case 14:
			for range 7 {
				d.uint()
			}
		case 15:
			for range 6 {
				d.uint()
			}
		case 16:
			id := d.uint()
			d.uint()
			nstk := d.uint()
			var site []string
			for range nstk {
				fn := d.str()
				d.bytes(false)
				d.uint()
				site = append(site, fn)
			}
			d.uint()
			d.uint()
			buckets[id] = owner(site)
		case 17:
			a := d.uint()
			b := d.uint()
			sample[a] = b
		default:
			fail(fmt.Errorf("record of unknown tag %d", tag))
		}
	}
done:
	if d.err != nil {
		fmt.Fprintln(os.Stderr, "read:", d.err)
	}
	cls := classes()
	bySize := map[uint64]class{}
	for _, c := range cls {
		bySize[c.size] = c
	}
	type stat struct {
		spans       map[uint64]bool
		live, count uint64
		owners      map[string]uint64
	}
	stats := map[uint64]*stat{}
	for _, o := range objs {
		c, ok := bySize[o.size]
		if !ok || o.size > 32768 {
			continue
		}
		st := stats[c.size]
		if st == nil {
			st = &stat{spans: map[uint64]bool{}, owners: map[string]uint64{}}
			stats[c.size] = st
		}
		// spans of more than a page: objects are at base + k*size from a
		// page-aligned base; approximate the span as the run of
		// spanBytes that starts at the object's page rounded down to the
		// span size (exact for one-page spans).
		st.spans[o.addr/c.spanBytes] = true
		st.live += o.size
		st.count++
		who := "?"
		if b, ok := sample[o.addr]; ok {
			who = buckets[b]
		}
		st.owners[who] += o.size
	}
	type row struct {
		size, spans, inuse, live, count uint64
		owners                          map[string]uint64
	}
	var rows []row
	var tIn, tLive uint64
	for size, st := range stats {
		c := bySize[size]
		in := uint64(len(st.spans)) * c.spanBytes
		rows = append(rows, row{size, uint64(len(st.spans)), in, st.live, st.count, st.owners})
		tIn += in
		tLive += st.live
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].inuse-rows[i].live > rows[j].inuse-rows[j].live })
	fmt.Printf("small objects: %d B in use in spans, %d live, %d free slots\n", tIn, tLive, tIn-tLive)
	fmt.Printf("%6s %7s %10s %10s %10s %6s  top owners by live bytes\n", "class", "spans", "inuse", "live", "free", "fill")
	for i, r := range rows {
		if i == 25 {
			break
		}
		type ow struct {
			who string
			b   uint64
		}
		var ows []ow
		for k, v := range r.owners {
			ows = append(ows, ow{k, v})
		}
		sort.Slice(ows, func(i, j int) bool { return ows[i].b > ows[j].b })
		var parts []string
		for j, o := range ows {
			if j == 4 {
				break
			}
			parts = append(parts, fmt.Sprintf("%s %d%%", o.who, 100*o.b/r.live))
		}
		fmt.Printf("%6d %7d %10d %10d %10d %5.0f%%  %s\n", r.size, r.spans, r.inuse, r.live, r.inuse-r.live, 100*float64(r.live)/float64(r.inuse), strings.Join(parts, "; "))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "frag:", err)
	os.Exit(1)
}

// owner names an allocation site by its first frame outside the runtime
// and the standard library's allocation helpers.
func owner(stk []string) string {
	for _, fn := range stk {
		if strings.HasPrefix(fn, "runtime.") || strings.HasPrefix(fn, "internal/") || fn == "" {
			continue
		}
		if i := strings.LastIndex(fn, "/"); i >= 0 {
			fn = fn[i+1:]
		}
		return fn
	}
	if len(stk) > 0 {
		return stk[0]
	}
	return "?"
}

package bench

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// redisStats is what one INFO commandstats+cpu reply says: the commands run
// so far and the CPU the server has used.
type redisStats struct {
	cmds map[string]cmdStat // by command name, lower case ("evalsha")
	cpu  time.Duration      // used_cpu_user + used_cpu_sys
	// reads and writes are total_reads_processed and
	// total_writes_processed (the stats section): the reads of client
	// connections the server's event loop did, and its replies written;
	// -1 when the reply had no such line.
	reads, writes int64
}

// cmdStat is one cmdstat_<name> line: calls and microseconds spent.
type cmdStat struct {
	calls int64
	usec  int64
}

// parseInfo reads the commandstats and cpu sections of an INFO reply:
//
//	cmdstat_evalsha:calls=10,usec=370,usec_per_call=37.00,rejected_calls=0,failed_calls=0
//	used_cpu_sys:1.234567
//	used_cpu_user:2.345678
//
// and, when asked for, the stats section's total_reads_processed and
// total_writes_processed.
func parseInfo(s string) (redisStats, error) {
	st := redisStats{cmds: map[string]cmdStat{}, reads: -1, writes: -1}
	var sawCPU int
	for line := range strings.Lines(s) {
		line = strings.TrimSpace(line)
		key, val, ok := strings.Cut(line, ":")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		if name, ok := strings.CutPrefix(key, "cmdstat_"); ok {
			var c cmdStat
			for kv := range strings.SplitSeq(val, ",") {
				k, v, _ := strings.Cut(kv, "=")
				var err error
				switch k {
				case "calls":
					c.calls, err = strconv.ParseInt(v, 10, 64)
				case "usec":
					c.usec, err = strconv.ParseInt(v, 10, 64)
				}
				if err != nil {
					return st, fmt.Errorf("redis INFO: %s %s=%q is not a count", key, k, v)
				}
			}
			st.cmds[name] = c
			continue
		}
		if key == "total_reads_processed" || key == "total_writes_processed" {
			n, err := strconv.ParseInt(val, 10, 64)
			if err != nil || n < 0 {
				return st, fmt.Errorf("redis INFO: %s=%q is not a count", key, val)
			}
			if key == "total_reads_processed" {
				st.reads = n
			} else {
				st.writes = n
			}
			continue
		}
		if key == "used_cpu_sys" || key == "used_cpu_user" {
			sec, err := strconv.ParseFloat(val, 64)
			if err != nil || sec < 0 {
				return st, fmt.Errorf("redis INFO: %s=%q is not seconds", key, val)
			}
			st.cpu += time.Duration(sec * float64(time.Second))
			sawCPU++
		}
	}
	if sawCPU != 2 {
		return st, fmt.Errorf("redis INFO: no used_cpu_sys and used_cpu_user lines (ask for the cpu section)")
	}
	return st, nil
}

// scriptCommands are the commands a backend decision runs as: scripts
// (EVALSHA, EVAL) or functions (FCALL).
var scriptCommands = []string{"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"}

// sub returns the work done between before and s: CPU, every command's
// calls and usec, except INFO itself (the bench's own reading).
func (s redisStats) sub(before redisStats) redisDelta {
	d := redisDelta{cpu: s.cpu - before.cpu, byName: map[string]int64{}, reads: -1, writes: -1}
	if s.reads >= 0 && before.reads >= 0 && s.writes >= 0 && before.writes >= 0 {
		d.reads, d.writes = s.reads-before.reads, s.writes-before.writes
	}
	for name, c := range s.cmds {
		if name == "info" {
			continue
		}
		b := before.cmds[name]
		calls, usec := c.calls-b.calls, c.usec-b.usec
		if calls != 0 {
			d.byName[name] = calls
		}
		d.calls += calls
		d.usec += usec
		for _, sc := range scriptCommands {
			if name == sc {
				d.scriptCalls += calls
				d.scriptUsec += usec
			}
		}
	}
	return d
}

// redisDelta is Redis's work over one cell.
type redisDelta struct {
	cpu                     time.Duration
	calls, usec             int64 // every command but INFO
	scriptCalls, scriptUsec int64
	byName                  map[string]int64 // calls of each command run (INFO aside)
	reads, writes           int64            // connection reads and replies written, INFO's own included (-1: not read)
}

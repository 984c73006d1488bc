#!/bin/sh
# profile.sh DIR: the library's Lua per function, in callgrind instructions
# of a standalone Lua 5.1 replaying a recording (docs/performance.md):
#   DIR/lib.lua, DIR/calls.bin   from luaprof_test.go (POLYGATE_LUAPROF=DIR)
#   DIR/struct.so                Redis's deps/lua/src/lua_struct.c, built as
#                                a Lua module (it is not in this repository)
# Needs lua5.1, liblua5.1-0-dev, lua-cjson, valgrind. Prints per function
# (by the line it is defined at): calls, instructions exclusive (while it
# is the innermost Lua frame, with the C functions it calls), per call.
# One valgrind run per function: minutes.
set -e
dir=$1
here=$(cd "$(dirname "$0")" && pwd)
gcc -O2 -shared -fPIC -I/usr/include/lua5.1 -o "$dir/lprof.so" "$here/lprof.c"
export LUA_CPATH="$dir/?.so;;"
run() { # line [incl] -> "calls instructions" with the hook's cost taken out
  valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file="$dir/cg.out" \
    lua5.1 "$here/driver.lua" "$dir/lib.lua" "$dir/calls.bin" "$@" 2>/dev/null | awk '/^PROF/ {print $2, $3}' > "$dir/prof.txt"
  tot=$(awk '/^totals:/ {print $2}' "$dir/cg.out")
  awk -v tot="$tot" -v hc="$hc" '{printf "%d %.0f\n", $1, tot - $2 * hc}' "$dir/prof.txt"
}
# the hook's own cost per event (95.5 on Debian's lua5.1 5.1.5-9)
valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file="$dir/cg.out" \
  lua5.1 "$here/driver.lua" "$dir/lib.lua" "$dir/calls.bin" 0 x cal >/dev/null 2>&1
bare=$(awk '/^totals:/ {print $2}' "$dir/cg.out")
valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file="$dir/cg.out" \
  lua5.1 "$here/driver.lua" "$dir/lib.lua" "$dir/calls.bin" 1 incl cal 2>/dev/null | awk '/^PROF/ {print $3}' > "$dir/prof.txt"
hooked=$(awk '/^totals:/ {print $2}' "$dir/cg.out")
hc=$(( (hooked - bare) / $(cat "$dir/prof.txt") ))
echo "hook: $hc instructions per event"
lua5.1 "$here/driver.lua" "$dir/lib.lua" "$dir/calls.bin" count 2>/dev/null | awk '/^COUNT/ {print $2}' | sort -n |
while read -r line; do
  name=$(sed -n "${line}p" "$dir/lib.lua" | sed -E 's/^ *(local )?(function )?([A-Za-z_.]+).*/\3/')
  echo "$line $name $(run "$line")"
done | awk '{printf "%-6s %-22s %7d calls %12d instructions %8d per call\n", $1, $2, $3, $4, $3 ? $4 / $3 : 0}' | sort -k5 -n -r

/* lprof: callgrind collects while one Lua function of the library runs, for
   profiling the library per function (docs/performance.md; profile.sh).
   Profiling only, never part of the sidecar.

   lprof.start(source, line, inclusive, skip) sets a call/return hook: from
   then on callgrind collects while the function of the chunk `source`
   defined at `line` is the innermost Lua frame (C functions it calls count
   as its own), or with inclusive anywhere on the stack, and never while the
   function defined at line `skip` of another chunk (the driver's redis.call
   emulator) runs. Each hook call turns collection off first and on again
   last, so what it counts of itself is the few instructions around the
   toggles: ~95 per call or return event while collecting (driver.lua's
   calibration), which lprof.stop() returns the count of (with the target's
   calls) for the caller to subtract. */
#include <string.h>
#include <valgrind/callgrind.h>
#include "lua.h"
#include "lauxlib.h"

static int target = -1, inclusive = 0, on = 0, skipline = -2;
static char libsrc[256];
static long ncalls = 0, onev = 0;

/* want: whether to collect with the stack as it is from level `from`. */
static int want(lua_State *L, int from) {
  lua_Debug ar;
  int lvl = from;
  while (lua_getstack(L, lvl++, &ar)) {
    lua_getinfo(L, "S", &ar);
    if (ar.what[0] == 'C') continue;
    int mine = strcmp(ar.source, libsrc) == 0;
    if (!mine && ar.linedefined == skipline) return 0;
    if (mine && ar.linedefined == target) return 1;
    if (!inclusive && ar.what[0] != 'm') return 0;
  }
  return 0;
}

static void hook(lua_State *L, lua_Debug *ar) {
  int w;
  if (on) { CALLGRIND_TOGGLE_COLLECT; onev++; }
  if (ar->event == LUA_HOOKCALL) {
    w = want(L, 0); /* the called function is level 0 */
    lua_Debug a;
    if (w && lua_getstack(L, 0, &a) && lua_getinfo(L, "S", &a) && a.what[0] != 'C' &&
        a.linedefined == target && strcmp(a.source, libsrc) == 0) ncalls++;
  } else {
    w = want(L, 1); /* the returning function is still level 0 */
  }
  if (w) { CALLGRIND_TOGGLE_COLLECT; }
  on = w;
}

static int l_start(lua_State *L) {
  strncpy(libsrc, luaL_checkstring(L, 1), sizeof libsrc - 1);
  target = luaL_checkint(L, 2);
  inclusive = lua_toboolean(L, 3);
  skipline = luaL_optint(L, 4, -2);
  ncalls = 0; on = 0; onev = 0;
  lua_sethook(L, hook, LUA_MASKCALL | LUA_MASKRET, 0);
  return 0;
}

static int l_stop(lua_State *L) {
  lua_sethook(L, NULL, 0, 0);
  if (on) { CALLGRIND_TOGGLE_COLLECT; on = 0; }
  lua_pushnumber(L, ncalls);
  lua_pushnumber(L, onev);
  return 2;
}

/* toggle: collection on or off by hand (the calibration). */
static int l_toggle(lua_State *L) { (void)L; CALLGRIND_TOGGLE_COLLECT; return 0; }

static const struct luaL_reg lib[] = {{"start", l_start}, {"stop", l_stop}, {"toggle", l_toggle}, {NULL, NULL}};

int luaopen_lprof(lua_State *L) { luaL_register(L, "lprof", lib); return 1; }

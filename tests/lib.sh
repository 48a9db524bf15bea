# The common start of the tests/cli_*.sh scripts, sourced by each right after its `set` line:
#   . "$(dirname "$0")/lib.sh"
# It sets
#   MOH  the moh binary under test, absolute: the script's first argument (CTest passes the build's
#        moh, so `make test` runs build/moh and `make asan` build-asan/moh), default build/moh
#   T    a fresh temporary folder, removed at exit after the script's own `cleanup` function (if
#        it defines one) has run
# and the helpers of the checks:
#   ok / bad MESSAGE         count a passed / failed check; bad prints "FAIL: MESSAGE"
#   check 'COMMAND' MESSAGE  eval COMMAND: ok when it succeeds, else bad MESSAGE
#   finish                   print "cli_NAME: P passed, F failed"; its status (0: none failed) ends the script
#   fail MESSAGE             print "FAIL: MESSAGE" and exit 1 (scripts that stop at their first failure)
#   same_tensors A B         true when two safetensors files hold the same tensors (names, dtypes,
#                            shapes, bytes), whatever their __metadata__ (a training save's records
#                            its step)
#   verses N                 print N lines of deterministic text ("verse I: and the people went unto
#                            the city of J."), the corpus of the LM tests (no data packages needed)
#   one_line_error CODE PATTERN COMMAND...
#                            run COMMAND (stdout dropped); true when it exits with CODE ("any": any
#                            non-zero) and writes exactly one stderr line, matching the grep PATTERN;
#                            else false with the reason in $why
MOH=${1:-build/moh}
[ -x "$MOH" ] || { echo "FAIL: no moh binary at $MOH (give its path as the first argument)"; exit 1; }
MOH=$(readlink -f -- "$MOH")
T=$(mktemp -d "${TMPDIR:-/tmp}/moh_$(basename "$0" .sh).XXXXXX")
# --precision auto's measurements: per test script, so no run of the user's cache decides a test's
# precision and the runs of one script choose alike
export MOH_CACHE_DIR="$T/cache"
moh_test_exit() {
  if declare -F cleanup >/dev/null; then cleanup; fi
  rm -rf "$T"
}
trap moh_test_exit EXIT

passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
finish() {
  echo "$(basename "$0" .sh): $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}
fail() { echo "FAIL: $*"; exit 1; }
verses() {
  awk -v n="$1" 'BEGIN { for (i = 1; i <= n; i++) printf "verse %d: and the %s went unto the %s of %d.\n", i, (i % 7 ? "people" : "king"), (i % 5 ? "city" : "river"), (i * 7919) % 1000 }'
}

same_tensors() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); h.pop('__metadata__', None)
    return {k: (v['dtype'], v['shape'], b[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]]) for k, v in h.items()}
sys.exit(load(sys.argv[1]) != load(sys.argv[2]))
PY
}

one_line_error() {
  local code=$1 pat=$2 rc msg; shift 2
  "$@" > /dev/null 2> "$T/one_line_error.txt"; rc=$?
  msg=$(cat "$T/one_line_error.txt")
  if { [ "$code" = any ] && [ $rc -eq 0 ]; } || { [ "$code" != any ] && [ $rc -ne "$code" ]; }; then
    why="exit $rc, want ${code/any/an error}: $*: $msg"
  elif [ "$(wc -l < "$T/one_line_error.txt")" -ne 1 ]; then
    why="not one line: $*: $msg"
  elif ! grep -q -- "$pat" "$T/one_line_error.txt"; then
    why="message '$msg' lacks '$pat': $*"
  else
    return 0
  fi
  return 1
}

# band_idx DIR NTRAIN NTEST [gz]: MNIST-style IDX files of 28x28 images (random.Random(5)) where
# class k is a bright horizontal band at row 1 + 2.6 k; gz: the training images and the test labels
# gzip-compressed (both forms read back)
band_idx() {
  python3 - "$@" <<'PY'
import gzip, os, random, struct, sys
d, ntrain, ntest = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]); gz = sys.argv[4:] == ['gz']
os.makedirs(d)
rnd = random.Random(5)
def split(n):
    imgs, labs = bytearray(), bytearray()
    for i in range(n):
        k = rnd.randrange(10); labs.append(k)
        px = bytearray(rnd.randrange(40) for _ in range(784))
        y0 = 1 + (k * 26) // 10
        for y in range(y0, y0 + 3):
            for x in range(2, 26): px[y * 28 + x] = 200 + rnd.randrange(56)
        imgs += px
    return struct.pack('>IIII', 0x803, n, 28, 28) + imgs, struct.pack('>II', 0x801, n) + labs
def put(name, data, z):
    open(f'{d}/{name}' + ('.gz' if z else ''), 'wb').write(gzip.compress(data) if z else data)
ti, tl = split(ntrain); vi, vl = split(ntest)
put('train-images-idx3-ubyte', ti, gz); put('train-labels-idx1-ubyte', tl, False)
put('t10k-images-idx3-ubyte', vi, False); put('t10k-labels-idx1-ubyte', vl, gz)
PY
}

# column_idx DIR NTRAIN NTEST SEED [BG]: IDX files of 8x8 images where class k (0..3) is a bright
# column at x = 2 k on noise of brightness BG k (default 0) + 0..29 (random.Random(SEED))
column_idx() {
  python3 - "$@" <<'PY'
import os, random, struct, sys
d, ntrain, ntest, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
bg = int(sys.argv[5]) if len(sys.argv) > 5 else 0
os.makedirs(d)
rnd = random.Random(seed)
def split(n):
    imgs, labs = bytearray(), bytearray()
    for i in range(n):
        k = rnd.randrange(4); labs.append(k)
        px = bytearray(bg * k + rnd.randrange(30) for _ in range(64))
        for y in range(8): px[y * 8 + 2 * k] = 220 + rnd.randrange(36)
        imgs += px
    return struct.pack('>IIII', 0x803, n, 8, 8) + imgs, struct.pack('>II', 0x801, n) + labs
for name, n in (('train', ntrain), ('t10k', ntest)):
    i, l = split(n)
    open(f'{d}/{name}-images-idx3-ubyte', 'wb').write(i)
    open(f'{d}/{name}-labels-idx1-ubyte', 'wb').write(l)
PY
}
